"""Damaged-input catalogue: MXFP4 tensors in a GGUF input to `quantize`. An exponent byte of 0xFF
(NaN in E8M0) makes ggml_validate_row_data reject the tensor, so llama-quantize refuses the file;
ggml's decoding would give 2**127-scaled values, finite for small codes, so the refusal cannot rest
on a NaN/Inf check of the decoded rows. Each entry asserts the contract of tests/damaged_inputs.py
and that llama.cpp refuses the same file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.quantize.mxfp4 import BLOCK_BYTES
from ggufsmith.quantize.presets import get_preset
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.requant_oracle import llama_quantize

ENTRY = "blk.0.attn_q.weight"  # the tensor stored as MXFP4, and damaged


@pytest.fixture(scope="module")
def mxfp4_gguf(tmp_path_factory) -> Path:
    """The example model with ENTRY in MXFP4 and the rest Q8_0: a valid input to requantize."""
    folder = tmp_path_factory.mktemp("mxfp4")
    proc = run_cli("convert", EXAMPLE_MODEL, folder / "f32.gguf", "--outtype", "f32", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("quantize", folder / "f32.gguf", folder / "mxfp4.gguf", "Q8_0", "--tensor-type", "attn_q=mxfp4", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert GGUFReader(folder / "mxfp4.gguf").tensor(ENTRY).ggml_type == GGMLType.MXFP4
    return folder / "mxfp4.gguf"


def with_block(src: Path, dst: Path, block: int, exponent: int, codes: int) -> Path:
    """`src` with block `block` of ENTRY set to one exponent byte and all code bytes `codes`."""
    shutil.copyfile(src, dst)
    at = GGUFReader(src).tensor(ENTRY).offset + block * BLOCK_BYTES
    with dst.open("r+b") as f:
        f.seek(at)
        f.write(bytes([exponent]) + bytes([codes]) * (BLOCK_BYTES - 1))
    return dst


# name -> make the damaged IN.gguf from the valid one, into a folder
DAMAGES: dict[str, Callable[[Path, Path], Path]] = {
    # codes 0 and 1 (0 and 0.5): decoded as 0 and 2**127, both finite
    "exponent_ff_with_finite_values": lambda src, d: with_block(src, d / "in.gguf", 5, 0xFF, 0x10),
    # code 7 (6.0): 12 * 2**127 overflows to Inf
    "exponent_ff_overflowing": lambda src, d: with_block(src, d / "in.gguf", 40, 0xFF, 0x77),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_mxfp4_input_to_quantize(mxfp4_gguf, tmp_path, damage):
    src = DAMAGES[damage](mxfp4_gguf, tmp_path)
    assert llama_quantize(src, tmp_path / "theirs.gguf", get_preset("Q4_0").file_type, allow_requantize=True) != 0
    target = tmp_path / "out" / "model-Q4_0.gguf"
    target.parent.mkdir()
    line = assert_clean_failure(run_cli("quantize", src, target, "Q4_0", "--allow-requantize"), ENTRY, target)
    assert str(src) in line


def test_the_undamaged_mxfp4_input_requantizes_like_llama_cpp(mxfp4_gguf, tmp_path):
    # The entries above fail for their damage; the same block with a valid exponent does not.
    src = with_block(mxfp4_gguf, tmp_path / "in.gguf", 5, 0x7F, 0x10)
    assert llama_quantize(src, tmp_path / "theirs.gguf", get_preset("Q4_0").file_type, allow_requantize=True) == 0
    proc = run_cli("quantize", src, tmp_path / "ours.gguf", "Q4_0", "--allow-requantize", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()
    assert np.isfinite(GGUFReader(tmp_path / "ours.gguf").tensor(ENTRY).to_float32()).all()
