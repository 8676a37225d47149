"""Hybrid attention / gated delta-net models (issue 17) converted by ggufsmith: Qwen3-Next, Qwen3.5 and
Qwen3.5-MoE. Tiny random models built with transformers (4 blocks, the full-attention block second,
not where llama.cpp's default interval of 4 puts it; 4 value heads sharing 2 key heads, so the
grouped/tiled head order matters), run by llama.cpp over a 68-token prompt (the conv window is 4,
the delta-net's chunks 64), compared with transformers' logits, and with llama.cpp's own converter's
file (run with --no-mtp, as ours leaves multi-token prediction out).

Tolerances, in units of the logits' standard deviation: f32 1e-3 over every position (measured
8.7e-5 to 1.1e-4). At f16 and q8_0 llama.cpp also rounds the activations that meet the weights
(to f16, to q8_0 blocks), and the delta-net's recurrent state carries each token's rounding on to
the later ones, through gates exp(-A softplus(a + dt_bias)) that these random weights push to
their steep part: transformers itself, run on the f16-rounded matrices, moves by 0.054 on the
dense model (llama.cpp's f16 file: 0.039). Where experts are routed, rounding also flips nearly
tied expert choices (see tests/test_arch_moe.py). So f16 and q8_0 bound the 90th percentile of the
positions, at 0.25 and 3.0 (measured f16 0.02-0.13, q8_0 0.48 dense, 1.9-2.2 with experts). These
files are those of llama.cpp's own converter (test_same_file_as_convert_hf_to_gguf, q8_0 included),
which therefore cannot get closer; the layouts are the same code at every outtype, and f32 pins
them down (a wrong layer pattern, head order or state layout: errors of whole standard deviations).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import (
    build_bpe_models, build_model, conversions, llamacpp_logits, relative_error, with_reference_logits,
)
from tests.llamacpp_reference import assert_same_file
from tests.tokenizer_helpers import train_bpe

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

TOLERANCE = {"f32": 1e-3, "f16": 0.25, "q8_0": 3.0}
VOCAB = 600
PATTERN = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=96, max_position_embeddings=512, tie_word_embeddings=False, vocab_size=VOCAB + 8,
              bos_token_id=0, eos_token_id=0, pad_token_id=0, layer_types=PATTERN, linear_conv_kernel_dim=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
EXPERTS = dict(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2)
# Qwen3.5's rope is multimodal: its sections (pairs of rotary dims per position axis) must fit the
# 8 rotary dims of a 32-wide head (llama.cpp asserts it; transformers' default [11, 11, 10] does not).
MROPE = dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                           "mrope_section": [2, 1, 1], "mrope_interleaved": True})
# kind -> (config class, model class, config fields)
MODELS = {
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(COMMON, **EXPERTS)),
    "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(COMMON, **MROPE)),
    "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(COMMON, **MROPE, **EXPERTS)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = with_reference_logits(build_bpe_models(tmp_path_factory.mktemp("hybrid"), MODELS, VOCAB), MODELS)
    assert all(len(ids) >= 32 for _, ids, _ in out.values())  # the chunked delta-net scan needs several chunks
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("hybrid-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_match_transformers(models, converted, kind, outtype):
    _, ids, expected = models[kind]
    got = llamacpp_logits(converted(kind, outtype), ids)
    per_position = np.abs(got - expected).max(axis=1) / expected.std()
    error = relative_error(got, expected) if outtype == "f32" else float(np.quantile(per_position, 0.9))
    print(f"{kind} {outtype}: error {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{kind} {outtype}: error {error:.2e} of the logits' std"


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_same_file_as_convert_hf_to_gguf(models, converted, kind, outtype):
    """Every key and tensor as llama.cpp's converter writes them, but ssm_a = -exp(A_log): ours is
    rounded once from float64, theirs is torch's float32 exp (one unit in the last place apart at most)."""
    from tests.test_arch_moe import KEY_DIFFERENCES

    model_dir = models[kind][0]
    theirs = reference_convert(model_dir, model_dir.parent / f"{kind}-reference-{outtype}.gguf", outtype, pre="qwen2",
                               extra_args=("--no-mtp",))
    assert_same_file(converted(kind, outtype), theirs, KEY_DIFFERENCES, ulps_apart={r"blk\.\d+\.ssm_a": 1})


def test_multimodal_checkpoint_converts_to_its_language_model(models, converted, tmp_path, caplog):
    """A Qwen3_5ForConditionalGeneration holding the qwen35 test model as its language model, with a
    vision tower and a multi-token-prediction layer: the same tensors and keys as the text model's
    file (but general.name), the tower and the mtp.* tensors left out with a notice each."""
    import json

    import torch
    import transformers
    from safetensors.numpy import load_file, save_file

    from tests.llamacpp_reference import gguf_contents

    text_dir = models["qwen35"][0]
    text = {k: v for k, v in json.loads((text_dir / "config.json").read_text()).items()
            if k not in ("architectures", "model_type", "transformers_version", "dtype")}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64))
    model = transformers.Qwen3_5ForConditionalGeneration(config)
    weights = transformers.Qwen3_5ForCausalLM.from_pretrained(text_dir).state_dict()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.replace("model.language_model.", "model.") in weights:
                param.copy_(weights[name.replace("model.language_model.", "model.")])
    model_dir = tmp_path / "qwen35-vl"
    model.save_pretrained(model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    tensors["mtp.fc.weight"] = np.ones((64, 128), np.float32)  # as the published checkpoints carry
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    for tokenizer_file in text_dir.glob("*token*"):
        (model_dir / tokenizer_file.name).write_bytes(tokenizer_file.read_bytes())

    ggufsmith.convert(model_dir, tmp_path / "vl.gguf", outtype="f32")
    ours_keys, ours_tensors = gguf_contents(tmp_path / "vl.gguf")
    text_keys, text_tensors = gguf_contents(converted("qwen35", "f32"))
    assert ours_tensors == text_tensors
    assert {k: v for k, v in ours_keys.items() if k != "general.name"} == \
        {k: v for k, v in text_keys.items() if k != "general.name"}
    assert "the vision tower" in caplog.text and "multi-token-prediction" in caplog.text


def test_fused_experts_give_the_same_file(models, converted, tmp_path):
    """transformers 5's fused expert stacks (gate_up_proj, down_proj) hold the same experts as the
    per-expert tensors of the qwen35moe test model (same seed): same file."""
    from tests.llamacpp_reference import gguf_contents

    config_class, model_class, fields = MODELS["qwen35moe"]
    model_dir = tmp_path / "fused"
    train_bpe(model_dir, "qwen2", vocab_size=VOCAB)
    build_model(config_class, model_class, model_dir, fused_experts=True, **fields)
    ggufsmith.convert(model_dir, tmp_path / "fused.gguf", outtype="f32")
    assert gguf_contents(tmp_path / "fused.gguf")[1] == gguf_contents(converted("qwen35moe", "f32"))[1]
