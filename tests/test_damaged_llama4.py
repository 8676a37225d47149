"""Llama 4 configs that llama.cpp's llama4 cannot run as transformers does (its NoPE period, chunk
size, temperature and q/k norm are fixed; its MoE layers follow interleave_moe_layer_step) are
refused in one line naming the key (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config
from tests.family_models import build_model
from tests.test_arch_llama4 import TEXT, VOCAB
from tests.tokenizer_helpers import train_bpe

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    model_dir = tmp_path_factory.mktemp("llama4_damaged") / "causal"
    train_bpe(model_dir, "qwen2", vocab_size=VOCAB)
    return build_model("Llama4TextConfig", "Llama4ForCausalLM", model_dir, **TEXT)


# damage -> (config changes, culprit named in the error)
CASES = {
    "nope-layers-not-every-4th": (dict(no_rope_layers=[1, 0, 1, 1]), "no_rope_layers"),
    "attention-chunk-smaller": (dict(attention_chunk_size=16), "attention_chunk_size"),
    "no-chunked-attention": (dict(layer_types=["full_attention"] * 4), "layer_types"),
    "moe-layers-not-interleaved": (dict(moe_layers=[0, 1]), "moe_layers"),
    "moe-step-not-matching-the-experts": (dict(interleave_moe_layer_step=1, moe_layers=None), "blk.0.ffn_down"),
    "no-experts": (dict(num_local_experts=0), "num_local_experts"),
    "temperature-tuning-off": (dict(attn_temperature_tuning=False), "attn_temperature_tuning"),
    "temperature-floor-changed": (dict(floor_scale=4096), "floor_scale"),
    "qk-norm-off-with-16-experts": (dict(use_qk_norm=False), "use_qk_norm"),
    "attention-biases": (dict(attention_bias=True), "attention_bias"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(original, tmp_path, case):
    changes, culprit = CASES[case]
    assert_convert_refused(original, tmp_path, lambda model_dir: edit_config(model_dir, **changes), culprit)
