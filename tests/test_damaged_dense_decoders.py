"""Damaged-input catalogue, the dense decoders of issue 12 part 2 (phi3, exaone4, apertus): config
variants llama.cpp cannot run and checkpoints the plugins cannot read, each refused in one line
before anything is written (contract: tests/damaged_inputs.py).

Each damage is done to a tiny random model of the family (transformers, 2 blocks, hidden 64) with
the example model's tokenizer; the last test converts the undamaged models, so the refusals are
known to come from the damage.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (a test dependency, with torch)

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=2000, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(max_position_embeddings=1024, original_max_position_embeddings=256,
                  rope_parameters=dict(rope_type="longrope", rope_theta=1e4, long_factor=[2.0] * 8, short_factor=[1.0] * 8))),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(sliding_window=None, layer_types=["full_attention"] * 2)),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {}),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dense-families")
    out = {}
    for family, (config_class, model_class, fields) in FAMILIES.items():
        folder = root / family
        config = getattr(transformers, config_class)(**(SMALL | fields))
        torch.manual_seed(0)
        getattr(transformers, model_class)(config).save_pretrained(folder)
        for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(EXAMPLE_MODEL / name, folder / name)
        out[family] = folder
    return out


def _config(**changes) -> Callable[[Path], None]:
    def edit(model: Path) -> None:
        path = model / "config.json"
        config = json.loads(path.read_text())
        for key, value in changes.items():
            if callable(value):
                value(config)
            else:
                config[key] = value
        path.write_text(json.dumps(config))
    return edit


def _weights(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        tensors = load_file(model / "model.safetensors")
        edit(tensors)
        save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    return apply


def _short_long_factor(config: dict) -> None:
    config["rope_parameters"]["long_factor"] = config["rope_parameters"]["long_factor"][:-1]


# name -> (family, damage, what the error line must name)
CATALOGUE: dict[str, tuple[str, Callable[[Path], None], list[str]]] = {
    "phi3 LongRoPE long_factor one short": ("phi3", _config(rope_parameters=_short_long_factor),
                                            ["long_factor", "8 numbers"]),
    "exaone4 sliding window below 64 blocks": ("exaone4", _config(sliding_window=8), ["sliding_window", "64 blocks"]),
    "apertus activation that is not xIELU": ("apertus", _config(hidden_act="silu"), ["hidden_act", "silu"]),
    "apertus xIELU parameter of a block missing": ("apertus", _weights(lambda t: t.pop("model.layers.1.mlp.act_fn.beta")),
                                                   ["model.layers.1.mlp.act_fn.beta"]),
    "apertus xIELU parameter that is not one number": (
        "apertus", _weights(lambda t: t.__setitem__("model.layers.0.mlp.act_fn.alpha_p", torch.ones(2))),
        ["model.layers.0.mlp.act_fn.alpha_p", "single number"]),
}


@pytest.mark.parametrize("damage", list(CATALOGUE))
def test_damaged_dense_decoder_fails_before_writing(families, tmp_path, damage):
    family, apply, culprits = CATALOGUE[damage]
    model = shutil.copytree(families[family], tmp_path / family)
    apply(model)
    target = tmp_path / "out.gguf"
    line = assert_clean_failure(run_cli("convert", model, target, "--outtype", "f32"), culprits[0], target)
    for culprit in culprits[1:]:
        assert culprit in line, f"{culprit!r} not named in: {line}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_undamaged_models_convert(families, tmp_path, family):
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", families[family], target, "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    assert target.stat().st_size > 100_000
