"""Whole files against llama.cpp's convert_hf_to_gguf.py: same keys and values, same tensors
(names, shapes, types, bytes) for a small transformers llama with a trained SentencePiece tokenizer.

Differences that are deliberate are listed in TOKENIZER_KEY_DIFFERENCES with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ggufsmith
from ggufsmith.arch.registry import all_architectures
from tests.llamacpp_reference import COMPARED_OUTTYPES, TOKENIZER_KEY_DIFFERENCES, assert_same_file, reference_conversions

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif("llama" not in all_architectures(), reason="the llama plugin is not on this branch yet"),
]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.tokenizer_helpers import train_sentencepiece
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = tmp_path_factory.mktemp("ref") / "Tiny-Llama-Chat-v0.1"
    torch.manual_seed(0)
    # hidden 96 / ffn 200: ffn_down rows of 200 are no multiple of 32, so q8_0 needs the F16 fallback.
    config = LlamaConfig(vocab_size=1024, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="200KB")
    train_sentencepiece(model_dir, vocab_size=1000)
    (model_dir / "README.md").write_text("---\nlicense: mit\nlanguage:\n- en\ntags:\n- test\n---\n# tiny\n")
    return model_dir


@pytest.mark.parametrize("outtype", COMPARED_OUTTYPES)
def test_same_file_as_convert_hf_to_gguf(tmp_path, llama_dir, outtype):
    theirs_path = reference_conversions(llama_dir, llama_dir.parent / "reference", COMPARED_OUTTYPES)[outtype]
    ggufsmith.convert(llama_dir, tmp_path / "ours.gguf", outtype)
    assert_same_file(tmp_path / "ours.gguf", theirs_path, TOKENIZER_KEY_DIFFERENCES)
