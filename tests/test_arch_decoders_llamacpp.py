"""Converted falcon, gpt2, gptneox, bloom and mpt models run in llama.cpp (llama-cpp-python) and give
transformers' logits; llama.cpp tokenizes a multilingual text as the HF tokenizer does.

Tolerances are relative to the largest |logit| of the prompt (about 5 for these models). Even in
f32, llama.cpp's CPU backend computes GELU through a float16 lookup table (and the tanh
approximation where transformers uses erf for falcon, gptneox and mpt), which bounds the agreement
at a few 1e-4; that our f32 tensors are the checkpoint's, bit for bit after the layout change, is
checked against convert_hf_to_gguf.py in test_arch_decoders.py. The KV cache is kept in F32 so that
only the weights' type differs between rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.decoder_convert import convert
from tests.decoder_models import VARIANTS, build_model, hf_logits, load_model, rewrite_as_rw_config
from tests.tokenizer_helpers import CHECK_TEXT, train_bpe, write_tokenizer_config

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

RUNNABLE = [kind for kind in VARIANTS if not kind.startswith("gptj")] + ["falcon-mq-rw", "falcon-gqa-rw"]
# Each family's tokenizer pre-tokenization, and the tokenizer.ggml.pre name it must come out as.
TOKENIZER_STYLE = {"falcon": "falcon", "bloom": "bloom"}
EXPECTED_PRE = {"falcon": "falcon", "bloom": "bloom", "gpt2": "gpt-2", "gptneox": "gpt-2", "mpt": "gpt-2"}
TOLERANCE = {"f32": 1e-3, "f16": 2e-3, "q8_0": 4e-2}  # max |llama.cpp - transformers| / max |logit|
PROMPT = "The quick brown fox, größere Äpfel, 我们今天去公园散步。 Привет! 12345 🦙"


def family(kind: str) -> str:
    return kind.split("-")[0]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders_llamacpp")
    dirs = {}
    for kind in RUNNABLE:
        base_kind = kind.removesuffix("-rw")
        model_dir = root / kind
        train_bpe(model_dir, TOKENIZER_STYLE.get(family(kind), "gpt2"))
        if family(kind) not in TOKENIZER_STYLE:
            # GPT-2 era tokenizers: transformers' default at the time was to clean up spaces.
            write_tokenizer_config(model_dir, clean_up_tokenization_spaces=True)
        n_tokens = len(json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]) + 1
        build_model(base_kind, model_dir, n_tokens + 3)  # more embedding rows than tokens, as is common
        dirs[kind] = model_dir
    return dirs


@pytest.fixture(scope="session")
def reference_logits(model_dirs):
    """transformers' logits (from the current-style config; the -rw dirs hold the same weights)."""
    from transformers import AutoTokenizer

    out = {}
    for kind, model_dir in model_dirs.items():
        ids = AutoTokenizer.from_pretrained(model_dir).encode(PROMPT, add_special_tokens=False)
        out[kind] = ids, hf_logits(load_model(model_dir, kind.removesuffix("-rw")), ids)
        if kind.endswith("-rw"):
            rewrite_as_rw_config(model_dir)  # from now on the folder is described the old way
    return out


@pytest.fixture(scope="session")
def converted(model_dirs, reference_logits, tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders_gguf")
    cache = {}

    def get(kind: str, outtype: str) -> Path:
        if (kind, outtype) not in cache:
            cache[kind, outtype] = convert(model_dirs[kind], root / f"{kind}-{outtype}.gguf", outtype)
        return cache[kind, outtype]

    return get


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("kind", RUNNABLE)
def test_logits_match_transformers(converted, reference_logits, kind, outtype):
    ids, expected = reference_logits[kind]
    llm = llama_cpp.Llama(
        model_path=str(converted(kind, outtype)), n_ctx=128, n_batch=128, logits_all=True, verbose=False,
        type_k=0, type_v=0,  # GGML_TYPE_F32 KV cache
    )
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"{kind} {outtype}: relative max error {error:.2e}")
    assert error <= TOLERANCE[outtype], f"{kind} {outtype}: relative max error {error:.2e}"


@pytest.mark.parametrize("kind", [k for k in RUNNABLE if not k.endswith("-rw")])
def test_llama_cpp_tokenizes_like_transformers(converted, model_dirs, kind):
    from transformers import AutoTokenizer

    path = converted(kind, "f32")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == EXPECTED_PRE[family(kind)]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        ours = llm.tokenize(CHECK_TEXT.encode("utf-8"), add_bos=False, special=False)
    finally:
        llm.close()
    assert ours == AutoTokenizer.from_pretrained(model_dirs[kind]).encode(CHECK_TEXT, add_special_tokens=False)


# transformers' own GGUF loader undoes the layout changes independently of us. It reads gpt2, bloom
# and falcon, but not the grouped (40B) falcon: it never sets new_decoder_architecture.
@pytest.mark.parametrize("kind", ["gpt2", "bloom", "falcon-mq"])
def test_transformers_gguf_loader_gives_the_original_logits(converted, reference_logits, kind, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    pytest.importorskip("accelerate")
    path = converted(kind, "f32")
    (tmp_path / "model.gguf").symlink_to(path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    ids, expected = reference_logits[kind]
    np.testing.assert_allclose(hf_logits(model, ids), expected, rtol=0, atol=1e-5)
