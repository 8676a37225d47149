"""End to end: tiny transformers llama-family checkpoints converted by ggufsmith, checked against
three independent implementations: llama.cpp running the file (logits, tokenization), transformers'
own GGUF loader (logits), and llama.cpp's convert_hf_to_gguf.py (keys, tensors, bytes).

Tolerances on logits are relative to the largest |logit| of transformers' float32 forward pass over
the prompt (logits here are around +-7). Measured on these models with llama.cpp's KV cache in F32:
f32 <= 2.3e-6, f16 <= 5.4e-3, bf16 <= 2.7e-2, q8_0 <= 8.0e-2 (weights and, in llama.cpp's CPU
matmul, activations are rounded to the type). A wrong rotary permutation, rope scaling or
expert order gives errors of the order of 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.llama_fixtures import BPE_VARIANTS, model_dirs, ours, reference, tokenizer_dirs  # noqa: F401 (fixtures)
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES
from tests.llama_models import VARIANTS, build_model, tokenizer_vocab_size, with_tokenizer
from tests.tokenizer_helpers import CHECK_TEXT

pytestmark = pytest.mark.slow

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2, "q8_0": 1.5e-1}
PROMPT = "The quick brown fox jumps over the lazy dog. Größere Äpfel, 我们今天去公园散步。 Привет мир 42!"


def prompt_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).encode(PROMPT)


def transformers_logits(model_dir: Path, ids: list[int], **load_options) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **load_options).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def llamacpp_logits(gguf_path: Path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    # An F32 KV cache: the default F16 one alone adds ~1e-3 relative error and would hide f32 mistakes.
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=128, logits_all=True, verbose=False, n_threads=2,
                          type_k=0, type_v=0)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_llamacpp_logits_match_transformers(ours, model_dirs, variant, outtype):
    model_dir = model_dirs(variant)
    ids = prompt_ids(model_dir)
    expected = transformers_logits(model_dir, ids)
    got = llamacpp_logits(ours(variant, outtype), ids)
    assert relative_error(got, expected) < TOLERANCE[outtype]


@pytest.mark.parametrize("variant", ["llama_gqa", "llama_head_dim"])
def test_llamacpp_tokenization_matches_transformers(ours, model_dirs, variant):
    import llama_cpp
    from transformers import AutoTokenizer

    model_dir = model_dirs(variant)
    # transformers' SentencePiece tokenizer splits a leading double space as "▁" "Hello" where
    # sentencepiece itself and llama.cpp give "▁▁" "Hello" (see test_tokenizer_llamacpp.py).
    text = CHECK_TEXT if variant in BPE_VARIANTS else CHECK_TEXT.lstrip()
    expected = AutoTokenizer.from_pretrained(model_dir).encode(text)
    llm = llama_cpp.Llama(model_path=str(ours(variant, "f32")), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(text.encode("utf-8"), add_bos=True, special=False) == expected
    finally:
        llm.close()


# Not mixtral: transformers' GGUF loader builds a LlamaForCausalLM for every "llama" file and
# leaves the MLP uninitialised when the file has experts. Not rope scaling: it reads llama's
# rope.scaling.* keys and the rope_freqs tensor for no architecture but gpt-oss. Not biases: it
# builds the config without attention_bias/mlp_bias and drops them. All hold for
# convert_hf_to_gguf.py's files too, which test_same_file_as_llamacpp_converter shows equal to ours.
@pytest.mark.parametrize("variant", ["llama_gqa", "llama_tied", "llama_head_dim", "mistral"])
def test_transformers_gguf_loader_gives_original_logits(ours, model_dirs, variant):
    model_dir = model_dirs(variant)
    ids = prompt_ids(model_dir)
    gguf_path = ours(variant, "f32")
    got = transformers_logits(gguf_path.parent, ids, gguf_file=gguf_path.name)
    np.testing.assert_allclose(got, transformers_logits(model_dir, ids), rtol=0, atol=1e-5)


def test_tied_model_with_a_stored_lm_head_keeps_it(tmp_path, tokenizer_dirs):
    """tie_word_embeddings with an lm_head.weight in the file that differs from the embeddings:
    transformers then does not tie and uses the stored lm_head, so the GGUF must carry it as
    `output` (llama.cpp would otherwise read token_embd). convert_hf_to_gguf.py does the same."""
    import gguf

    import ggufsmith
    from safetensors.numpy import load_file, save_file

    with_tokenizer(tmp_path, tokenizer_dirs["sp"])
    build_model(tmp_path, "llama_tied", tokenizer_vocab_size(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = -tensors["model.embed_tokens.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "ours.gguf"
    ggufsmith.convert(tmp_path, out, outtype="f32")

    assert "output.weight" in {t.name for t in gguf.GGUFReader(out).tensors}
    ids = prompt_ids(tmp_path)
    expected = transformers_logits(tmp_path, ids)
    assert relative_error(llamacpp_logits(out, ids), expected) < TOLERANCE["f32"]


# --- the same file as llama.cpp's converter ---------------------------------------------------------

def _fields(reader) -> dict[str, tuple]:
    import gguf

    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the header (version, counts), not metadata
        value = field.contents()
        kind = tuple(int(t) for t in field.types)
        if kind[0] == gguf.GGUFValueType.FLOAT32:
            value = np.float32(value)
        fields[name] = (kind, value)
    return fields


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", ["llama_gqa", "llama_rope_llama3", "mixtral", "llama_tied"])
def test_same_file_as_llamacpp_converter(ours, reference, variant, outtype):
    assert_same_file(ours(variant, outtype), reference(variant, outtype))


def assert_same_file(our_path: Path, their_path: Path) -> None:
    """Keys and values, tensor names, shapes, types and bytes equal, but for TOKENIZER_KEY_DIFFERENCES."""
    import gguf

    our_reader, their_reader = gguf.GGUFReader(our_path), gguf.GGUFReader(their_path)

    our_fields, their_fields = _fields(our_reader), _fields(their_reader)
    differing = {key for key in our_fields.keys() | their_fields.keys() if our_fields.get(key) != their_fields.get(key)}
    assert differing <= TOKENIZER_KEY_DIFFERENCES.keys(), {k: (our_fields.get(k), their_fields.get(k)) for k in differing}

    our_tensors = {t.name: t for t in our_reader.tensors}
    their_tensors = {t.name: t for t in their_reader.tensors}
    assert sorted(our_tensors) == sorted(their_tensors)
    for name, theirs in their_tensors.items():
        mine = our_tensors[name]
        assert (mine.tensor_type, list(mine.shape)) == (theirs.tensor_type, list(theirs.shape)), name
        assert np.asarray(mine.data).tobytes() == np.asarray(theirs.data).tobytes(), name
