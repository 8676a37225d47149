"""Damaged-input catalogue: pre-quantized integer checkpoints (GPTQ, AWQ) whose packed tensors or
quantization_config do not fit together. Made from the example model with the tests' packers
(tests/prequantized_checkpoints.py, numpy only); each entry asserts the contract of
tests/damaged_inputs.py: one line naming the tensor or key, nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.prequantized_checkpoints import awq_tensors, gptq_tensors, write_packed_checkpoint

MODULE = "model.layers.0.self_attn.q_proj"
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
               "checkpoint_format": "gptq"}
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """"gptq" and "awq" copies of the example model, which convert."""
    root = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(0)
    write_packed_checkpoint(EXAMPLE_MODEL, root / "gptq", GPTQ_CONFIG,
                            lambda w: gptq_tensors(w, 4, True, False, "gptq", rng))
    write_packed_checkpoint(EXAMPLE_MODEL, root / "awq", AWQ_CONFIG, awq_tensors)
    for name in ("gptq", "awq"):
        proc = run_cli("convert", root / name, root / f"{name}.gguf", "--outtype", "f32", "--quiet")
        assert proc.returncode == 0, proc.stderr
    return {"gptq": root / "gptq", "awq": root / "awq"}


def edit_tensors(folder: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] |= changes
    (folder / "config.json").write_text(json.dumps(config))


def _drop_quantization_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))


def _set(tensors: dict[str, np.ndarray], name: str, value: np.ndarray) -> None:
    tensors[name] = value


# name -> (source "gptq" | "awq", damage the copied folder, what the error line must name)
DAMAGES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "gptq_missing_scales": ("gptq", lambda d: edit_tensors(d, lambda t: t.pop(f"{MODULE}.scales")),
                            f"{MODULE}.scales"),
    "gptq_zeros_without_qweight": ("gptq", lambda d: edit_tensors(d, lambda t: t.pop(f"{MODULE}.qweight")),
                                   f"{MODULE}.qweight"),
    "gptq_bits_in_config_not_the_packed_ones": ("gptq", lambda d: edit_config(d, bits=8), "qweight: shape"),
    "gptq_bits_without_a_packing": ("gptq", lambda d: edit_config(d, bits=5), "bits"),
    "gptq_kernel_layout": ("gptq", lambda d: edit_config(d, checkpoint_format="marlin"), "checkpoint_format"),
    "gptq_scales_of_another_shape": ("gptq", lambda d: edit_tensors(
        d, lambda t: _set(t, f"{MODULE}.scales", t[f"{MODULE}.scales"][:-1])), f"{MODULE}.scales"),
    "gptq_group_index_out_of_range": ("gptq", lambda d: edit_tensors(
        d, lambda t: _set(t, f"{MODULE}.g_idx", t[f"{MODULE}.g_idx"] + 7)), f"{MODULE}.g_idx"),
    "gptq_qweight_stored_as_float": ("gptq", lambda d: edit_tensors(
        d, lambda t: _set(t, f"{MODULE}.qweight", t[f"{MODULE}.qweight"].astype(np.float32))), f"{MODULE}.qweight"),
    "gptq_without_quantization_config": ("gptq", lambda d: _drop_quantization_config(d), ".qweight holds packed"),
    "awq_missing_zeros": ("awq", lambda d: edit_tensors(d, lambda t: t.pop(f"{MODULE}.qzeros")), f"{MODULE}.qzeros"),
    "awq_gemv_layout": ("awq", lambda d: edit_config(d, version="gemv"), "version"),
    "awq_zeros_of_another_shape": ("awq", lambda d: edit_tensors(
        d, lambda t: _set(t, f"{MODULE}.qzeros", t[f"{MODULE}.qzeros"][:, :-1].copy())), f"{MODULE}.qzeros"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_prequantized_checkpoint(packed, tmp_path, damage):
    import shutil

    source, apply, culprit = DAMAGES[damage]
    folder = tmp_path / "model"
    shutil.copytree(packed[source], folder)
    apply(folder)
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", folder, target, "--outtype", "f32")
    assert_clean_failure(proc, culprit, target)
