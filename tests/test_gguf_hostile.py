"""Malformed and hostile GGUF files: every one must give a GGUFError, quickly, without a large
allocation, never another exception. Files are built byte by byte here (not by our writer) so that
each header field's position is known and can be set to extreme values."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest

from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer.reader import GGUFReader
from tests.ggml_oracle import ggml_parse_gguf

U64_MAX = 2**64 - 1


class Builder:
    """Writes GGUF fields and remembers where each one is, by name."""

    def __init__(self, order: str = "<", width: int = 8) -> None:
        self.order, self.width = order, width
        self.buf = bytearray()
        self.at: dict[str, int] = {}

    def put(self, fmt: str, value, name: str | None = None) -> None:
        if name:
            self.at[name] = len(self.buf)
        self.buf += struct.pack(self.order + fmt, value)

    def size(self, value, name=None) -> None:
        self.put("Q" if self.width == 8 else "I", value, name)

    def string(self, text: str, name=None) -> None:
        raw = text.encode()
        self.size(len(raw), name)
        self.buf += raw

    def pad(self, alignment: int) -> None:
        self.buf += b"\0" * (-len(self.buf) % alignment)

    def key(self, name: str, value_type: int) -> None:
        """A metadata key and its value type (8 string, 9 array, ...); the value follows."""
        self.string(name)
        self.put("I", value_type)


def v3_header(n_tensors: int, n_kv: int) -> Builder:
    """A little-endian version-3 file started: magic, version, tensor count, key count."""
    b = Builder()
    b.buf += b"GGUF"
    b.put("I", 3)
    b.size(n_tensors)
    b.size(n_kv)
    return b


def build_valid(order: str = "<", version: int = 3, alignment: int = 32) -> tuple[bytes, dict[str, int], int, int]:
    """A small file with every kind of field; returns (bytes, field offsets, size, data offset)."""
    b = Builder(order, 4 if version == 1 else 8)
    b.buf += b"GGUF"
    b.put("I", version, "version")
    b.size(2, "n_tensors")
    b.size(6, "n_kv")
    b.string("general.architecture", "key0_len")
    b.put("I", 8, "key0_type")
    b.string("llama", "value0_len")
    b.string("tokenizer.ggml.tokens", "key1_len")
    b.put("I", 9, "key1_type")
    b.put("I", 8, "array1_type")
    b.size(3, "array1_len")
    for tok in ["<s>", "ü", ""]:
        b.string(tok, "string1_len" if tok == "<s>" else None)
    b.key("tokenizer.ggml.scores", 9)
    b.put("I", 6, "array2_type")
    b.size(3, "array2_len")
    for v in (0.0, -1.5, 2.0):
        b.put("f", v)
    b.key("test.nested", 9)
    b.put("I", 9, "nested_type")
    b.size(2, "nested_len")
    for n in (2, 0):
        b.put("I", 4)
        b.size(n)
        for j in range(n):
            b.put("I", j)
    b.key("test.flag", 7)
    b.put("B", 1, "bool_value")
    b.string("general.alignment")
    b.put("I", 4, "alignment_type")
    b.put("I", alignment, "alignment_value")
    # tensor 0: F32 [2, 8] (numpy order) = 64 bytes; tensor 1: Q8_0 [1, 32] = 34 bytes
    b.string("token_embd.weight", "t0_name_len")
    b.put("I", 2, "t0_n_dims")
    b.size(8, "t0_ne0")
    b.size(2, "t0_ne1")
    b.put("I", 0, "t0_type")
    b.put("Q", 0, "t0_offset")
    b.string("output.weight", "t1_name_len")
    b.put("I", 1, "t1_n_dims")
    b.size(32, "t1_ne0")
    b.put("I", 8, "t1_type")
    b.put("Q", 64 if alignment <= 64 else alignment, "t1_offset")
    b.pad(alignment)
    data_start = len(b.buf)
    b.buf += bytes(range(64))
    b.pad(alignment)
    b.buf += bytes(34)
    return bytes(b.buf), b.at, len(b.buf), data_start


def read(tmp_path, data: bytes, name: str = "f.gguf") -> GGUFReader:
    path = tmp_path / name
    path.write_bytes(data)
    return GGUFReader(path)


def patched(data: bytes, offset: int, fmt: str, value, order: str = "<") -> bytes:
    raw = struct.pack(order + fmt, value)
    return data[:offset] + raw + data[offset + len(raw) :]


def test_the_hand_built_file_is_valid_for_ggml_and_us(tmp_path):
    data, at, end, data_start = build_valid()
    path = tmp_path / "valid.gguf"
    path.write_bytes(data)
    r = GGUFReader(path)
    assert [t.name for t in r.tensors] == ["token_embd.weight", "output.weight"]
    assert r.tensors[0].shape == (2, 8) and r.tensors[0].data.tobytes() == bytes(range(64))
    assert r.data_offset == data_start
    assert r.metadata["test.nested"].plain() == [[0, 1], []]
    assert r.metadata["tokenizer.ggml.tokens"].plain() == ["<s>", "ü", ""]


@pytest.mark.parametrize("order", ["<", ">"])
def test_truncated_at_every_byte(tmp_path, order):
    data, at, end, data_start = build_valid(order)
    path = tmp_path / "cut.gguf"
    started = time.perf_counter()
    for cut in range(len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="byte|short"):
            GGUFReader(path)
    elapsed = time.perf_counter() - started
    assert elapsed < 30, f"{len(data)} truncations took {elapsed:.1f} s"


def test_truncated_metadata_only_file_fails_until_its_last_byte(tmp_path):
    # A file without tensors may end right after its metadata (llama.cpp's vocab files do).
    b = v3_header(0, 1)
    b.key("general.name", 8)
    b.string("tiny")
    data = bytes(b.buf)
    assert read(tmp_path, data).metadata.get("general.name") == "tiny"
    for cut in range(len(data)):
        with pytest.raises(GGUFError):
            read(tmp_path, data[:cut])


# (field, struct format, value) -> each must be rejected
EXTREMES = [
    ("version", "I", 0), ("version", "I", 4), ("version", "I", 0x10000), ("version", "I", 2**32 - 1),
    ("n_tensors", "Q", 2**63), ("n_tensors", "Q", U64_MAX), ("n_tensors", "Q", 2**32), ("n_tensors", "Q", 3),
    ("n_kv", "Q", 2**63), ("n_kv", "Q", U64_MAX), ("n_kv", "Q", 100),
    ("key0_len", "Q", 0), ("key0_len", "Q", 2**63), ("key0_len", "Q", U64_MAX), ("key0_len", "Q", 10**6),
    ("key0_type", "I", 13), ("key0_type", "I", 2**32 - 1), ("key0_type", "I", 2**31),
    ("value0_len", "Q", 10**6), ("value0_len", "Q", U64_MAX),
    ("array1_type", "I", 13), ("array1_type", "I", 2**32 - 1),
    ("array1_len", "Q", 2**63), ("array1_len", "Q", U64_MAX), ("array1_len", "Q", 2**61), ("array1_len", "Q", 10**5),
    ("string1_len", "Q", U64_MAX), ("string1_len", "Q", 10**6),
    ("array2_len", "Q", 2**62), ("array2_len", "Q", U64_MAX), ("array2_len", "Q", 10**6),
    ("nested_len", "Q", 2**63), ("nested_len", "Q", U64_MAX),
    ("nested_type", "I", 13),
    ("bool_value", "B", 2), ("bool_value", "B", 255),
    ("alignment_type", "I", 5), ("alignment_value", "I", 0), ("alignment_value", "I", 3),
    ("alignment_value", "I", 48), ("alignment_value", "I", 2**31),
    ("t0_name_len", "Q", U64_MAX), ("t0_name_len", "Q", 2**63),
    ("t0_n_dims", "I", 0), ("t0_n_dims", "I", 5), ("t0_n_dims", "I", 2**32 - 1),
    ("t0_ne0", "Q", 2**63), ("t0_ne0", "Q", U64_MAX), ("t0_ne0", "Q", 2**62), ("t0_ne1", "Q", 2**62),
    ("t0_ne0", "Q", 9), ("t0_ne1", "Q", 3),
    ("t0_type", "I", 4), ("t0_type", "I", 5), ("t0_type", "I", 43), ("t0_type", "I", 2**31), ("t0_type", "I", 2**32 - 1),
    ("t0_type", "I", 2),  # Q4_0 needs rows of 32
    ("t1_type", "I", 0),  # F32 [32]: 128 bytes, past the end of the file
    ("t0_offset", "Q", 1), ("t0_offset", "Q", 48), ("t0_offset", "Q", 2**40), ("t0_offset", "Q", U64_MAX - 31),
    ("t1_offset", "Q", 0), ("t1_offset", "Q", 32), ("t1_offset", "Q", 96), ("t1_offset", "Q", 4096),
    ("t1_name_len", "Q", 3),  # the rest of tensor 1's info is then misparsed
]


@pytest.mark.parametrize("order", ["<", ">"])
def test_extreme_header_fields(tmp_path, order):
    data, at, end, data_start = build_valid(order)
    started = time.perf_counter()
    tracemalloc.start()
    try:
        for field, fmt, value in EXTREMES:
            bad = patched(data, at[field], fmt, value, order)
            tracemalloc.reset_peak()
            with pytest.raises(GGUFError, match="byte"):
                read(tmp_path, bad)
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < 1_000_000, f"{field}={value}: allocated {peak} bytes for a {len(bad)}-byte file"
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 30


def test_ggml_rejects_the_header_extremes_too(tmp_path):
    # The oracle agrees these files are broken (little-endian; ggml reads only native order).
    # Fields ggml does not check without loading data (offsets past the end, bool values,
    # alignment 48 is a power-of-two violation ggml checks) are left out.
    data, at, end, data_start = build_valid("<")
    skip = {"bool_value", "t1_type", "t0_offset", "t1_offset", "t0_ne0", "t0_ne1", "nested_type", "nested_len", "t0_n_dims", "version"}
    path = tmp_path / "bad.gguf"
    checked = 0
    for field, fmt, value in EXTREMES:
        if field in skip:
            continue
        path.write_bytes(patched(data, at[field], fmt, value))
        assert ggml_parse_gguf(path) is None, (field, value)
        checked += 1
    assert checked > 20


def test_bad_magic_and_tiny_files(tmp_path):
    data, *_ = build_valid()
    for bad in [b"GGUX" + data[4:], b"", b"GG", b"GGUF", b"GGUF\x03\x00\x00", b"\0" * 64]:
        with pytest.raises(GGUFError):
            read(tmp_path, bad)


def test_duplicate_keys_and_tensor_names(tmp_path):
    b = v3_header(0, 2)
    for _ in range(2):
        b.key("general.name", 8)
        b.string("x")
    with pytest.raises(GGUFError, match="twice"):
        read(tmp_path, bytes(b.buf))
    b = v3_header(2, 0)
    for i in range(2):
        b.string("w")  # tensor info: name, 1 dimension of 4, type F32, offset
        b.put("I", 1)
        b.size(4)
        b.put("I", 0)
        b.put("Q", 32 * i)
    b.pad(32)
    b.buf += bytes(48)
    with pytest.raises(GGUFError, match="twice"):
        read(tmp_path, bytes(b.buf))


def test_arrays_nested_too_deep(tmp_path):
    b = v3_header(0, 1)
    b.key("deep", 9)
    for _ in range(10_000):  # each level: element type ARRAY, one element
        b.put("I", 9)
        b.size(1)
    b.put("I", 4)
    b.size(0)
    with pytest.raises(GGUFError, match="nested deeper"):
        read(tmp_path, bytes(b.buf))


@pytest.mark.parametrize("version", [1, 2])
def test_older_versions_are_read(tmp_path, version):
    data, at, end, data_start = build_valid(version=version)
    r = read(tmp_path, data)
    assert r.version == version
    assert r.metadata["tokenizer.ggml.tokens"].plain() == ["<s>", "ü", ""]
    assert [t.shape for t in r.tensors] == [(2, 8), (32,)]
    assert r.tensors[1].data.nbytes == 34


def test_non_utf8_strings_are_kept_as_bytes(tmp_path):
    # llama.cpp stores token text as raw bytes; a byte-level token need not be valid UTF-8.
    b = v3_header(0, 1)
    b.key("tokenizer.ggml.tokens", 9)
    b.put("I", 8)
    b.size(2)
    b.size(1)
    b.buf += b"\xff"
    b.string("ok")
    assert read(tmp_path, bytes(b.buf)).metadata["tokenizer.ggml.tokens"].plain() == [b"\xff", "ok"]


@pytest.mark.parametrize("ne", [[0, 2**62, 4], [4, 0, 2**61], [0, 2**31, 2**31, 2**31]])
def test_empty_tensor_whose_other_dimensions_overflow(tmp_path, ne):
    # No element, so no byte: but no numpy array can have this shape (its views would fail with
    # ValueError, found by scripts/fuzz.py). ggml accepts some of these; we refuse them all.
    b = v3_header(1, 0)
    b.string("w")
    b.put("I", len(ne))
    for d in ne:
        b.size(d)
    b.put("I", 0)
    b.put("Q", 0)
    b.pad(32)
    with pytest.raises(GGUFError, match="empty, but its other dimensions"):
        read(tmp_path, bytes(b.buf))
