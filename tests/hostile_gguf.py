"""Hostile GGUF files of a chosen size: valid files whose every byte is spent on the structure that
costs a reader the most memory per byte (many tiny keys, tiny strings, nested empty arrays, tensor
infos without data). A reader that builds one Python object per element of these takes tens of
times the file size; the memory tests and scripts/fuzz.py measure against them.

Files are built byte by byte (not by our writer) so they do not depend on the code under test.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

GGUF_STRING, GGUF_ARRAY, GGUF_UINT8, GGUF_UINT32 = 8, 9, 0, 4


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def many_keys(size: int) -> bytes:
    """Key-value pairs of one UINT8 each, with distinct short keys: 16-20 bytes a pair."""
    n = size // 18
    body = b"".join(_string(b"k%x" % i) + struct.pack("<IB", GGUF_UINT8, 1) for i in range(n))
    return _header(0, n) + body


def tiny_strings(size: int) -> bytes:
    """One array of two-byte strings (10 bytes each; a Python str is ~50)."""
    n = size // 10
    item = _string(b"ab")
    return _header(0, 1) + _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_STRING, n) + item * n


def nested_arrays(size: int) -> bytes:
    """An array of empty UINT32 arrays, 12 bytes each."""
    n = size // 12
    item = struct.pack("<IQ", GGUF_UINT32, 0)
    return _header(0, 1) + _string(b"test.nested") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_ARRAY, n) + item * n


def nested_string_arrays(size: int) -> bytes:
    """An array of arrays of one one-byte string each (21 bytes an element), the worst case for a
    JSON dump that builds one dict per array."""
    n = size // 21
    item = struct.pack("<IQ", GGUF_STRING, 1) + _string(b"x")
    return _header(0, 1) + _string(b"test.nested") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_ARRAY, n) + item * n


def many_tensors(size: int) -> bytes:
    """Tensor infos of empty F32 tensors (shape [0]): 33-38 bytes each, no data."""
    n = size // 36
    infos = b"".join(_string(b"t%x" % i) + struct.pack("<IQIQ", 1, 0, 0, 0) for i in range(n))
    head = _header(n, 0) + infos
    return head + bytes(-len(head) % 32)  # the data section starts aligned, even when empty


HOSTILE_FILES: dict[str, Callable[[int], bytes]] = {
    "many_keys": many_keys,
    "tiny_strings": tiny_strings,
    "nested_arrays": nested_arrays,
    "nested_string_arrays": nested_string_arrays,
    "many_tensors": many_tensors,
}


def write_hostile(folder: Path, kind: str, size: int) -> Path:
    path = folder / f"{kind}.gguf"
    path.write_bytes(HOSTILE_FILES[kind](size))
    return path
