"""Nomic BERT encoders, converted by ggufsmith, give in llama.cpp (llama-cpp-python, embedding=True, the
pooling from the file) the embeddings of the reference model, pooled as sentence-transformers pools
them; the files equal llama.cpp's convert_hf_to_gguf.py's.

Models (tests/nomic_models.py), hidden 64, 4 heads, every weight redrawn large, in
sentence-transformers folders (mean pooling, CLS for "moe"):
  - "hf": transformers' NomicBertModel (3 layers, SwiGLU, rope theta 1000) as transformers saves it,
    uncased WordPiece tokenizer; reference: transformers;
  - "nomic": the same weights with the config.json of nomic's remote code (n_embd, rotary_emb_base,
    activation_function ..., as nomic-embed-text-v1.5 ships it), which llama.cpp's converter reads;
  - "moe": the v2-moe shape (4 layers, MoE in layers 1 and 3: 4 experts, top 2; GELU MLPs and
    attention with biases), XLM-R Unigram tokenizer, CLS pooling; reference: transformers'
    NomicBertModel with nomic's v2-moe modules swapped in (no transformers class has them).
Tolerances (max |llama.cpp - reference| / std of the reference vector, and cosine similarity):
  - f32: 1e-3 and 0.99999 for the dense models, measured 6e-7..1.2e-6 (1 - cosine <= 1e-13; per
    token <= 2.7e-6): ggml computes SiLU in f32. The MoE model: 2e-3, measured 7.9e-4..1.5e-3
    (1 - cosine <= 1e-7; per token 1.4e-3..1.8e-3), as for bert: ggml computes GELU through a
    float16 table: with ggml's table patched into the reference (tests/ggml_activations.py) the
    issue's 1e-3 holds, measured 1.4e-5..2.2e-4 (1 - cosine <= 2.4e-9).
  - f16: measured 2.3e-3..3.8e-3 (1 - cosine <= 9e-7); q8_0: 4e-2..8.8e-2 (1 - cosine <= 3.7e-4).
    Bounds as for bert: f16 6e-3 and 0.99999, q8_0 0.15 and 0.999 (weights rounded to 11 / 8 bits,
    through post-norm layers whose weights are redrawn large).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import PoolingType
from tests.bert_models import (
    SENTENCES, assert_token_states_match, assert_tokenizes_as_transformers, llama_embeddings, pooled, train_wordpiece, train_xlmr_unigram, write_sentence_transformers_modules,
)
from tests.ggml_activations import ggml_gelu
from tests.family_models import conversions
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.nomic_models import (  # noqa: E402 (needs torch)
    build_nomic_dense, build_nomic_moe, copy_with_transformers_keys, use_ggml_gelu_in_moe,
)

pytestmark = pytest.mark.slow

POOLING = {"hf": "mean", "nomic": "mean", "moe": "cls"}
ARCH = {"hf": "nomic-bert", "nomic": "nomic-bert", "moe": "nomic-bert-moe"}
OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {"f32": (1e-3, 0.99999), "f16": (6e-3, 0.99999), "q8_0": (0.15, 0.999)}  # (max err / std, cosine)
GELU_F32_TOLERANCE = (2e-3, 0.99999)  # the MoE model's f32: ggml's GELU goes through a float16 table
TOKEN_TOLERANCE = 3e-3  # every component of every token's f32 state


@pytest.fixture(scope="session")
def nomic_models(tmp_path_factory) -> tuple[dict[str, Path], dict[str, torch.nn.Module]]:
    """kind -> folder, and kind -> the reference model."""
    root = tmp_path_factory.mktemp("nomic")
    train_wordpiece(root / "hf", lowercase=True)
    write_sentence_transformers_modules(root / "hf", "mean", hidden_size=64)
    dense = build_nomic_dense(root / "hf", root / "nomic")
    train_xlmr_unigram(root / "moe")
    write_sentence_transformers_modules(root / "moe", "cls", hidden_size=64)
    moe = build_nomic_moe(root / "moe")
    return {kind: root / kind for kind in POOLING}, {"hf": dense, "nomic": dense, "moe": moe}


@pytest.fixture(scope="session")
def nomic_reference(nomic_models) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """kind -> per sentence: the HF tokenizer's ids and the reference's last hidden state."""
    dirs, models = nomic_models
    out = {}
    for kind, model_dir in dirs.items():
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        rows = []
        for text in SENTENCES:
            ids = tokenizer(text)["input_ids"]
            with torch.no_grad():
                rows.append((ids, models[kind](torch.tensor([ids])).last_hidden_state[0].double().numpy()))
        out[kind] = rows
    return out


def test_transformers_reads_the_saved_dense_model_back(nomic_models, nomic_reference):
    """The "hf" folder is what transformers loads (its renaming of nomic's tensor names on loading
    and saving), so the reference is the checkpoint's model."""
    dirs, _ = nomic_models
    model = transformers.AutoModel.from_pretrained(dirs["hf"]).eval()
    for ids, hidden in nomic_reference["hf"]:
        with torch.no_grad():
            again = model(torch.tensor([ids])).last_hidden_state[0].double().numpy()
        assert np.array_equal(again, hidden)


