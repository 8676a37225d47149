"""Granite 4 (`GraniteMoeHybridForCausalLM`, llama.cpp's `granitehybrid`), LFM2 and LFM2-MoE
(`Lfm2ForCausalLM`, `Lfm2MoeForCausalLM`) and Jamba (`JambaForCausalLM`) end to end: tiny random
models whose recurrent layers (Mamba-2; LFM2's gated short convolutions; Jamba's Mamba with dt/B/C
norms) and attention layers follow a non-trivial pattern, converted by ggufsmith, run by llama.cpp
(llama-cpp-python) against transformers, and compared with llama.cpp's own convert_hf_to_gguf.py.

Granite variants: routed experts with a shared expert and no rope (Granite 4.0-H's layout), in both
expert layouts; and the dense variant (num_local_experts 0: the shared MLP alone) with rope. The
prompt is 63 tokens, four of the 16-token scan chunks, so the conv window and the recurrent state
matter. Errors are in units of the logits' std (tests/family_models.py). Measured: f32 6e-6 to
7e-6; f16 1e-2 to 1.7e-2; q8_0 0.33 to 0.55 (q8_0 rounding changes the routing of some tokens, and
the recurrent state carries each rounding error to every later position).
"""

from __future__ import annotations

import json

import pytest

from tests import moe_harness
from tests.decoder_reference import reference_convert
from tests.family_models import build_model, conversions, hf_logits, llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import EXPLICIT_SPECIAL_IDS, TOKENIZER_KEY_DIFFERENCES, assert_same_file
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

TOLERANCE = {"f32": 1e-3, "f16": 0.05, "q8_0": 1.0}  # max over the prompt
MOE = {"moe", "moe-fused", "lfm2moe", "lfm2moe-fused", "jamba", "jamba-fused"}  # f16/q8_0: 90% of positions (tests/moe_harness.py)
MODEL_CLASS = "GraniteMoeHybridForCausalLM"
LFM2 = dict(vocab_size=608, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, layer_types=["conv", "full_attention", "conv", "conv"], conv_L_cache=3,
            block_multiple_of=32, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=0,
            eos_token_id=0, pad_token_id=0, architectures=["Lfm2ForCausalLM"])
JAMBA = dict(vocab_size=608, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
             attn_layer_period=4, attn_layer_offset=2, mamba_d_state=8, use_mamba_kernels=False,
             max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             architectures=["JambaForCausalLM"])
LFM2_MOE = dict(LFM2, intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                num_dense_layers=1, architectures=["Lfm2MoeForCausalLM"])
# Layer 1 is attention, the others Mamba-2: a model that took layer 0 or 3 for the attention layer
# (or none) loads tensors of the wrong kind and is refused before writing.
BASE = dict(vocab_size=608, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8,
            mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16, mamba_chunk_size=16, embedding_multiplier=2.0,
            residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0, max_position_embeddings=512,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0, architectures=[MODEL_CLASS])
# name -> (config class, model class, fields)
VARIANTS = {
    "moe": ("GraniteMoeHybridConfig", MODEL_CLASS,
            dict(BASE, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48)),
    "moe-fused": ("GraniteMoeHybridConfig", MODEL_CLASS,
                  dict(BASE, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48)),
    "dense-rope": ("GraniteMoeHybridConfig", MODEL_CLASS,
                   dict(BASE, num_local_experts=0, shared_intermediate_size=96, position_embedding_type="rope")),
    # auto-adjusted MLP width (2/3 of 192, to a multiple of 32: 128), tied head
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", LFM2),
    # one dense block, then 4 experts (top 2) chosen with the selection bias, in both layouts
    "lfm2moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", LFM2_MOE),
    "lfm2moe-fused": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", LFM2_MOE),
    # attention in layer 2 of 4, experts in layers 1 and 3, dense MLPs in 0 and 2; SentencePiece
    "jamba": ("JambaConfig", "JambaForCausalLM", JAMBA),
    "jamba-fused": ("JambaConfig", "JambaForCausalLM", JAMBA),
}
SENTENCEPIECE = {"jamba", "jamba-fused"}


