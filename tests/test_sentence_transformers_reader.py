"""modules.json + the Pooling config.json -> llama.cpp's pooling type, in each spelling
sentence-transformers has written (its per-mode flags, and the newer single "pooling_mode")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.constants import PoolingType
from ggufsmith.readers.sentence_transformers import read_sentence_transformers


def _folder(tmp_path: Path, pooling: dict | None, extra: tuple[str, ...] = ()) -> Path:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    if pooling is not None:
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **pooling}))
    for kind in extra:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_{kind}",
                        "type": f"sentence_transformers.models.{kind}"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    return tmp_path


@pytest.mark.parametrize(("pooling", "expected"), [
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, PoolingType.MEAN),
    ({"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}, PoolingType.CLS),
    ({"pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True}, PoolingType.LAST),
    ({"pooling_mode": "mean"}, PoolingType.MEAN),
    ({"pooling_mode": "cls"}, PoolingType.CLS),
    ({"pooling_mode": "lasttoken"}, PoolingType.LAST),
])
def test_pooling_mode(tmp_path, pooling, expected):
    folder = read_sentence_transformers(_folder(tmp_path, pooling, ("Normalize",)))
    assert folder.pooling == expected
    assert folder.unsupported_modules() == []


def test_not_a_sentence_transformers_folder(tmp_path):
    assert read_sentence_transformers(tmp_path) is None


def test_without_pooling_module_and_with_a_dense_one(tmp_path):
    folder = read_sentence_transformers(_folder(tmp_path, None, ("Dense",)))
    assert folder.pooling is None
    assert folder.unsupported_modules() == ["Dense"]


@pytest.mark.parametrize("weights_file", ["model.safetensors", "pytorch_model.bin"])
def test_dense_modules_in_order_with_their_weights(tmp_path, weights_file):
    """EmbeddingGemma's 2_Dense and 3_Dense, from either weights file sentence-transformers has saved."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder = _folder(tmp_path, {"pooling_mode_mean_tokens": True}, ("Dense", "Dense", "Normalize"))
    weights = [torch.randn(8, 4), torch.randn(4, 8)]
    for index, weight in zip((2, 3), weights):
        module = folder / f"{index}_Dense"
        module.mkdir()
        (module / "config.json").write_text(json.dumps({"in_features": weight.shape[1], "out_features": weight.shape[0],
                                                        "bias": False}))
        if weights_file == "model.safetensors":
            save_file({"linear.weight": weight}, module / weights_file)
        else:
            torch.save({"linear.weight": weight}, module / weights_file)
    dense = read_sentence_transformers(folder).dense_modules()
    assert [(d.folder.name, d.in_features, d.out_features, d.bias) for d in dense] == [("2_Dense", 4, 8, None),
                                                                                       ("3_Dense", 8, 4, None)]
    assert all(d.activation.endswith("Identity") for d in dense)  # sentence-transformers' default
    for d, weight in zip(dense, weights):
        assert (d.weight.load() == weight.numpy()).all()
