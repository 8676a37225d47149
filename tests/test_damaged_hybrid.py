"""Qwen3-Next / Qwen3.5 configs llama.cpp cannot run as transformers does, and checkpoints that do not
match their layer pattern: each is refused in one line naming the key or tensor (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config
from tests.family_models import build_bpe_models
from tests.test_arch_hybrid import MODELS, VOCAB

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    return build_bpe_models(tmp_path_factory.mktemp("hybrid_damaged"), {kind: MODELS[kind] for kind in ("qwen3next", "qwen35")}, VOCAB)


LINEAR, FULL = "linear_attention", "full_attention"
# (kind, damage, culprit named in the error)
CASES = {
    "layer-types-short": ("qwen35", lambda d: edit_config(d, layer_types=[LINEAR, FULL]), "layer_types"),
    "layer-type-unknown": ("qwen35", lambda d: edit_config(d, layer_types=[LINEAR, "sliding_attention", LINEAR, LINEAR]),
                           "layer_types"),
    # the checkpoint's block 1 holds attention; a pattern calling it a delta-net block
    "layer-pattern-not-the-checkpoints": ("qwen35", lambda d: edit_config(d, layer_types=[LINEAR, LINEAR, FULL, LINEAR]),
                                          "model.layers.1.self_attn"),
    "key-and-value-heads-of-different-widths": ("qwen35", lambda d: edit_config(d, linear_value_head_dim=32),
                                                "linear_key_head_dim"),
    "value-heads-not-a-multiple-of-key-heads": ("qwen35", lambda d: edit_config(d, linear_num_key_heads=3),
                                                "linear_num_value_heads"),
    "mrope-sections-wider-than-the-rotary-part": ("qwen35", lambda d: edit_config(d, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}),
        "mrope_section"),
    "qwen3next-routing-not-renormalized": ("qwen3next", lambda d: edit_config(d, norm_topk_prob=False), "norm_topk_prob"),
    "qwen3next-dense-blocks": ("qwen3next", lambda d: edit_config(d, mlp_only_layers=[0]), "mlp_only_layers"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
