"""Rerankers and classifiers (`*ForSequenceClassification`) converted by ggufsmith score in llama.cpp
(llama-cpp-python, embedding=True, the rank pooling the file names) as transformers' model does;
the files equal llama.cpp's convert_hf_to_gguf.py's but for the differences listed below.

Models (tests/bert_models.py: 3 layers, hidden 64, every weight redrawn large):
  - "bert": BertForSequenceClassification with one label (a cross-encoder such as
    ms-marco-MiniLM), uncased WordPiece; its head is BERT's pooler (dense + tanh) and `classifier`;
  - "xlmr": XLMRobertaForSequenceClassification with one label (bge-reranker-v2-m3), Unigram;
  - "roberta": RobertaForSequenceClassification with three named labels (a sentiment classifier),
    byte-level BPE; its head is `classifier.dense` + tanh and `classifier.out_proj`.
A pair is given to llama.cpp as llama-server's /rerank builds it (format_prompt_rerank, mirrored in
`rerank_ids`): BOS if the vocabulary adds one, the query, EOS if it adds one, SEP if it adds one,
the document, EOS if it adds one. With the tokenizer keys of these files that is exactly
transformers' pair encoding (`[CLS] q [SEP] d [SEP]`, `<s> q </s></s> d </s>`), checked below.
What differs: llama.cpp's BERT graph gives every token the token type 0, where transformers gives
the document type 1 (BERT checkpoints have two types; RoBERTa and XLM-R have one, so for them
nothing differs). So llama.cpp's score of a BERT pair is transformers' score with token_type_ids all
0, which is what is compared here; against transformers' own pair encoding the "bert" model's scores
are far away (measured: up to several times the score, the type embeddings being drawn as large as the
token embeddings here; a real cross-encoder differs by what its two type rows differ).
Tolerances: max |llama.cpp - transformers| over pairs and labels, over the root mean square of
transformers' logits (about 0.2-0.65 here): f32 6e-3 (measured 6e-4..2.8e-3, 4e-4..1e-3 in logit
units: ggml's float16 GELU table, as for the embeddings, then a tanh head), f16 1e-2 (2.2e-3..5.2e-3),
q8_0 0.25 (3.8e-2..1.5e-1, 2.5e-2 in logit units: 8-bit weights through three large post-norm
layers and the head's two layers, which quantize too).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import PoolingType
from tests.bert_models import build_bert, train_roberta_bpe, train_wordpiece, train_xlmr_unigram
from tests.damaged_inputs import run_cli
from tests.family_models import conversions
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions
from tests.test_arch_bert import BERT_KEY_DIFFERENCES, XLMR_KEY_DIFFERENCES

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

LABELS = {"bert": ["LABEL_0"], "xlmr": ["LABEL_0"], "roberta": ["negative", "neutral", "positive"]}
OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {"f32": 6e-3, "f16": 1e-2, "q8_0": 0.25}  # max error / rms of the logits
PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "The quick brown fox jumps over the lazy dog."),
    ("Wie groß sind die Äpfel?", "Größere Äpfel schmecken süß, aber Übung macht den Meister!"),
    ("天气怎么样？", "我们今天去公园散步，天气很好。"),
    ("Где столица России?", "Привет, как дела? Москва — столица России."),
    ("email", "Hello, WORLD... it's 10:45 -- isn't it? (e-mail: someone@example.com)"),
]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rerank")
    train = {"bert": lambda d: train_wordpiece(d, lowercase=True), "xlmr": train_xlmr_unigram,
             "roberta": train_roberta_bpe}
    dirs = {}
    for kind, labels in LABELS.items():
        dirs[kind] = root / kind
        train[kind](dirs[kind])
        build_bert(dirs[kind], labels=labels, xlmr=kind == "xlmr", roberta=kind == "roberta")
    return dirs


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    return conversions({kind: (folder,) for kind, folder in model_dirs.items()}, tmp_path_factory.mktemp("rerank_gguf"))


def rerank_ids(llm, query: str, document: str) -> list[int]:
    """The tokens llama-server's /rerank gives the model for a pair (its format_prompt_rerank, for a
    file without a rerank chat template)."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eos = llama_cpp.llama_vocab_eos(vocab)
    eos = llama_cpp.llama_vocab_sep(vocab) if eos == llama_cpp.LLAMA_TOKEN_NULL else eos
    add_eos = [eos] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
    return ([llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []) \
        + llm.tokenize(query.encode(), add_bos=False, special=False) + add_eos \
        + ([llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []) \
        + llm.tokenize(document.encode(), add_bos=False, special=False) + add_eos


def llama_scores(path: Path) -> list[tuple[list[int], np.ndarray]]:
    """Per pair: the tokens and the n_cls_out scores llama.cpp's rank pooling gives (the file's pooling)."""
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=128, n_batch=128, n_ubatch=128, verbose=False)
    try:
        assert llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_RANK
        n_labels = llama_cpp.llama_model_n_cls_out(llm.model)
        out = []
        for query, document in PAIRS:
            ids = rerank_ids(llm, query, document)
            llm._ctx.kv_cache_clear()
            llm._batch.reset()
            llm._batch.add_sequence(ids, 0, True)
            llm._ctx.decode(llm._batch)
            scores = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[:n_labels]
            out.append((ids, np.asarray(scores, dtype=np.float64)))
        return out
    finally:
        llm.close()


@pytest.fixture(scope="session")
def reference(model_dirs) -> dict[str, list[tuple[dict, np.ndarray, np.ndarray]]]:
    """kind -> per pair: transformers' pair encoding, its logits, and the logits of the same ids with
    every token type 0 (what llama.cpp's graph gives)."""
    out = {}
    for kind, model_dir in model_dirs.items():
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        rows = []
        for query, document in PAIRS:
            encoding = dict(tokenizer(query, document))
            with torch.no_grad():
                pair = model(**{k: torch.tensor([v]) for k, v in encoding.items() if k != "attention_mask"})
                type_0 = model(torch.tensor([encoding["input_ids"]]), token_type_ids=torch.zeros(
                    1, len(encoding["input_ids"]), dtype=torch.long))
            rows.append((encoding, pair.logits[0].double().numpy(), type_0.logits[0].double().numpy()))
        out[kind] = rows
    return out


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("kind", LABELS)
def test_scores_match_transformers(converted, reference, kind, outtype):
    got = llama_scores(converted(kind, outtype))
    expected = np.stack([type_0 for _, _, type_0 in reference[kind]])
    scores = np.stack([scores for _, scores in got])
    assert scores.shape == (len(PAIRS), len(LABELS[kind]))
    error = np.abs(scores - expected).max() / np.sqrt((expected ** 2).mean())
    print(f"{kind} {outtype}: max error / rms {error:.1e}, max error {np.abs(scores - expected).max():.1e}")
    assert error <= TOLERANCE[outtype], (scores, expected)


@pytest.mark.parametrize("kind", LABELS)
def test_pairs_are_tokenized_as_transformers_pairs_them(converted, reference, kind):
    """llama-server's pair format gives the tokens transformers' pair encoding gives."""
    for (ids, _), (encoding, _, _) in zip(llama_scores(converted(kind, "f32")), reference[kind]):
        assert ids == encoding["input_ids"]


def test_bert_document_token_type_is_not_what_transformers_gives(reference):
    """The one difference of llama.cpp's BERT: the document's token type. transformers' own pair
    scores are measurably elsewhere (the bound of the docstring); RoBERTa's and XLM-R's are not."""
    for kind in LABELS:
        relative = max(np.abs(pair - type_0).max() / np.abs(pair).max() for _, pair, type_0 in reference[kind])
        print(f"{kind}: transformers' pair scores vs token types 0: {relative:.1e} relative")
        assert (relative > 1e-3) if kind == "bert" else (relative == 0)


@pytest.mark.parametrize("kind", LABELS)
def test_a_bert_reranker_is_converted_with_a_warning_about_token_types(model_dirs, tmp_path, kind):
    """That difference is said once when converting a BERT cross-encoder (two token types), and not
    for RoBERTa's or XLM-R's, whose scores are transformers' own."""
    proc = run_cli("convert", model_dirs[kind], tmp_path / "out.gguf", "--outtype", "f32", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "token type 0" in line]
    assert len(warned) == (1 if kind == "bert" else 0), proc.stderr


@pytest.mark.parametrize("kind", LABELS)
def test_rank_pooling_and_labels_in_the_file(converted, kind):
    keys, tensors = gguf_contents(converted(kind, "f32"))
    assert keys["bert.pooling_type"] == int(PoolingType.RANK)
    assert keys["bert.classifier.output_labels"] == LABELS[kind]
    assert tensors["cls.output.weight"][0] == (64, len(LABELS[kind]))  # gguf-py's order: columns first
    assert tensors["cls.weight"][0] == (64, 64)


# -- against llama.cpp's own converter ------------------------------------------------------------

RANK_KEY = {"bert.pooling_type": "ours rank: the file scores pairs without --pooling rank (llama-server's "
                                 "--rerank sets it anyway); the reference writes none (pooling none by default)"}
# BERT's pooler is its classification head's first layer: the reference leaves it out, so its file
# scores the CLS state without the pooler's dense layer and tanh (measured on the "bert" model:
# -0.63 where transformers gives -0.25, -0.76 for -0.18), not the model's scores.
BERT_POOLER = ("cls.weight", "cls.bias")
KEY_DIFFERENCES = {
    "bert": {**BERT_KEY_DIFFERENCES, **RANK_KEY,
             "general.size_label": "counts the pooler's parameters, which the reference leaves out"},
    "xlmr": {**XLMR_KEY_DIFFERENCES, **RANK_KEY},
    "roberta": {**BERT_KEY_DIFFERENCES, **RANK_KEY},
}


@pytest.mark.parametrize("kind", LABELS)
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, tmp_path_factory, kind):
    references = reference_conversions(model_dirs[kind], tmp_path_factory.mktemp(f"rerank_ref_{kind}"), OUTTYPES,
                                       pre="gpt-2" if kind == "roberta" else "default")
    for outtype in OUTTYPES:
        assert_same_file(converted(kind, outtype), references[outtype], KEY_DIFFERENCES[kind],
                         extra_tensors=BERT_POOLER if kind == "bert" else ())
