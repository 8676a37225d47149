"""Mamba and Mamba-2 end to end: tiny MambaForCausalLM / Mamba2ForCausalLM models with a BPE tokenizer
trained here, converted by ggufsmith, run by llama.cpp (llama-cpp-python), compared with
transformers' logits and tokenizer, and with llama.cpp's own convert_hf_to_gguf.py output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.archs_other_helpers import convert_for_tests, read_gguf

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp")
from tests import tokenizer_helpers  # noqa: E402

# Largest |llama.cpp - transformers| over all logits, relative to the largest |logit|, over a
# 48-token prompt (three of Mamba-2's 16-token scan chunks). Measured on these fixtures:
# mamba f32 2.9e-7, f16 4.6e-4, bf16 3.4e-3, q8_0 1.1e-2; mamba2 f32 8.1e-7, f16 1.2e-3,
# bf16 1.1e-2, q8_0 4.1e-2 (its 8 heads of 16 channels sum fewer terms, so rounding averages out less).
TOLERANCE = {
    "mamba": {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2, "q8_0": 3e-2},
    "mamba2": {"f32": 1e-5, "f16": 4e-3, "bf16": 3e-2, "q8_0": 8e-2},
}
VOCAB_SIZE = 1504  # the trained tokenizer's 1501 tokens, padded to a multiple of 16 as Mamba-2 does

CONFIGS = {
    "mamba": lambda: transformers.MambaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, state_size=16, num_hidden_layers=2, architectures=["MambaForCausalLM"]),
    # 2 groups of B/C for 8 heads (4 heads per group), so that a wrong group or head layout shows
    "mamba2": lambda: transformers.Mamba2Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, state_size=16, num_hidden_layers=2, num_heads=8, head_dim=16,
        n_groups=2, expand=2, chunk_size=16, architectures=["Mamba2ForCausalLM"]),
}
MODEL_CLASSES = {"mamba": "MambaForCausalLM", "mamba2": "Mamba2ForCausalLM"}


@pytest.fixture(scope="module", params=list(CONFIGS))
def mamba_dir(request, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    tokenizer_helpers.train_bpe(folder, "gpt2", vocab_size=1500)
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_CLASSES[family])(CONFIGS[family]()).eval()
    with torch.no_grad():  # random A_log, D and norms as well, so that -exp(A_log) is exercised in general
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return folder, model, family


@pytest.fixture(scope="module")
def prompt_ids(mamba_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(mamba_dir[0])
    ids = tokenizer(tokenizer_helpers.CHECK_TEXT[:300], add_special_tokens=False)["input_ids"]
    assert len(ids) >= 48
    return ids[:48]


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
def test_llama_cpp_logits_match_transformers(mamba_dir, prompt_ids, tmp_path, outtype):
    folder, model, family = mamba_dir
    path = convert_for_tests(folder, tmp_path / f"{family}-{outtype}.gguf", outtype)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False)
    llm.eval(prompt_ids)
    ours = np.array(llm.scores[: len(prompt_ids)])
    with torch.no_grad():
        reference = model(torch.tensor([prompt_ids])).logits[0].float().numpy()
    error = np.abs(ours - reference).max() / np.abs(reference).max()
    assert error < TOLERANCE[family][outtype], f"{family} {outtype}: relative error {error:.2e}"


def test_llama_cpp_tokenizes_like_transformers(mamba_dir, tmp_path):
    folder = mamba_dir[0]
    path = convert_for_tests(folder, tmp_path / "mamba-f32.gguf", "f32")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    text = tokenizer_helpers.CHECK_TEXT
    assert llm.tokenize(text.encode(), add_bos=True, special=False) == hf(text)["input_ids"]


def test_same_as_convert_hf_to_gguf(mamba_dir, tmp_path):
    """Every general.* and mamba(2).* key and every tensor (name, shape, type, bytes) of the f32 file equals
    llama.cpp's converter's, except A = -exp(A_log), where ours is correctly rounded and llama.cpp's
    (torch's float32 exp) may be one unit in the last place away."""
    from tests import llamacpp_reference as reference

    folder = mamba_dir[0]
    ref_path = tmp_path / "reference.gguf"
    _run_reference_with_pre(reference, folder, ref_path, "gpt-2")
    ref_keys, ref_tensors = read_gguf(ref_path)
    our_keys, our_tensors = read_gguf(convert_for_tests(folder, tmp_path / "ours.gguf", "f32"))

    # tokenizer.* keys are the tokenizer exporter's, compared with the reference in its own tests
    model_keys = {k for k in ref_keys | our_keys if not k.startswith("tokenizer.")}
    assert {k: our_keys.get(k) for k in model_keys} == {k: ref_keys.get(k) for k in model_keys}
    assert list(our_tensors) == list(ref_tensors)
    for name, (shape, ggml_type, data) in ref_tensors.items():
        assert our_tensors[name][:2] == (shape, ggml_type), name
        ours = our_tensors[name][2]
        if name.endswith(".ssm_a"):
            ulps = np.abs(ours.view(np.int32).astype(np.int64) - data.view(np.int32).astype(np.int64))
            assert ulps.max() <= 1, name
        else:
            assert ours.tobytes() == data.tobytes(), name


# llama.cpp's converter names a BPE pre-tokenizer by hashing known tokenizers' output, so it
# refuses a tokenizer trained here; tell it the name (our exporter's choice is tested elsewhere).
def _run_reference_with_pre(reference, model_dir, out, pre: str) -> None:
    reference.run_reference_converter(model_dir, out, "f32", pre=pre, timeout=600)


@pytest.mark.parametrize("mamba_dir", ["mamba"], indirect=True)  # the loader knows Mamba, not Mamba-2
def test_transformers_gguf_loader_reads_our_file(mamba_dir, prompt_ids, tmp_path):
    """transformers' own GGUF loader (which turns ssm_a back into A_log) gives the original logits;
    it reads Mamba files, not Mamba-2 ones."""
    pytest.importorskip("accelerate")
    folder, model, _ = mamba_dir
    convert_for_tests(folder, tmp_path / "mamba-f32.gguf", "f32")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="mamba-f32.gguf").eval()
    with torch.no_grad():
        expected = model(torch.tensor([prompt_ids])).logits
        got = loaded(torch.tensor([prompt_ids])).logits
    error = (got - expected).abs().max().item() / expected.abs().max().item()
    assert error < 1e-5, f"relative error {error:.2e}"
