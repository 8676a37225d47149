"""What reaches the terminal around an error: nothing but the error line. Warnings of numpy or torch
(Python's warnings module) are shown only with --verbose; ggufsmith's own warnings are printed when
the command succeeds (--quiet or not) and dropped when it fails; --quiet prints nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, copy_example, leftovers, run_cli


def _edit_weights(model: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(model / "model.safetensors")
    edit(state)
    save_file(state, model / "model.safetensors", metadata={"format": "pt"})


def _beyond_float32(state) -> None:
    """Layer 0's up_proj in float64 with a row float32 cannot hold: numpy warns on the cast, and
    the row becomes Inf, which Q8_0 refuses."""
    import torch

    up = state["model.layers.0.mlp.up_proj.weight"].to(torch.float64)
    up[0, :] = 1e300
    state["model.layers.0.mlp.up_proj.weight"] = up


def _dynamic_rope(model: Path) -> None:
    """A config that makes ggufsmith warn (llama.cpp has no dynamic NTK rope scaling)."""
    config = json.loads((model / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    (model / "config.json").write_text(json.dumps(config))


@pytest.fixture()
def overflowing_model(tmp_path) -> Path:
    model = copy_example(tmp_path)
    _edit_weights(model, _beyond_float32)
    return model


def test_a_numpy_warning_adds_no_line_to_the_error(overflowing_model, tmp_path):
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", overflowing_model, out, "--outtype", "q8_0")
    assert_clean_failure(proc, "blk.0.ffn_up.weight", out)


def test_verbose_shows_the_numpy_warning(overflowing_model, tmp_path):
    proc = run_cli("convert", overflowing_model, tmp_path / "out.gguf", "--outtype", "q8_0", "--verbose")
    assert proc.returncode == 1
    assert "RuntimeWarning: overflow encountered in cast" in proc.stderr
    assert "ggufsmith: error: tensor blk.0.ffn_up.weight" in proc.stderr


def test_own_warnings_are_printed_on_success_and_dropped_on_error(tmp_path):
    model = copy_example(tmp_path)
    _dynamic_rope(model)
    proc = run_cli("convert", model, tmp_path / "ok.gguf", "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("ggufsmith: warning:")]
    assert len(warnings) == 1 and "dynamic NTK" in warnings[0] and "config.json" in warnings[0]
    quiet = run_cli("convert", model, tmp_path / "quiet.gguf", "--outtype", "f16", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr.splitlines() == warnings and quiet.stdout == ""

    _edit_weights(model, _beyond_float32)
    out = tmp_path / "failed.gguf"
    assert_clean_failure(run_cli("convert", model, out, "--outtype", "q8_0"), "blk.0.ffn_up.weight", out)


def test_quiet_silences_fallback_notes(tmp_path):
    """q4_k_m on the example: every 128-wide row falls back (a note each) unless --quiet."""
    loud = run_cli("convert", EXAMPLE_MODEL, tmp_path / "loud.gguf", "--outtype", "q4_k_m")
    assert loud.returncode == 0, loud.stderr
    assert "fallback to Q5_0" in loud.stderr
    quiet = run_cli("convert", EXAMPLE_MODEL, tmp_path / "quiet.gguf", "--outtype", "q4_k_m", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    assert (tmp_path / "loud.gguf").read_bytes() == (tmp_path / "quiet.gguf").read_bytes()
    assert leftovers(tmp_path) == []


def test_quantize_quiet_prints_nothing(tmp_path):
    f16 = tmp_path / "f16.gguf"
    assert run_cli("convert", EXAMPLE_MODEL, f16, "--outtype", "f16", "--quiet").returncode == 0
    quiet = run_cli("quantize", f16, tmp_path / "q.gguf", "Q4_K_M", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
