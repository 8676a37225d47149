"""Llama 4 (llama.cpp's llama4) converted by ggufsmith: llama.cpp gives transformers' logits for a
tiny Llama4ForCausalLM and for the language model of a tiny Llama4ForConditionalGeneration, and
llama.cpp's own converter writes the same file.

The model: 4 blocks, every 2nd a mixture of 4 experts (top 2, sigmoid-weighted inputs) plus a
shared expert, the others a dense MLP of another width; the 4th block without rope (NoPE, full
attention), the others with llama3-scaled rope, L2-normalized q/k and chunked attention;
grouped-query attention. llama.cpp fixes the chunk at 8192 tokens (as every published Llama 4
does), so one prompt of 8256 tokens crosses a chunk boundary and reaches the positions where the
NoPE blocks' temperature scaling starts (8191): a file run without chunks, or without the
temperature, fails it.

Tolerances as tests/test_arch_moe.py's (units of the logits' std; f16 and q8_0 bound 90% of the
positions, because rounding can flip a near-tie between two experts). Measured: f32 5.2e-6 / 6.1e-6
(causal / multimodal; the long prompt 2.4e-4, the error of sums over 8k tokens), f16 6.4e-3 /
4.8e-3, q8_0 0.19 / 0.15. Checked by hand: with the experts in reverse order the f32 logits are off
by 2.8 std, with gate and up swapped by 2.1, with expert_used_count 1 by 1.6; with
interleave_moe_layer_step 1 in the file llama.cpp refuses it; without the transposition of the
expert stacks the shape check refuses the model; a file whose blocks 1 and 2 are not chunked (a
sliding_window_pattern key) passes the first 8192 positions of the long prompt and is off by 4.1
std after them. Configs whose NoPE layers, chunk size, MoE layers,
temperature or q/k norm differ from what llama.cpp runs are refused (tests/test_damaged_llama4.py).
The file is llama.cpp's converter's, tensor for tensor and byte for byte, and key for key but for
the tokenizer's special-token ids we write explicitly (tests/test_arch_moe.py's KEY_DIFFERENCES).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.decoder_reference import reference_convert
from tests.family_models import build_bpe_models, conversions, llamacpp_logits, relative_error, with_reference_logits
from tests.llamacpp_reference import assert_same_file
from tests.test_arch_moe import KEY_DIFFERENCES

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

TOLERANCE = {"f32": 1e-3, "f16": 0.25, "q8_0": 0.6}
VOCAB = 600
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
TEXT = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=2,
            interleave_moe_layer_step=2, max_position_embeddings=16384, vocab_size=VOCAB + 8, bos_token_id=0,
            eos_token_id=0, pad_token_id=0, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=56,
              patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)
# kind -> (config class, model class, config fields)
MODELS = {
    "causal": ("Llama4TextConfig", "Llama4ForCausalLM", TEXT),
    "multimodal": ("Llama4Config", "Llama4ForConditionalGeneration", dict(text_config=TEXT, vision_config=VISION)),
}
LONG_PROMPT = 8192 + 64  # past llama.cpp's (and the model's) attention chunk


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = with_reference_logits(build_bpe_models(tmp_path_factory.mktemp("llama4"), MODELS, VOCAB), MODELS)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("llama4-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_match_transformers(models, converted, kind, outtype):
    _, ids, expected = models[kind]
    got = llamacpp_logits(converted(kind, outtype), ids)
    if outtype == "f32":
        error = relative_error(got, expected)
    else:  # per position, the 90th percentile: see tests/test_arch_moe.py
        error = float(np.quantile([relative_error(g[None], e[None]) * e.std() / expected.std() for g, e in zip(got, expected)], 0.9))
    print(f"{kind} {outtype}: error {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{kind} {outtype}: error {error:.2e} of the logits' std"


def test_multimodal_file_is_the_language_model(converted):
    """The vision tower and projector are left out: the same tensors and keys as the text model's."""
    from tests.llamacpp_reference import gguf_contents

    causal_keys, causal_tensors = gguf_contents(converted("causal", "f32"))
    multimodal_keys, multimodal_tensors = gguf_contents(converted("multimodal", "f32"))
    assert sorted(multimodal_tensors) == sorted(causal_tensors)
    assert {k for k in multimodal_keys if k.startswith("llama4.")} == {k for k in causal_keys if k.startswith("llama4.")}


