"""DeepSeek / GLM-4.5 configs and checkpoints that do not fit together, or that llama.cpp cannot run
as transformers does: each is refused in one line naming the key or tensor (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config
from tests.family_models import build_bpe_models
from tests.test_arch_deepseek import MODELS, VOCAB

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    return build_bpe_models(tmp_path_factory.mktemp("deepseek_damaged"), {kind: MODELS[kind] for kind in ("v3", "glm")}, VOCAB)


# (kind, damage, culprit named in the error)
CASES = {
    "v3-value-heads-narrower-than-stored": ("v3", lambda d: edit_config(d, v_head_dim=12), "kv_b_proj"),
    "v3-unknown-score-function": ("v3", lambda d: edit_config(d, scoring_func="sqrtsoftplus"), "scoring_func"),
    "v3-attention-biases": ("v3", lambda d: edit_config(d, attention_bias=True), "attention_bias"),
    "v3-groups-not-dividing-experts": ("v3", lambda d: edit_config(d, n_group=3), "n_group"),
    "v3-more-dense-blocks-than-stored": ("v3", lambda d: edit_config(d, first_k_dense_replace=2), "blk.1.ffn_down_exps"),
    "v3-no-shared-experts": ("v3", lambda d: edit_config(d, n_shared_experts=0), "n_shared_experts"),
    "glm-dense-first-block-not-in-config": ("glm", lambda d: edit_config(d, first_k_dense_replace=0), "blk.0.ffn_down"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
