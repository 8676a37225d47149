"""gpt-oss configs llama.cpp cannot run as transformers does, and MXFP4 checkpoints whose blocks and
scales do not fit together: each is refused in one line naming the key or tensor (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config, edit_safetensors
from tests.tokenizer_helpers import train_bpe

pytest.importorskip("transformers")
pytest.importorskip("torch")

BLOCKS = "model.layers.1.mlp.experts.down_proj_blocks"
SCALES = "model.layers.1.mlp.experts.down_proj_scales"


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    from tests.test_arch_gptoss import VOCAB, build_gptoss, save_mxfp4_checkpoint

    root = tmp_path_factory.mktemp("gptoss_damaged")
    train_bpe(root / "float", "qwen2", vocab_size=VOCAB)
    build_gptoss(root / "float")
    return {"float": root / "float", "mxfp4": save_mxfp4_checkpoint(root / "float", root / "mxfp4")}


# (checkpoint, damage, culprit named in the error)
CASES = {
    "another-swiglu-limit": ("float", lambda d: edit_config(d, swiglu_limit=5.0), "swiglu_limit"),
    "another-swiglu-alpha": ("float", lambda d: edit_config(d, swiglu_alpha=1.0), "swiglu_alpha"),
    "layer-types-too-short": ("float", lambda d: edit_config(d, layer_types=["sliding_attention"]), "layer_types"),
    "mxfp4-scales-missing": ("mxfp4", lambda d: edit_safetensors(d, lambda t: t.pop(SCALES)), BLOCKS),
    "mxfp4-scales-of-another-shape": ("mxfp4", lambda d: edit_safetensors(d, lambda t: t.update({SCALES: t[SCALES][:, :-1]})),
                                      SCALES),
    "mxfp4-blocks-not-bytes": ("mxfp4", lambda d: edit_safetensors(d, lambda t: t.update({BLOCKS: t[BLOCKS].astype(np.float32)})),
                               BLOCKS),
    "mxfp4-blocks-of-other-width": ("mxfp4", lambda d: edit_safetensors(d, lambda t: t.update({BLOCKS: t[BLOCKS][..., :8].copy()})),
                                    BLOCKS),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
