"""Damaged-input catalogue: GGUF inputs to `quantize`, importance matrices given to `quantize
--imatrix` and `convert --imatrix`, and hostile files given to `inspect`. Each entry breaks one
thing and asserts the contract of tests/damaged_inputs.py: non-zero exit, one line naming the file
and the entry or tensor, no traceback, nothing written, no temporary file left."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import GGMLType, GGUFValueType
from ggufsmith.gguf_writer import GGUFWriter, Metadata, MetadataValue
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.quantize.imatrix import write_imatrix
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.hostile_gguf import nested_arrays

ENTRY = "blk.0.attn_q.weight"  # the weight whose importance-matrix entry the damages break


@pytest.fixture(scope="module")
def model_gguf(tmp_path_factory) -> Path:
    """The example model converted to F32: the valid GGUF input every damage starts from."""
    path = tmp_path_factory.mktemp("model") / "tiny-f32.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, path, "--outtype", "f32", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def row_lengths(model_gguf) -> dict[str, int]:
    """The row length of each 2-D weight: the size of its importance-matrix entry."""
    return {t.name: t.shape[-1] for t in GGUFReader(model_gguf).tensors if len(t.shape) == 2}


def copy_model(src: Path, dst: Path, *, keys: dict[str, MetadataValue] | None = None,
               retype: dict[str, GGMLType] | None = None, byteorder: str = "little", nan_in: str | None = None) -> Path:
    """GGUF file `src` rewritten with metadata `keys` replaced or added (as given, unchecked), the
    tensors of `retype` declared with another type (their bytes cut or repeated to fit), in another
    byte order, or with a NaN in tensor `nan_in`."""
    keys, retype = keys or {}, retype or {}
    reader = GGUFReader(src)
    md = Metadata()
    for key, value in reader.metadata.items():
        md.add_read_value(key, keys.get(key, value))
    for key in keys.keys() - set(reader.metadata):
        md.add_read_value(key, keys[key])
    with GGUFWriter(dst, md, byteorder=byteorder) as writer:
        infos = [writer.add_tensor(t.name, t.shape, retype.get(t.name, t.ggml_type)) for t in reader.tensors]
        for t, info in zip(reader.tensors, infos):
            data = np.array(t.data)
            if t.name == nan_in:
                data.view("<f4")[3] = np.nan
            writer.write_tensor(t.name, np.resize(data, info.nbytes))
    return dst


def flip_tensor_type(src: Path, dst: Path) -> Path:
    """`src` with the type of its first tensor info set to 200, an id no ggml type has."""
    first = GGUFReader(src).tensors[0]
    type_at = first.info_offset + 8 + len(first.name) + 4 + 8 * len(first.shape)
    data = bytearray(src.read_bytes())
    data[type_at : type_at + 4] = struct.pack("<I", 200)
    dst.write_bytes(bytes(data))
    return dst


def u32(value) -> MetadataValue:
    return MetadataValue(value, GGUFValueType.UINT32)


def text(value) -> MetadataValue:
    return MetadataValue(value, GGUFValueType.STRING)


# name -> (make the damaged IN.gguf from the valid one in a folder, what the error must name)
GGUF_DAMAGES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "truncated": (lambda src, d: _write(d / "in.gguf", src.read_bytes()[: src.stat().st_size // 2]), "in.gguf"),
    "truncated_in_header": (lambda src, d: _write(d / "in.gguf", src.read_bytes()[:20]), "in.gguf"),
    "not_gguf_at_all": (lambda src, d: _write(d / "in.gguf", (EXAMPLE_MODEL / "model.safetensors").read_bytes()[:4096]), "in.gguf"),
    "unknown_tensor_type_id": (lambda src, d: flip_tensor_type(src, d / "in.gguf"), "unknown tensor type 200"),
    "tensor_type_we_cannot_decode": (
        lambda src, d: copy_model(src, d / "in.gguf", retype={ENTRY: GGMLType.IQ4_NL}), ENTRY),
    "big_endian": (lambda src, d: copy_model(src, d / "in.gguf", byteorder="big"), "big-endian"),
    "architecture_not_a_string": (
        lambda src, d: copy_model(src, d / "in.gguf", keys={"general.architecture": u32(7)}), "general.architecture"),
    "block_count_a_string": (
        lambda src, d: copy_model(src, d / "in.gguf", keys={"llama.block_count": text("four")}), "llama.block_count"),
    "head_count_kv_a_string": (
        lambda src, d: copy_model(src, d / "in.gguf", keys={"llama.attention.head_count_kv": text("2")}),
        "llama.attention.head_count_kv"),
    "file_type_a_string": (
        lambda src, d: copy_model(src, d / "in.gguf", keys={"general.file_type": text("F32")}), "general.file_type"),
    "split_count_a_string": (
        lambda src, d: copy_model(src, d / "in.gguf", keys={"split.count": text("2")}), "split.count"),
    "nan_in_a_weight": (lambda src, d: copy_model(src, d / "in.gguf", nan_in=ENTRY), ENTRY),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("damage", list(GGUF_DAMAGES))
def test_damaged_gguf_input_to_quantize(model_gguf, tmp_path, damage):
    make, culprit = GGUF_DAMAGES[damage]
    src = make(model_gguf, tmp_path)
    target = tmp_path / "out" / "model-Q4_K_M.gguf"
    target.parent.mkdir()
    line = assert_clean_failure(run_cli("quantize", src, target, "Q4_K_M", "--allow-requantize"), culprit, target)
    assert str(src) in line


def test_the_undamaged_input_quantizes(model_gguf, tmp_path):
    # The entries above fail for their damage, not for a reason every input would hit.
    proc = run_cli("quantize", model_gguf, tmp_path / "out.gguf", "Q4_K_M")
    assert proc.returncode == 0, proc.stderr
    assert GGUFReader(tmp_path / "out.gguf").tensor(ENTRY).ggml_type != GGMLType.F32


# -- importance matrices ----------------------------------------------------------------------------
def imatrix_gguf(path: Path, rows: dict[str, int], *, keys: dict[str, MetadataValue] | None = None,
                 tensors: dict[str, tuple[np.ndarray, GGMLType]] | None = None) -> Path:
    """A GGUF importance matrix for weights of `rows` (sums of 1, count 1), as llama-imatrix writes
    it; `keys` replaces metadata, `tensors` replaces or adds tensors (name -> (2-D values, type))."""
    valid = path.with_suffix(".valid.gguf")
    write_imatrix(valid, {name: (np.ones(n, np.float32), np.ones(1, np.float32)) for name, n in rows.items()},
                  ["calibration.txt"], 10, 512)
    reader = GGUFReader(valid)
    md = Metadata()
    for key, value in reader.metadata.items():
        if key not in (keys or {}) or keys[key] is not None:
            md.add_read_value(key, (keys or {}).get(key, value))
    arrays = {t.name: (np.array(t.values()), GGMLType.F32) for t in reader.tensors}
    arrays.update(tensors or {})
    with GGUFWriter(path, md) as writer:
        infos = [writer.add_tensor(name, a.shape, ggml_type) for name, (a, ggml_type) in arrays.items() if a is not None]
        for info in infos:
            a = arrays[info.name][0]
            raw = a.astype(np.float16) if info.ggml_type == GGMLType.F16 else a.astype(np.float32)
            writer.write_tensor(info.name, raw)
    valid.unlink()
    return path


def imatrix_dat(path: Path, rows: dict[str, int], *, values: Callable[[str, int], np.ndarray] | None = None,
                n_entries: int | None = None, name_length: int | None = None, cut: int = 0) -> Path:
    """A legacy .dat importance matrix (int32 count; per entry: int32 name length, name, int32
    ncall, int32 nval, nval float32), with entry values, the entry count or the first name
    length replaced, or its last `cut` bytes cut off."""
    out = bytearray(struct.pack("<i", len(rows) if n_entries is None else n_entries))
    for i, (name, n) in enumerate(rows.items()):
        v = np.ones(n, np.float32) if values is None else values(name, n)
        out += struct.pack("<i", len(name) if (name_length is None or i) else name_length) + name.encode()
        out += struct.pack("<ii", 1, v.size) + v.astype("<f4").tobytes()
    out += struct.pack("<i", 10) + struct.pack("<i", 15) + b"calibration.txt"
    path.write_bytes(bytes(out[: len(out) - cut]))
    return path


def _entry_values(bad: np.ndarray):
    return lambda name, n: bad if name == ENTRY else np.ones(n, np.float32)


def _with_nan(n: int) -> np.ndarray:
    v = np.ones(n, np.float32)
    v[2] = np.nan
    return v


def _with_negative(n: int) -> np.ndarray:
    v = np.ones(n, np.float32)
    v[2] = -4.0
    return v


# name -> (make the damaged file in a folder for the model's row lengths, what the error must name)
IMATRIX_DAMAGES: dict[str, tuple[Callable[[Path, dict], Path], str]] = {
    "gguf_truncated": (
        lambda d, rows: _write(d / "imatrix.gguf", imatrix_gguf(d / "full.gguf", rows).read_bytes()[:300]), "imatrix.gguf"),
    "gguf_without_imatrix_keys": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows, keys={"imatrix.chunk_count": None}), "imatrix.gguf"),
    "gguf_chunk_count_a_string": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows, keys={"imatrix.chunk_count": text("ten")}),
        "imatrix.chunk_count"),
    "gguf_datasets_not_strings": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows, keys={"imatrix.datasets": u32(3)}), "imatrix.datasets"),
    "gguf_f16_sums": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows,
                                     tensors={f"{ENTRY}.in_sum2": (np.ones((1, rows[ENTRY])), GGMLType.F16)}),
        f"{ENTRY}.in_sum2"),
    "gguf_sums_without_counts": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows, tensors={f"{ENTRY}.counts": (None, GGMLType.F32)}), ENTRY),
    "gguf_sums_do_not_split_into_counts": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows, tensors={f"{ENTRY}.counts": (np.ones((3, 1)), GGMLType.F32)}),
        ENTRY),
    "gguf_nan_sums": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows,
                                     tensors={f"{ENTRY}.in_sum2": (_with_nan(rows[ENTRY])[None], GGMLType.F32)}), ENTRY),
    "gguf_negative_sums": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", rows,
                                     tensors={f"{ENTRY}.in_sum2": (_with_negative(rows[ENTRY])[None], GGMLType.F32)}), ENTRY),
    "gguf_for_another_model": (
        lambda d, rows: imatrix_gguf(d / "imatrix.gguf", {name: n + 32 for name, n in rows.items()}), "imatrix.gguf"),
    "dat_truncated_in_an_entry": (lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, cut=60), "imatrix.dat"),
    "dat_empty": (lambda d, rows: _write(d / "imatrix.dat", b""), "imatrix.dat"),
    "dat_no_entries": (lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, n_entries=0), "imatrix.dat"),
    "dat_negative_name_length": (lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, name_length=-5), "imatrix.dat"),
    "dat_entry_count_too_large": (lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, n_entries=2**31 - 1), "imatrix.dat"),
    "dat_nan_values": (
        lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, values=_entry_values(_with_nan(rows[ENTRY]))), ENTRY),
    "dat_no_values_in_an_entry": (
        lambda d, rows: imatrix_dat(d / "imatrix.dat", rows, values=_entry_values(np.ones(0, np.float32))), ENTRY),
    "dat_for_another_model": (
        lambda d, rows: imatrix_dat(d / "imatrix.dat", {name: n * 2 for name, n in rows.items()}), "imatrix.dat"),
}


@pytest.mark.parametrize("command", ["quantize", "convert"])
@pytest.mark.parametrize("damage", list(IMATRIX_DAMAGES))
def test_damaged_imatrix(model_gguf, row_lengths, tmp_path, damage, command):
    make, culprit = IMATRIX_DAMAGES[damage]
    imatrix = make(tmp_path, row_lengths)
    target = tmp_path / "out" / "model-Q4_K_M.gguf"
    target.parent.mkdir()
    if command == "quantize":
        proc = run_cli("quantize", model_gguf, target, "Q4_K_M", "--imatrix", imatrix)
    else:
        proc = run_cli("convert", EXAMPLE_MODEL, target, "--outtype", "q4_k_m", "--imatrix", imatrix, "--quiet")
    line = assert_clean_failure(proc, culprit, target)
    assert str(imatrix) in line


def test_the_undamaged_imatrix_files_are_used(model_gguf, row_lengths, tmp_path):
    for imatrix in (imatrix_gguf(tmp_path / "imatrix.gguf", row_lengths), imatrix_dat(tmp_path / "imatrix.dat", row_lengths)):
        proc = run_cli("quantize", model_gguf, tmp_path / "out.gguf", "Q4_K_M", "--imatrix", imatrix)
        assert proc.returncode == 0, proc.stderr
        assert GGUFReader(tmp_path / "out.gguf").metadata.get("quantize.imatrix.file") == str(imatrix)
        (tmp_path / "out.gguf").unlink()


# -- inspect of hostile files -----------------------------------------------------------------------
def _deep_nesting(path: Path) -> Path:
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    body += struct.pack("<IQ", 9, 1) * 50 + struct.pack("<IQ", 4, 0)
    return _write(path, body)


INSPECT_DAMAGES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "arrays_nested_50_deep": (lambda d: _deep_nesting(d / "deep.gguf"), "nested deeper"),
    "array_count_2_63": (
        lambda d: _write(d / "count.gguf", nested_arrays(1000)[:51] + struct.pack("<Q", 2**63) + nested_arrays(1000)[59:]),
        "arrays in test.nested"),
    "nested_arrays_cut_short": (lambda d: _write(d / "cut.gguf", nested_arrays(100_000)[:-5]), "test.nested"),
}


@pytest.mark.parametrize("damage", list(INSPECT_DAMAGES))
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_inspect_of_hostile_files(tmp_path, damage, json_output):
    make, culprit = INSPECT_DAMAGES[damage]
    path = make(tmp_path)
    proc = run_cli("inspect", *(["--json"] if json_output else []), path)
    line = assert_clean_failure(proc, culprit, None)
    assert str(path) in line and proc.stdout == ""