def _legacy_layer_types(model_dir) -> None:
    """transformers 5 saves layer_types as "linear_attention" / "full_attention"; the published
    Granite 4 configs (and the only names llama.cpp's converter knows) say "mamba" / "attention"."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config["layer_types"] = [{"linear_attention": "mamba", "full_attention": "attention"}[t] for t in config["layer_types"]]
    path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("granite-hybrid")
    out = {}
    for name, (config_class, model_class, fields) in VARIANTS.items():
        model_dir = root / name
        if name in SENTENCEPIECE:
            train_sentencepiece(model_dir, vocab_size=600)
        else:
            train_bpe(model_dir, "qwen2", vocab_size=600)
        build_model(config_class, model_class, model_dir, fused_experts=name.endswith("fused"), **fields)
        if name == "moe":
            _legacy_layer_types(model_dir)  # the other Granites keep transformers 5's names: both are read
        ids = prompt_ids(model_dir)
        assert len(ids) >= 48
        out[name] = model_dir, ids, hf_logits(model_dir, model_class, ids)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("granite-hybrid-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers(models, converted, name, outtype):
    _, ids, expected = models[name]
    got = llamacpp_logits(converted(name, outtype), ids)
    if name in MOE:  # rounding can flip a near-tied routing choice for a token
        error, limit = moe_harness.logits_error(got, expected, outtype), moe_harness.TOLERANCE[outtype]
    else:
        error, limit = relative_error(got, expected), TOLERANCE[outtype]
    print(f"{name} {outtype}: {error:.2e} std")
    assert error <= limit, f"{name} {outtype}: error {error:.2e} of the logits' std"


@pytest.mark.parametrize("name", ["moe", "lfm2moe", "jamba"])
def test_both_expert_layouts_give_the_same_tensors(converted, name):
    from tests.llamacpp_reference import gguf_contents

    assert gguf_contents(converted(name, "f32"))[1] == gguf_contents(converted(f"{name}-fused", "f32"))[1]


def test_recurrent_layers_are_the_config_s(converted):
    from tests.llamacpp_reference import gguf_contents

    keys, tensors = gguf_contents(converted("moe", "f32"))
    assert keys["granitehybrid.attention.head_count_kv"] == [0, 2, 0, 0]
    assert {n.split(".")[1] for n in tensors if ".ssm_in." in n} == {"0", "2", "3"}
    assert {n.split(".")[1] for n in tensors if ".attn_q." in n} == {"1"}
    assert keys["granitehybrid.rope.scaling.finetuned"] is False
    assert gguf_contents(converted("dense-rope", "f32"))[0]["granitehybrid.rope.scaling.finetuned"] is True


def test_lfm2_conv_layers_and_mlp_width(converted):
    from tests.llamacpp_reference import gguf_contents

    keys, tensors = gguf_contents(converted("lfm2", "f32"))
    assert keys["lfm2.attention.head_count_kv"] == [0, 2, 0, 0] and keys["lfm2.feed_forward_length"] == 128
    assert {n.split(".")[1] for n in tensors if "shortconv.conv" in n} == {"0", "2", "3"}
    assert tensors["blk.0.shortconv.conv.weight"][0] == (3, 64)  # {L, hidden}
    assert "output.weight" not in tensors


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("name", ["moe", "dense-rope", "lfm2", "lfm2moe", "jamba"])
def test_same_file_as_convert_hf_to_gguf(models, converted, tmp_path, name, outtype):
    """llama.cpp's converter knows only the legacy layer names, and turns rope on only for
    Bamba or an all-attention model: it is given the legacy names and a model without rope."""
    model_dir = models[name][0]
    if name == "dense-rope":
        reference_dir = tmp_path / name
        reference_dir.mkdir()
        for f in model_dir.iterdir():
            (reference_dir / f.name).write_bytes(f.read_bytes())
        _legacy_layer_types(reference_dir)
        model_dir = reference_dir
    theirs = reference_convert(model_dir, tmp_path / f"reference-{outtype}.gguf", outtype, pre="qwen2")
    differences = dict(TOKENIZER_KEY_DIFFERENCES if name in SENTENCEPIECE else EXPLICIT_SPECIAL_IDS)
    if name == "dense-rope":
        for key in ("expert_count", "expert_used_count", "expert_shared_feed_forward_length"):
            differences[f"granitehybrid.{key}"] = ("the reference writes expert_count 0 with expert_used_count 2, "
                                                   "which llama.cpp's loader asserts against: its file does not load")
        differences["granitehybrid.feed_forward_length"] = ("ours: shared_intermediate_size, the width of the only "
                                                            "MLP; theirs: intermediate_size, the experts' width")
        differences["granitehybrid.rope.scaling.finetuned"] = ("ours follows position_embedding_type 'rope'; the "
                                                               "reference turns rope on only for Bamba")
        differences["granitehybrid.context_length"] = "ours: max_position_embeddings with rope; theirs 2^20"
    # Mamba-1's A = -exp(A_log): ours correctly rounded, theirs torch's float32 exp (Mamba-2's A is
    # per head: few enough values that none has come out apart)
    assert_same_file(converted(name, outtype), theirs, differences, ulps_apart={r"blk\.\d+\.ssm_a": 1})