@pytest.fixture(scope="session")
def nomic_converted(nomic_models, tmp_path_factory):
    dirs, _ = nomic_models
    return conversions({kind: (folder,) for kind, folder in dirs.items()}, tmp_path_factory.mktemp("nomic_gguf"))


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("kind", POOLING)
def test_pooled_embeddings_match_the_reference(nomic_converted, nomic_reference, kind, outtype):
    max_error, min_cosine = GELU_F32_TOLERANCE if (kind, outtype) == ("moe", "f32") else TOLERANCE[outtype]
    path = nomic_converted(kind, outtype)
    for text, got, (_, hidden) in zip(SENTENCES, llama_embeddings(path, SENTENCES), nomic_reference[kind]):
        expected = pooled(hidden, POOLING[kind])
        error = np.abs(got - expected).max() / expected.std()
        cosine = float(got @ expected / np.linalg.norm(got))
        print(f"{kind} {outtype}: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}  ({text[:20]!r})")
        assert error <= max_error and cosine >= min_cosine, (text, error, cosine)


def test_moe_f32_embeddings_are_exact_up_to_ggml_gelu(nomic_models, nomic_reference, nomic_converted):
    """The issue's f32 bound (1e-3 of the std, cosine 0.99999) holds for the MoE model against the
    reference with ggml's float16-table GELU (tests/ggml_activations.py) in its MLPs and experts:
    the 2e-3 above is llama.cpp's activation table, not the conversion."""
    dirs, models = nomic_models
    model = models["moe"]
    assert use_ggml_gelu_in_moe(model, ggml_gelu) == 4  # one MLP or expert set per layer
    try:
        hidden_states = []
        for ids, _ in nomic_reference["moe"]:
            with torch.no_grad():
                hidden_states.append(model(torch.tensor([ids])).last_hidden_state[0].double().numpy())
    finally:
        use_ggml_gelu_in_moe(model, torch.nn.functional.gelu)
    for text, got, hidden in zip(SENTENCES, llama_embeddings(nomic_converted("moe", "f32"), SENTENCES), hidden_states):
        expected = pooled(hidden, POOLING["moe"])
        error = np.abs(got - expected).max() / expected.std()
        cosine = float(got @ expected / np.linalg.norm(got))
        print(f"moe f32 vs ggml-GELU reference: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}")
        assert error <= 1e-3 and cosine >= 0.99999, (text, error, cosine)


@pytest.mark.parametrize("kind", POOLING)
def test_token_embeddings_match_the_reference(nomic_converted, nomic_reference, kind):
    """Every token's last hidden state (pooling off), in f32: the rope positions of each token."""
    assert_token_states_match(nomic_converted(kind, "f32"), nomic_reference[kind], TOKEN_TOLERANCE, f"{kind} f32")


@pytest.mark.parametrize("kind", POOLING)
def test_llama_cpp_tokenizes_as_transformers(nomic_converted, nomic_reference, kind):
    assert_tokenizes_as_transformers(nomic_converted(kind, "f32"), nomic_reference[kind])


@pytest.mark.parametrize("kind", POOLING)
def test_architecture_and_pooling_from_the_folder(nomic_converted, kind):
    keys, _ = gguf_contents(nomic_converted(kind, "f32"))
    arch = ARCH[kind]
    assert keys["general.architecture"] == arch
    assert keys[f"{arch}.pooling_type"] == int(PoolingType.CLS if POOLING[kind] == "cls" else PoolingType.MEAN)
    assert keys[f"{arch}.rope.freq_base"] == 1000.0


def test_both_config_layouts_give_the_same_file(nomic_converted):
    """transformers' config.json and nomic's describe the same model: the same keys (bar the name
    taken from the folder) and tensors."""
    (hf_keys, hf_tensors), (nomic_keys, nomic_tensors) = (gguf_contents(nomic_converted(k, "f32")) for k in ("hf", "nomic"))
    assert hf_tensors == nomic_tensors
    assert {k: v for k, v in hf_keys.items() if k != "general.name"} == \
        {k: v for k, v in nomic_keys.items() if k != "general.name"}


# -- against llama.cpp's own converter --------------------------------------------------------------
# It reads nomic's config.json, not transformers' (it needs n_positions ...), and is given a copy
# with transformers' size keys too (see copy_with_transformers_keys); ours is of the folder as is.

# Keys only ours have, and why (every other key, value and tensor byte is the same).
KEY_DIFFERENCES = {
    "tokenizer.ggml.cls_token_id": "the spec's key, written when the tokenizer names a CLS token; "
                                   "llama.cpp reads bos_token_id (the same token) instead",
    "tokenizer.ggml.fim_pad_token_id": "written explicitly; llama.cpp finds the same id by the text [PAD] at load time",
}
MOE_KEY_DIFFERENCES = {
    **KEY_DIFFERENCES,
    "tokenizer.ggml.remove_extra_whitespaces": "as for XLM-RoBERTa in test_arch_bert.py: ours true, as transformers' "
                                               "XLMRobertaTokenizer splits on whitespace",
    "nomic-bert-moe.context_length": "ours 512, the length v2-moe was trained on, which llama.cpp's converter means "
                                     "to write too; but (through transformers 5's AutoConfig) it finds "
                                     "NomicBertConfig's default max_position_embeddings 2048 first and takes "
                                     "XLM-R's position offset (pad_token_id + 1) off it: 2046, past what the "
                                     "model was trained for",
}


@pytest.mark.parametrize("kind", ["nomic", "moe"])
def test_same_file_as_convert_hf_to_gguf(nomic_models, nomic_converted, tmp_path_factory, kind):
    dirs, _ = nomic_models
    copy = copy_with_transformers_keys(dirs[kind], tmp_path_factory.mktemp(f"nomic_ref_{kind}") / kind)
    references = reference_conversions(copy, copy.parent / "gguf", OUTTYPES, pre="default")
    for outtype in OUTTYPES:
        assert_same_file(nomic_converted(kind, outtype), references[outtype],
                         MOE_KEY_DIFFERENCES if kind == "moe" else KEY_DIFFERENCES)
