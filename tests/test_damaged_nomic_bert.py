"""Nomic BERT folders llama.cpp cannot run as nomic's code / transformers do, or whose weights do not
fit their config: each is refused in one line naming the key or tensor (contract:
tests/damaged_inputs.py). And the experts' output bias llama.cpp has no term for: one warning."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.bert_models import train_wordpiece, train_xlmr_unigram
from tests.damaged_inputs import assert_convert_refused, edit_config, edit_json, edit_safetensors, run_cli

pytest.importorskip("transformers")
pytest.importorskip("torch")

from tests.nomic_models import build_nomic_dense, build_nomic_moe  # noqa: E402 (needs torch)


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nomic_damaged")
    train_wordpiece(root / "hf", lowercase=True, vocab_size=300)
    build_nomic_dense(root / "hf", root / "nomic")
    train_xlmr_unigram(root / "moe", vocab_size=400)
    build_nomic_moe(root / "moe")
    return {kind: root / kind for kind in ("hf", "nomic", "moe")}


def _config(**changes):
    return lambda model_dir: edit_config(model_dir, **changes)


def _without(key: str):
    return lambda model_dir: edit_json(model_dir / "config.json", lambda config: {k: v for k, v in config.items()
                                                                                 if k != key})


# (folder, damage, culprit named in the error)
CASES = {
    "swiglu-with-mlp-bias": ("nomic", _config(mlp_fc1_bias=True), "mlp_fc1_bias"),
    "prenorm-blocks": ("nomic", _config(prenorm=True), "prenorm"),
    "causal-attention": ("nomic", _config(causal=True), "causal"),
    "partial-rotary": ("nomic", _config(rotary_emb_fraction=0.5), "rotary_emb_fraction"),
    "interleaved-rotary": ("nomic", _config(rotary_emb_interleaved=True), "rotary_emb_interleaved"),
    "xpos-rotary": ("nomic", _config(rotary_emb_scale_base=512), "rotary_emb_scale_base"),
    "gelu-in-the-dense-model": ("nomic", _config(activation_function="gelu"), "activation_function"),
    "relu-in-transformers-config": ("hf", _config(hidden_act="relu"), "hidden_act"),
    "yarn-rope": ("hf", _config(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0}),
                  "rope_type"),
    "head-dim-not-hidden-over-heads": ("hf", _config(head_dim=32), "head_dim"),
    "more-layers-than-the-checkpoint": ("nomic", _config(n_layer=4), "blk.3"),
    "swiglu-in-the-moe-model": ("moe", _config(activation_function="swiglu"), "activation_function"),
    "experts-that-do-not-divide-the-rows": ("moe", _config(num_experts=3), "num_experts = 3"),
    "more-experts-used-than-there-are": ("moe", _config(moe_top_k=5), "moe_top_k"),
    "no-experts-used-count": ("moe", _without("moe_top_k"), "moe_top_k"),
    "experts-in-a-dense-layer": ("moe", _config(moe_every_n_layers=3), "encoder.layers.3.mlp"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)


def test_a_nonzero_experts_bias_is_told(originals, tmp_path):
    """llama.cpp's nomic-bert-moe graph has no term for it: converted, with one warning saying so."""
    model_dir = tmp_path / "moe"
    shutil.copytree(originals["moe"], model_dir)
    edit_safetensors(model_dir, lambda tensors: tensors["encoder.layers.1.mlp.experts.bias"].fill(0.25))
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", model_dir, target, "--outtype", "f32", "--quiet")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("ggufsmith: warning:")]
    assert len(warnings) == 1 and "mlp.experts.bias" in warnings[0] and "0.25" in warnings[0], proc.stderr
    assert target.is_file()
