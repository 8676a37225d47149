"""Gemma configs llama.cpp cannot run as transformers does, and broken multimodal checkpoints: each
is refused in one line naming the key or tensor (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config, edit_json, edit_safetensors, run_cli
from tests.gemma_models import MULTIMODAL, MULTIMODAL_GEMMA4, build_model
from tests.tokenizer_helpers import train_sentencepiece

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma_damaged")
    dirs = {}
    for kind in ("gemma", "gemma2", "gemma3", MULTIMODAL, "gemma4", "gemma4-e", "gemma4-moe", MULTIMODAL_GEMMA4):
        train_sentencepiece(root / kind)
        dirs[kind] = build_model(kind, root / kind)
    return dirs


def _edit_config(model_dir: Path, section: str | None = None, **changes) -> None:
    """config.json with `changes` merged into it, or into its `section` object (text_config)."""
    if section is None:
        edit_config(model_dir, **changes)
    else:
        edit_json(model_dir / "config.json", lambda config: config | {section: config[section] | changes})


def _add_tensor(model_dir: Path, name: str) -> None:
    import numpy as np

    edit_safetensors(model_dir, lambda tensors: tensors.update({name: np.zeros((4, 4), np.float32)}))


# (kind, damage, culprit named in the error)
CASES = {
    "gemma-relu-activation": ("gemma", lambda d: _edit_config(d, hidden_act="relu"), "hidden_act"),
    "gemma2-attention-scalar-not-head-dim": ("gemma2", lambda d: _edit_config(d, query_pre_attn_scalar=256), "query_pre_attn_scalar"),
    "gemma2-no-attention-softcap": ("gemma2", lambda d: _edit_config(d, attn_logit_softcapping=None), "attn_logit_softcapping"),
    "gemma2-no-final-softcap": ("gemma2", lambda d: _edit_config(d, final_logit_softcapping=None), "final_logit_softcapping"),
    "gemma2-untied-output-head": ("gemma2", lambda d: _edit_config(d, tie_word_embeddings=False), "tie_word_embeddings"),
    "gemma2-rope-scaling": ("gemma2", lambda d: _edit_config(d, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}), "rope"),
    "gemma3-attention-softcap": ("gemma3", lambda d: _edit_config(d, attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    "gemma3-bidirectional": ("gemma3", lambda d: _edit_config(d, use_bidirectional_attention=True), "use_bidirectional_attention"),
    "gemma3-yarn-global-rope": ("gemma3", lambda d: _edit_config(d, rope_parameters={
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000.0, "original_max_position_embeddings": 64},
        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}), "yarn"),
    "gemma3-scaled-local-rope": ("gemma3", lambda d: _edit_config(d, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50.0}}), "sliding-attention"),
    "gemma3-layer-types-short": ("gemma3", lambda d: _edit_config(d, layer_types=["full_attention"]), "layer_types"),
    "gemma3-vision-text-config-not-object": (MULTIMODAL, lambda d: _edit_config(d, text_config=[1, 2]), "text_config"),
    "gemma3-vision-text-heads-wrong": (MULTIMODAL, lambda d: _edit_config(d, "text_config", num_key_value_heads=4),
                                       "language_model.model.layers.0.self_attn.k_proj.weight"),
    "gemma3-vision-unknown-part": (MULTIMODAL, lambda d: _add_tensor(d, "audio_tower.layer.weight"), "audio_tower.layer.weight"),
    "gemma4-moe-more-experts-used-than-exist": ("gemma4-moe", lambda d: _edit_config(d, top_k_experts=5), "top_k_experts"),
    "gemma4-moe-without-expert-count": ("gemma4-moe", lambda d: _edit_config(d, num_experts=None), "num_experts"),
    "gemma4-bidirectional-all": ("gemma4", lambda d: _edit_config(d, use_bidirectional_attention="all"), "use_bidirectional_attention"),
    "gemma4-full-layers-of-two-head-sizes": ("gemma4", lambda d: _edit_config(d, per_layer_config={
        "1": {"head_dim": 32, "num_key_value_heads": 1}, "3": {"head_dim": 16, "num_key_value_heads": 1}}), "head sizes"),
    "gemma4-scaled-proportional-rope": ("gemma4", lambda d: _edit_config(d, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000.0, "factor": 8.0}}),
        "scaling factor"),
    "gemma4-kv-sharing-layout": ("gemma4-e", lambda d: _edit_config(d, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        per_layer_config={"1": {"head_dim": 32}, "4": {"head_dim": 32}}), "num_kv_shared_layers"),
    "gemma4-per-layer-vocabulary-smaller": ("gemma4-e", lambda d: _edit_config(d, vocab_size_per_layer_input=600),
                                            "vocab_size_per_layer_input"),
    "gemma4-vision-unknown-part": (MULTIMODAL_GEMMA4, lambda d: _add_tensor(d, "model.audio_projector.weight"),
                                   "model.audio_projector.weight"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)


def test_cli_names_the_left_out_encoders_once(originals, tmp_path):
    """Not damage: the notice a multimodal checkpoint gets, as a user sees it."""
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", originals[MULTIMODAL], target, "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "left out" in line]
    assert len(notices) == 1, proc.stderr
    assert "the vision tower (32 tensors vision_tower.*)" in notices[0], notices[0]
    assert "the multimodal projector (2 tensors multi_modal_projector.*)" in notices[0], notices[0]
    assert target.is_file()
