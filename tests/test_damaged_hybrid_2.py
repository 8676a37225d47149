"""Damaged-input catalogue of Nemotron-H and Falcon-H1: config variants llama.cpp cannot run the way
transformers does are refused in one line naming the setting, before anything is written (contract:
tests/damaged_inputs.py). The example model's config.json is replaced; the refusal comes before its
tensors are read."""

from __future__ import annotations

import json

import pytest

from tests.damaged_inputs import assert_clean_failure, copy_example, run_cli

NEMOTRON_H = dict(architectures=["NemotronHForCausalLM"], model_type="nemotron_h", vocab_size=608, hidden_size=64,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=8,
                  n_groups=2, ssm_state_size=16, intermediate_size=96, hybrid_override_pattern="M-M*")
FALCON_H1 = dict(architectures=["FalconH1ForCausalLM"], model_type="falcon_h1", vocab_size=608, hidden_size=64,
                 intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16,
                 tie_word_embeddings=False)

CASES = {
    "nemotron-h-pattern-mixes-mlp-and-experts": (dict(NEMOTRON_H, hybrid_override_pattern="M-E*"), "mixes plain MLP"),
    "nemotron-h-unknown-pattern-letter": (dict(NEMOTRON_H, hybrid_override_pattern="M-X*"), "hybrid_override_pattern"),
    "nemotron-h-unknown-layer-type": (dict(NEMOTRON_H, layers_block_type=["mamba", "sliding_attention"]),
                                      "layers_block_type"),
    "nemotron-h-mlp-not-relu2": (dict(NEMOTRON_H, mlp_hidden_act="silu"), "mlp_hidden_act"),
    "falcon-h1-norm-before-gate": (dict(FALCON_H1, mamba_rms_norm=True, mamba_norm_before_gate=True),
                                   "mamba_norm_before_gate"),
    "falcon-h1-tied-head-other-multiplier": (dict(FALCON_H1, tie_word_embeddings=True, embedding_multiplier=2.0,
                                                  lm_head_multiplier=0.5), "lm_head_multiplier"),
    "falcon-h1-attention-bias": (dict(FALCON_H1, attention_bias=True), "attention_bias"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(tmp_path, case):
    config, culprit = CASES[case]
    model = copy_example(tmp_path)
    (model / "config.json").write_text(json.dumps(config))
    target = tmp_path / "out.gguf"
    assert_clean_failure(run_cli("convert", model, target), culprit, target)
