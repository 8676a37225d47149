"""ModernBERT and EmbeddingGemma folders llama.cpp cannot run as transformers and sentence-transformers
do, and broken Dense modules: each is refused in one line naming the file or key (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_config, edit_json
from tests.embedding_models import build_embeddinggemma, build_modernbert, write_dense

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding_damaged")
    return {"modern-bert": build_modernbert(root / "modern-bert"), "gemma": build_embeddinggemma(root / "gemma")}


def _config(**changes):
    return lambda model_dir: edit_config(model_dir, **changes)


def _dense_config(folder: str, **changes):
    return lambda model_dir: edit_json(model_dir / folder / "config.json", **changes)


def _drop_module(path: str):
    return lambda model_dir: edit_json(model_dir / "modules.json", lambda m: [e for e in m if e["path"] != path])


# (folder, damage, culprit named in the error)
CASES = {
    "modernbert-norm-bias": ("modern-bert", _config(norm_bias=True), "norm_bias"),
    "modernbert-attention-bias": ("modern-bert", _config(attention_bias=True), "attention_bias"),
    "modernbert-relu-glu": ("modern-bert", _config(hidden_activation="relu"), "hidden_activation"),
    "modernbert-scaled-rope": ("modern-bert", _config(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}), "rope scaling 'linear'"),
    "modernbert-layer-types-too-short": ("modern-bert", _config(layer_types=["full_attention"]), "layer_types"),
    "modernbert-dense-module": ("modern-bert", lambda d: edit_json(d / "modules.json", lambda m: m + [
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]), "Dense"),
    "gemma-causal": ("gemma", _config(use_bidirectional_attention=False), "use_bidirectional_attention"),
    "gemma-one-dense-module": ("gemma", _drop_module("3_Dense"), "Dense modules"),
    "gemma-dense-with-bias": ("gemma", lambda d: write_dense(d / "3_Dense", torch.zeros(64, 128), bias=torch.zeros(64)),
                              "3_Dense"),
    "gemma-dense-with-activation": ("gemma", _dense_config("2_Dense", activation_function="torch.nn.modules.activation.Tanh"),
                                    "torch.nn.modules.activation.Tanh"),
    "gemma-dense-not-from-hidden-size": ("gemma", lambda d: (write_dense(d / "2_Dense", torch.zeros(128, 32)),
                                                             write_dense(d / "3_Dense", torch.zeros(64, 128))),
                                         "Dense modules"),
    "gemma-dense-weight-not-its-config": ("gemma", _dense_config("2_Dense", out_features=96), "linear.weight"),
    "gemma-dense-bias-promised-not-stored": ("gemma", _dense_config("3_Dense", bias=True), "bias is True"),
    "gemma-dense-features-not-a-number": ("gemma", _dense_config("2_Dense", in_features="64"), "in_features"),
    "gemma-dense-weights-missing": ("gemma", lambda d: (d / "2_Dense" / "model.safetensors").unlink(), "2_Dense"),
    "gemma-dense-config-missing": ("gemma", lambda d: (d / "3_Dense" / "config.json").unlink(), "3_Dense/config.json"),
    "gemma-dense-weights-truncated": ("gemma", lambda d: (d / "2_Dense" / "model.safetensors").write_bytes(
        (d / "2_Dense" / "model.safetensors").read_bytes()[:200]), "2_Dense/model.safetensors"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
