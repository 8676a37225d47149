"""BERT and RoBERTa encoders, converted by ggufsmith, give in llama.cpp (llama-cpp-python, embedding=True, the
pooling from the file) the embeddings transformers' model gives, pooled as sentence-transformers
pools them; the files equal llama.cpp's convert_hf_to_gguf.py's.

Models (tests/bert_models.py): 3 layers, hidden 64, every weight redrawn large (norms, biases,
token-type and position embeddings included), in sentence-transformers folders:
  - "mean": BertModel, uncased WordPiece tokenizer, mean pooling;
  - "cls": BertForMaskedLM (names under "bert.", a prediction head to leave out), cased tokenizer,
    CLS-token pooling;
  - "roberta": RobertaModel (positions numbered from pad_token_id + 1, one token type), byte-level
    BPE tokenizer with RoBERTa's `<s> A </s>`, mean pooling;
  - "xlmr": XLMRobertaModel (RoBERTa's positions), a SentencePiece Unigram tokenizer (nmt_nfkc) saved
    by XLMRobertaTokenizer as tokenizer.json, exported as llama.cpp's t5 (UGM), CLS pooling
    (measured f32 7e-4..8.5e-4, f16 1.7e-3..2.1e-3, q8_0 3.3e-2..4.2e-2 of the std);
  - "distilbert": DistilBertModel (its own names, no token types, epsilon fixed at 1e-12), uncased
    WordPiece, mean pooling; "distilbert_mlm": DistilBertForMaskedLM (under "distilbert.", its
    vocab_* head left out), cased, CLS pooling (measured f32 3.9e-4..1.2e-3, 1.5e-6..2.3e-4 against
    ggml's GELU; f16 1.1e-3..3.1e-3; q8_0 3e-2..6.6e-2 of the std);
  - "camembert": CamembertModel (RoBERTa's positions) with CamembertTokenizer's Unigram tokenizer.json
    (fairseq's <s>NOTUSED ... ids), mean pooling (measured f32 5.3e-4..8.3e-4, 1e-5..3.7e-5 against
    ggml's GELU; f16 1.1e-3..1.5e-3; q8_0 3.2e-2..4.6e-2). llama.cpp's converter gets CamemBERT wrong
    (see test_camembert_against_convert_hf_to_gguf).
Tolerances (max |llama.cpp - transformers| / std of the reference vector, and cosine similarity):
  - f32: 2e-3 and 0.99999; measured 4e-4..1.1e-3 (1 - cosine <= 1e-7). ggml evaluates GELU through
    a float16 table (inputs and outputs rounded to 11 bits), which bounds the agreement near 1e-3:
    against transformers with the tanh form of GELU the error is the same, so the erf/tanh
    difference is not what limits it. With ggml's table patched into transformers
    (tests/ggml_activations.py) the issue's 1e-3 holds: measured 8e-7..4e-4 (1 - cosine <= 1.2e-8).
    The tensors are bit-identical to llama.cpp's converter's.
  - f16: 6e-3 and 0.99999; measured 1.2e-3..3e-3 (1 - cosine <= 5e-7): weights rounded to 11 bits.
  - q8_0: 0.15 and 0.999; measured 3e-2..7.5e-2 (1 - cosine <= 4e-4): 8-bit weights through three
    post-norm layers whose weights are redrawn large; a single CLS vector moves more than a mean.
Leaving the token-type row out, shifting the position embeddings by one row or writing the other
pooling mode makes these tests fail (checked by hand); so do CamemBERT's positions without the
RoBERTa offset and DistilBERT's two block norms swapped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import PoolingType
from tests.ggml_activations import use_ggml_gelu
from tests.bert_models import (
    SENTENCES, assert_pooled_match, assert_token_states_match, assert_tokenizes_as_transformers, build_bert,
    encoder_states, train_roberta_bpe, train_wordpiece, train_xlmr_unigram, write_sentence_transformers_modules,
)
from tests.family_models import conversions
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

MODELS = {
    "mean": dict(lowercase=True, masked_lm=False, pooling="mean"),
    "cls": dict(lowercase=False, masked_lm=True, pooling="cls"),
    "roberta": dict(roberta=True, pooling="mean"),
    "xlmr": dict(xlmr=True, pooling="cls"),
    "distilbert": dict(lowercase=True, distilbert=True, pooling="mean"),
    "distilbert_mlm": dict(lowercase=False, distilbert=True, masked_lm=True, pooling="cls"),
    "camembert": dict(camembert=True, pooling="mean"),
}
# The tokenizer.ggml.pre the reference is told (it names tokenizers by hashing their ids for a test
# text, and knows only published ones): ours. llama.cpp reads none for WPM; "gpt-2" is RoBERTa's regex.
REFERENCE_PRE = {"mean": "default", "cls": "default", "roberta": "gpt-2", "xlmr": "default", "distilbert": "default",
                 "distilbert_mlm": "default", "camembert": "default"}
FAMILY_FLAGS = ("masked_lm", "roberta", "xlmr", "camembert", "distilbert")
OUTTYPES = ("f32", "f16", "q8_0")
# Per-token f32 states: the max over every component of every token (measured 1.2e-3..2.1e-3).
TOKEN_TOLERANCE = 3e-3
TOLERANCE = {"f32": (2e-3, 0.99999), "f16": (6e-3, 0.99999), "q8_0": (0.15, 0.999)}  # (max err / std, cosine)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bert")
    dirs = {}
    for kind, spec in MODELS.items():
        model_dir = root / kind
        if spec.get("roberta"):
            train_roberta_bpe(model_dir)
        elif spec.get("xlmr") or spec.get("camembert"):
            train_xlmr_unigram(model_dir, tokenizer_class="CamembertTokenizer" if spec.get("camembert") else
                               "XLMRobertaTokenizer", keep_model_file=spec.get("camembert", False))
        else:
            train_wordpiece(model_dir, lowercase=spec["lowercase"])
        build_bert(model_dir, **{flag: spec.get(flag, False) for flag in FAMILY_FLAGS})
        write_sentence_transformers_modules(model_dir, spec["pooling"], hidden_size=64)
        dirs[kind] = model_dir
    return dirs


@pytest.fixture(scope="session")
def reference(model_dirs) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """kind -> per sentence: transformers' token ids and the encoder's last hidden state."""
    return {kind: encoder_states(model_dir) for kind, model_dir in model_dirs.items()}


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    return conversions({kind: (folder,) for kind, folder in model_dirs.items()}, tmp_path_factory.mktemp("bert_gguf"))


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("kind", MODELS)
def test_pooled_embeddings_match_transformers(converted, reference, kind, outtype):
    """The pooling comes from the file (mean, or the CLS token for the "cls" model)."""
    assert_pooled_match(converted(kind, outtype), reference[kind], MODELS[kind]["pooling"], *TOLERANCE[outtype],
                        f"{kind} {outtype}")


def _ggml_gelu_patch(kind: str):
    """use_ggml_gelu on the model's MLP blocks (DistilBERT's FFN keeps its GELU as `activation`),
    asserting one per layer."""
    attribute = "activation" if MODELS[kind].get("distilbert") else "intermediate_act_fn"

    def patch(model):
        assert use_ggml_gelu(model, attribute) == 3
    return patch


@pytest.fixture(scope="session")
def reference_with_ggml_gelu(model_dirs) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """kind -> per sentence: token ids and the last hidden state of transformers' model with ggml's
    float16-table GELU patched in (tests/ggml_activations.py): the reference without llama.cpp's
    activation rounding."""
    return {kind: encoder_states(model_dir, patch=_ggml_gelu_patch(kind)) for kind, model_dir in model_dirs.items()}


@pytest.mark.parametrize("kind", MODELS)
def test_f32_embeddings_are_exact_up_to_ggml_gelu(converted, reference_with_ggml_gelu, kind):
    """The issue's f32 bound (1e-3 of the std, cosine 0.99999) holds against transformers with ggml's
    GELU rounding patched in: the 2e-3 of the plain comparison above is llama.cpp's activation
    table, not the conversion."""
    assert_pooled_match(converted(kind, "f32"), reference_with_ggml_gelu[kind], MODELS[kind]["pooling"], 1e-3,
                        0.99999, f"{kind} f32 vs ggml-GELU reference")


@pytest.mark.parametrize("kind", MODELS)
def test_token_embeddings_match_transformers(converted, reference, kind):
    """Every token's last hidden state (pooling turned off), in f32: the positions and token types
    of each token, not only their average."""
    assert_token_states_match(converted(kind, "f32"), reference[kind], TOKEN_TOLERANCE, f"{kind} f32")


@pytest.mark.parametrize("kind", MODELS)
def test_llama_cpp_tokenizes_as_transformers(converted, reference, kind):
    assert_tokenizes_as_transformers(converted(kind, "f32"), reference[kind])


@pytest.mark.parametrize("kind", MODELS)
def test_pooling_type_from_the_sentence_transformers_folder(converted, kind):
    keys, tensors = gguf_contents(converted(kind, "f32"))
    expected = PoolingType.CLS if MODELS[kind]["pooling"] == "cls" else PoolingType.MEAN
    assert keys["bert.pooling_type"] == int(expected)
    assert keys["bert.attention.causal"] is False
    assert not any(name.startswith(("cls", "pooler")) for name in tensors)


# -- against llama.cpp's own converter ------------------------------------------------------------

# Keys only ours have, and why (every other key, value and tensor byte is the same).
BERT_KEY_DIFFERENCES = {
    "tokenizer.ggml.cls_token_id": "the spec's key, written when the tokenizer names a CLS token; "
                                   "llama.cpp reads bos_token_id (the same [CLS]) instead",
    "tokenizer.ggml.fim_pad_token_id": "written explicitly; llama.cpp finds the same id by the text [PAD] at load time",
}


# XLM-RoBERTa's Unigram tokenizer (from tokenizer.json), beyond those.
XLMR_KEY_DIFFERENCES = {
    **BERT_KEY_DIFFERENCES,
    "tokenizer.ggml.remove_extra_whitespaces": "ours true: transformers' XLMRobertaTokenizer splits on whitespace "
                                               "(runs of spaces, leading and trailing ones vanish), as llama.cpp "
                                               "does with it; the reference copies clean_up_tokenization_spaces, a "
                                               "decoding option (false), and llama.cpp then keeps those spaces",
}


@pytest.mark.parametrize("kind", [kind for kind in MODELS if kind != "camembert"])
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, tmp_path_factory, kind):
    references = reference_conversions(model_dirs[kind], tmp_path_factory.mktemp(f"bert_ref_{kind}"), OUTTYPES,
                                       pre=REFERENCE_PRE[kind])
    differences = XLMR_KEY_DIFFERENCES if kind == "xlmr" else BERT_KEY_DIFFERENCES
    for outtype in OUTTYPES:
        assert_same_file(converted(kind, outtype), references[outtype], differences)


def test_camembert_against_convert_hf_to_gguf(model_dirs, converted, reference, tmp_path_factory):
    """llama.cpp's converter registers CamembertModel with BERT's converter: it writes the
    SentencePiece pieces as a WordPiece vocabulary (llama.cpp's `bert` tokenizer, a "▁" put before
    each piece) and keeps every position row, where CamemBERT (RoBERTa) numbers positions from
    pad_token_id + 1. Its file tokenizes otherwise than transformers and shifts every position by two;
    ours has XLM-R's Unigram tokenizer and the rows from pad_token_id + 1 on. Every other tensor is
    byte-identical, every other model key the same."""
    theirs = reference_conversions(model_dirs["camembert"], tmp_path_factory.mktemp("bert_ref_camembert"), ("f32",),
                                   pre="default")["f32"]
    ours_k, ours_t = gguf_contents(converted("camembert", "f32"))
    theirs_k, theirs_t = gguf_contents(theirs)
    assert (ours_k["tokenizer.ggml.model"], theirs_k["tokenizer.ggml.model"]) == ("t5", "bert")
    assert (ours_k["bert.context_length"], theirs_k["bert.context_length"]) == (96, 98)
    for key in set(ours_k) & set(theirs_k):
        if not key.startswith(("tokenizer.", "bert.context_length")):
            assert ours_k[key] == pytest.approx(theirs_k[key]) if isinstance(ours_k[key], float) else \
                ours_k[key] == theirs_k[key], key
    assert list(ours_t) == list(theirs_t)
    for name, (shape, ttype, data) in ours_t.items():
        if name == "position_embd.weight":  # ours: their rows from pad_token_id + 1 = 2 on
            n_embd, n_ctx = shape  # ggml's order; f32 rows of n_embd * 4 bytes
            assert theirs_t[name][0] == (n_embd, n_ctx + 2) and data == theirs_t[name][2][2 * n_embd * 4:], name
        else:
            assert (shape, ttype, data) == theirs_t[name], name
    llm = llama_cpp.Llama(model_path=str(theirs), vocab_only=True, verbose=False)
    try:  # their tokenizer is not transformers' (ours is: test_llama_cpp_tokenizes_as_transformers)
        assert all(llm.tokenize(text.encode(), add_bos=True, special=False) != ids
                   for text, (ids, _) in zip(SENTENCES, reference["camembert"]))
    finally:
        llm.close()


def test_camembert_from_sentencepiece_model_alone(model_dirs, tmp_path):
    """Without tokenizer.json, CamemBERT's ids come from sentencepiece.bpe.model as CamembertTokenizer
    gives them (<s>NOTUSED <pad> </s>NOTUSED <unk>, the model's pieces four ids up, <mask> last), not
    as XLM-RoBERTa's fairseq layout (one id up): llama.cpp then tokenizes as transformers does."""
    import ggufsmith

    folder = tmp_path / "camembert-spm"
    shutil.copytree(model_dirs["camembert"], folder, ignore=shutil.ignore_patterns("tokenizer.json"))
    ggufsmith.convert(folder, tmp_path / "camembert-spm.gguf", outtype="f32")
    keys, _ = gguf_contents(tmp_path / "camembert-spm.gguf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # (the rows past the tokenizer, up to the model's vocab_size, are padding)
    assert keys["tokenizer.ggml.tokens"][:len(tokenizer)] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert (keys["tokenizer.ggml.bos_token_id"], keys["tokenizer.ggml.eos_token_id"]) == (5, 6)
    assert_tokenizes_as_transformers(tmp_path / "camembert-spm.gguf",
                                     [(tokenizer(text)["input_ids"], None) for text in SENTENCES])