def test_long_prompt_crosses_the_attention_chunk(models, converted):
    """8256 tokens: the rope blocks attend within chunks of 8192, the NoPE blocks' queries are scaled
    from position 8191 on. f32, every position within 1e-3 of the logits' std (measured 2.4e-4)."""
    import torch
    import transformers

    model_dir = models["causal"][0]
    ids = [int(i) for i in np.random.default_rng(0).integers(1, VOCAB, LONG_PROMPT)]
    model = transformers.Llama4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(converted("causal", "f32")), n_ctx=LONG_PROMPT + 64, n_batch=512,
                          logits_all=True, verbose=False, type_k=0, type_v=0)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[:LONG_PROMPT], dtype=np.float32)
    finally:
        llm.close()
    error = relative_error(got, expected)
    print(f"long prompt: error {error:.2e} std")
    assert error <= TOLERANCE["f32"]


# the multimodal folder once: its text model is the causal one's (test_multimodal_file_is_the_language_model)
@pytest.mark.parametrize("kind, outtype", [("causal", "f32"), ("causal", "f16"), ("multimodal", "f32")])
def test_same_file_as_convert_hf_to_gguf(models, converted, kind, outtype):
    model_dir = models[kind][0]
    theirs = reference_convert(model_dir, model_dir.parent / f"{kind}-reference-{outtype}.gguf", outtype, pre="qwen2")
    assert_same_file(converted(kind, outtype), theirs, KEY_DIFFERENCES)


# The published models' text_config (Scout: 16 experts in every block, llama3 rope scaling with equal
# low and high factors; Maverick: 128 experts every 2nd block, no q/k norm, no scaling), abridged to
# what the plugin reads.
SCOUT = dict(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_hidden_layers=48,
             num_attention_heads=40, num_key_value_heads=8, head_dim=128, num_local_experts=16, num_experts_per_tok=1,
             interleave_moe_layer_step=1, max_position_embeddings=10485760, rms_norm_eps=1e-5, vocab_size=202048,
             rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0,
                                                    high_freq_factor=1.0, original_max_position_embeddings=8192),
             attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, use_qk_norm=True,
             no_rope_layers=[int((i + 1) % 4 != 0) for i in range(48)], moe_layers=list(range(48)))
MAVERICK = dict(SCOUT, num_local_experts=128, interleave_moe_layer_step=2, intermediate_size_mlp=16384,
                rope_scaling=None, use_qk_norm=False, moe_layers=list(range(1, 48, 2)))


@pytest.mark.parametrize("text_config", [SCOUT, MAVERICK], ids=["scout", "maverick"])
def test_published_configs_are_accepted_with_transformers_rope(text_config):
    """The plugin takes the published configs (as Llama4ForConditionalGeneration's text_config), and
    Scout's rope_freqs give transformers' own llama3 frequencies (its equal low and high factors
    leave no interpolated band)."""
    import torch
    from transformers import Llama4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ggufsmith.arch.llama4 import Llama4
    from ggufsmith.readers.config import HFConfig

    plugin = Llama4(HFConfig({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                              "text_config": text_config}))
    keys = {k: v.plain() for k, v in plugin.metadata().items()}
    assert (keys["llama4.feed_forward_length"], keys["llama4.expert_feed_forward_length"]) == (16384, 8192)
    assert keys["llama4.interleave_moe_layer_step"] == text_config["interleave_moe_layer_step"]
    extra = plugin.extra_tensors()
    if text_config["rope_scaling"] is None:
        assert extra == {}
        return
    divisors = extra["rope_freqs.weight"].load()
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](Llama4TextConfig(**text_config), torch.device("cpu"))
    ours = 1.0 / (divisors * 500000.0 ** (np.arange(0, 128, 2) / 128))
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)
    assert 1.0 < divisors.max() and divisors.min() == 1.0
