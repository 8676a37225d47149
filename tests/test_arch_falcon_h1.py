"""Falcon-H1 (`FalconH1ForCausalLM`, llama.cpp's `falcon-h1`) end to end: tiny random models with
attention and a Mamba-2 mixer in every block and every µP multiplier away from 1 (each a different
value, so that one folded into the wrong tensor shows), converted by ggufsmith, run by llama.cpp
(llama-cpp-python) against transformers, and compared with llama.cpp's own convert_hf_to_gguf.py.

Variants: "gated-norm" (mamba_rms_norm with the gate before the norm; separate output head) and
"no-norm" (the default config: no gated norm; the output head tied to the embeddings, with equal
embedding and lm_head multipliers). The Mamba inner size (mamba_d_ssm) is not expand x hidden_size.
The prompt is 63 tokens, four of the 16-token scan chunks. Errors in units of the logits' std
(tests/family_models.py).
"""

from __future__ import annotations

import pytest

from tests.decoder_reference import reference_convert
from tests.family_models import build_model, conversions, hf_logits, llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import EXPLICIT_SPECIAL_IDS, assert_same_file, gguf_contents
from tests.tokenizer_helpers import train_bpe

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

# Max over the prompt. Measured: f32 5e-6 to 8e-6; f16 1e-2 to 2.3e-2; q8_0 0.27 to 0.37 (the
# recurrent state carries every rounding error to all later positions).
TOLERANCE = {"f32": 1e-3, "f16": 0.05, "q8_0": 1.0}
MODEL_CLASS = "FalconH1ForCausalLM"
BASE = dict(vocab_size=608, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
            mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16, mlp_multipliers=[1.5, 0.7], key_multiplier=0.8,
            attention_out_multiplier=0.9, attention_in_multiplier=1.2, ssm_multipliers=[1.1, 0.9, 1.3, 0.8, 1.2],
            ssm_in_multiplier=0.7, ssm_out_multiplier=1.4, max_position_embeddings=512,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, architectures=[MODEL_CLASS])
VARIANTS = {
    "gated-norm": dict(BASE, mamba_rms_norm=True, mamba_norm_before_gate=False, lm_head_multiplier=0.5,
                       embedding_multiplier=2.0, tie_word_embeddings=False),
    "no-norm": dict(BASE, mamba_rms_norm=False, lm_head_multiplier=1.5, embedding_multiplier=1.5,
                    tie_word_embeddings=True),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("falcon-h1")
    out = {}
    for name, fields in VARIANTS.items():
        model_dir = root / name
        train_bpe(model_dir, "qwen2", vocab_size=600)
        build_model("FalconH1Config", MODEL_CLASS, model_dir, **fields)
        ids = prompt_ids(model_dir)
        assert len(ids) >= 48
        out[name] = model_dir, ids, hf_logits(model_dir, MODEL_CLASS, ids)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("falcon-h1-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers(models, converted, name, outtype):
    _, ids, expected = models[name]
    error = relative_error(llamacpp_logits(converted(name, outtype), ids), expected)
    print(f"{name} {outtype}: {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{name} {outtype}: max error {error:.2e} of the logits' std"


def test_norm_and_head_as_configured(converted):
    tensors = gguf_contents(converted("gated-norm", "f32"))[1]
    assert "blk.2.ssm_norm.weight" in tensors and "output.weight" in tensors
    tensors = gguf_contents(converted("no-norm", "f32"))[1]
    assert not any(".ssm_norm." in n for n in tensors) and "output.weight" not in tensors


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_same_file_as_convert_hf_to_gguf(models, converted, tmp_path, name, outtype):
    theirs = reference_convert(models[name][0], tmp_path / f"reference-{outtype}.gguf", outtype, pre="qwen2")
    assert_same_file(converted(name, outtype), theirs, dict(EXPLICIT_SPECIAL_IDS), ulps_apart={r"blk\.\d+\.ssm_a": 1})
