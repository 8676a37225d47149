"""MiniMax-M2 and PhiMoE configs and checkpoints that do not fit together, or that llama.cpp cannot
run as transformers does: each is refused in one line naming the key or tensor (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config, edit_safetensors
from tests.family_models import build_bpe_models
from tests.test_arch_moe import MODELS, VOCAB
from tests.test_arch_phimoe import LONGROPE

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("minimax_phimoe_damaged")
    config_class, model_class, _, fields = MODELS["minimax-m2"]
    models = {"minimax": (config_class, model_class, fields), "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", LONGROPE)}
    return build_bpe_models(root, models, VOCAB)


def _edit_rope(model_dir: Path, **changes) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    edit_config(model_dir, rope_parameters=config["rope_parameters"] | changes)


def _drop_tensors(model_dir: Path, suffix: str) -> None:
    edit_safetensors(model_dir, lambda tensors: [tensors.pop(k) for k in list(tensors) if k.endswith(suffix)])


# (kind, damage, culprit named in the error)
CASES = {
    "minimax-softmax-routing": ("minimax", lambda d: edit_config(d, scoring_func="softmax"), "scoring_func"),
    "minimax-rotary-dim-wider-than-head": ("minimax", lambda d: edit_config(d, rotary_dim=48), "rotary_dim"),
    "minimax-no-selection-bias": ("minimax", lambda d: _drop_tensors(d, "e_score_correction_bias"), "exp_probs_b"),
    "minimax-more-experts-than-stored": ("minimax", lambda d: edit_config(d, num_local_experts=8), "num_local_experts"),
    "phimoe-no-head-bias": ("phimoe", lambda d: _drop_tensors(d, "lm_head.bias"), "output.bias"),
    "phimoe-no-norm-biases": ("phimoe", lambda d: _drop_tensors(d, "layernorm.bias"), "attn_norm.bias"),
    "phimoe-longrope-factors-too-few": ("phimoe", lambda d: _edit_rope(d, short_factor=[1.0, 2.0]), "short_factor"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
