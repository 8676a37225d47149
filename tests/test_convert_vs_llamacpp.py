"""Whole files against llama.cpp's convert_hf_to_gguf.py: same keys and values, same tensors
(names, shapes, types, bytes) for a small transformers llama with a trained SentencePiece tokenizer.

Differences that are deliberate are listed in TOKENIZER_KEY_DIFFERENCES with the reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.arch.registry import all_architectures
from tests.llamacpp_reference import COMPARED_OUTTYPES, TOKENIZER_KEY_DIFFERENCES, reference_conversions

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


def _contents(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), np.asarray(t.data).tobytes()) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("outtype", COMPARED_OUTTYPES)
def test_same_file_as_convert_hf_to_gguf(tmp_path, llama_dir, outtype):
    theirs_path = reference_conversions(llama_dir, llama_dir.parent / "reference", COMPARED_OUTTYPES)[outtype]
    ggufsmith.convert(llama_dir, tmp_path / "ours.gguf", outtype)
    ours, ours_t = _contents(tmp_path / "ours.gguf")
    theirs, theirs_t = _contents(theirs_path)

    assert sorted(set(ours) ^ set(theirs)) == sorted(k for k in TOKENIZER_KEY_DIFFERENCES if (k in ours) != (k in theirs))
    for key in theirs:
        if key in ours and key not in TOKENIZER_KEY_DIFFERENCES:
            a, b = ours[key], theirs[key]
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-6), key
            else:
                assert a == b, key

    assert list(ours_t) == list(theirs_t)  # same names, same order
    for name, (shape, ttype, data) in theirs_t.items():
        o_shape, o_type, o_data = ours_t[name]
        assert (o_shape, o_type, len(o_data)) == (shape, ttype, len(data)), name
        if ttype == int(gguf.GGMLQuantizationType.Q8_0):
            # gguf-py rounds halves to even where ggml (and ggufsmith) round them away from zero:
            # equal bytes except, at most, a rare off-by-one quant on an exact tie.
            a = np.frombuffer(o_data, np.uint8).reshape(-1, 34)
            b = np.frombuffer(data, np.uint8).reshape(-1, 34)
            assert (a[:, :2] == b[:, :2]).all(), name  # same scales
            diff = np.abs(a[:, 2:].view(np.int8).astype(int) - b[:, 2:].view(np.int8).astype(int))
            assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, name
        else:
            assert o_data == data, name
