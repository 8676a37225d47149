"""Damaged-input catalogue: pre-quantized integer checkpoints (GPTQ, AWQ) whose packed tensors or
quantization_config do not fit together. Made from the example model with the tests' packers
(tests/prequantized_checkpoints.py, numpy only); each entry asserts the contract of
tests/damaged_inputs.py: one line naming the tensor or key, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_convert_refused, edit_json, edit_safetensors, run_cli
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


def edit_quantization(folder: Path, **changes) -> None:
    """config.json's quantization_config with `changes` merged in (none: the key removed)."""
    def edit(config: dict) -> dict:
        quantization = config.pop("quantization_config")
        return config | ({"quantization_config": quantization | changes} if changes else {})
    edit_json(folder / "config.json", edit)


def edit_tensor(folder: Path, name: str, change: Callable[[np.ndarray], np.ndarray | None]) -> None:
    """Tensor `name` replaced by change(it), or removed when that gives None."""
    def edit(tensors: dict[str, np.ndarray]) -> None:
        value = change(tensors.pop(name))
        if value is not None:
            tensors[name] = value
    edit_safetensors(folder, edit)


# name -> (source "gptq" | "awq", damage the copied folder, what the error line must name)
DAMAGES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "gptq_missing_scales": ("gptq", lambda d: edit_tensor(d, f"{MODULE}.scales", lambda t: None), f"{MODULE}.scales"),
    "gptq_zeros_without_qweight": ("gptq", lambda d: edit_tensor(d, f"{MODULE}.qweight", lambda t: None),
                                   f"{MODULE}.qweight"),
    "gptq_bits_in_config_not_the_packed_ones": ("gptq", lambda d: edit_quantization(d, bits=8), "qweight: shape"),
    "gptq_bits_without_a_packing": ("gptq", lambda d: edit_quantization(d, bits=5), "bits"),
    "gptq_kernel_layout": ("gptq", lambda d: edit_quantization(d, checkpoint_format="marlin"), "checkpoint_format"),
    "gptq_without_quantization_config": ("gptq", lambda d: edit_quantization(d), ".qweight holds packed"),
    "gptq_scales_of_another_shape": ("gptq", lambda d: edit_tensor(d, f"{MODULE}.scales", lambda t: t[:-1]),
                                     f"{MODULE}.scales"),
    "gptq_group_index_out_of_range": ("gptq", lambda d: edit_tensor(d, f"{MODULE}.g_idx", lambda t: t + 7),
                                      f"{MODULE}.g_idx"),
    "gptq_qweight_stored_as_float": ("gptq", lambda d: edit_tensor(d, f"{MODULE}.qweight",
                                                                  lambda t: t.astype(np.float32)), f"{MODULE}.qweight"),
    "awq_missing_zeros": ("awq", lambda d: edit_tensor(d, f"{MODULE}.qzeros", lambda t: None), f"{MODULE}.qzeros"),
    "awq_gemv_layout": ("awq", lambda d: edit_quantization(d, version="gemv"), "version"),
    "awq_zeros_of_another_shape": ("awq", lambda d: edit_tensor(d, f"{MODULE}.qzeros", lambda t: t[:, :-1].copy()),
                                   f"{MODULE}.qzeros"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_prequantized_checkpoint(packed, tmp_path, damage):
    source, apply, culprit = DAMAGES[damage]
    assert_convert_refused(packed[source], tmp_path, apply, culprit)
