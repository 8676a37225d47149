"""Hypothesis fuzz tests of the GGUF reader, `inspect` and the importance-matrix readers: valid seed
files (built by scripts/fuzz_cases.py; scripts/fuzz.py runs the same readers for long) with bytes
overwritten, interesting integers written over fields, chunks cut out or repeated. Whatever the bytes, a reader
either reads the file or raises one of ggufsmith's own errors; what it reads, inspect can show.

Derandomized (the same examples on every run) so that CI is stable; scripts/fuzz.py explores.
"""

from __future__ import annotations

import io
import json
import struct
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufsmith.errors import GgufsmithError
from ggufsmith.gguf_writer import inspect
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.quantize.imatrix import read_imatrix
from scripts.fuzz_cases import INTERESTING, gguf_seeds, imatrix_dat_seeds, imatrix_gguf_seeds

FUZZ = settings(derandomize=True, max_examples=250, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@cache
def seeds(kind: str) -> tuple[bytes, ...]:
    return tuple({"gguf": gguf_seeds, "imatrix-gguf": imatrix_gguf_seeds, "imatrix-dat": imatrix_dat_seeds}[kind]())


@st.composite
def damaged(draw, kind: str) -> bytes:
    """A seed of `kind` with a few edits; the small seeds first, where edits hit the structure."""
    options = sorted(seeds(kind), key=len)
    data = bytearray(draw(st.sampled_from(options[:2])))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["byte", "u32", "u64", "cut", "delete", "repeat"]))
        if edit == "byte" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif edit in ("u32", "u64"):
            width = 4 if edit == "u32" else 8
            value = draw(st.sampled_from(INTERESTING) | st.integers(0, 2**16)) % (1 << (8 * width))
            data[pos : pos + width] = struct.pack("<I" if width == 4 else "<Q", value)
        elif edit == "cut":
            del data[pos:]
        elif edit == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        else:
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 32))] * draw(st.integers(1, 4))
    return bytes(data)


def read_or_own_error(read, path, data: bytes) -> object | None:
    """`data` written to `path`; what `read(path)` returns, or None when it raised a ggufsmith error
    (never anything else), which names the file."""
    path.write_bytes(data)
    try:
        return read(path)
    except GgufsmithError as e:
        assert str(path) in str(e), f"the error does not name the file: {e}"
        return None


@FUZZ
@given(data=damaged("gguf"))
def test_gguf_reader_and_inspect_on_damaged_files(tmp_path, data):
    reader = read_or_own_error(GGUFReader, tmp_path / "fuzz.gguf", data)
    if reader is None:
        return
    # Read whole: every value and tensor decodes; inspect's JSON is valid and complete.
    values = {key: value.plain() for key, value in reader.metadata.items()}
    assert len(values) == reader.n_kv and len(reader.tensors) == reader.n_tensors
    for t in reader.tensors:
        assert t.data.nbytes == t.nbytes
    out = io.StringIO()
    for piece in inspect.json_pieces(reader):
        out.write(piece)
    report = json.loads(out.getvalue())
    assert list(report["metadata"]) == list(values) and len(report["tensors"]) == reader.n_tensors
    assert "\n".join(inspect.text_lines(reader)).count("\n") >= reader.n_kv


@FUZZ
@given(data=damaged("imatrix-gguf"))
def test_gguf_imatrix_reader_on_damaged_files(tmp_path, data):
    matrix = read_or_own_error(read_imatrix, tmp_path / "imatrix.gguf", data)
    if matrix is not None:
        for values in matrix.entries.values():
            assert values.dtype.name == "float32" and (values >= 0).all()


@FUZZ
@given(data=damaged("imatrix-dat"))
def test_legacy_imatrix_reader_on_damaged_files(tmp_path, data):
    matrix = read_or_own_error(read_imatrix, tmp_path / "imatrix.dat", data)
    if matrix is not None:
        assert matrix.is_legacy and matrix.entries
