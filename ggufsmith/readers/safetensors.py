"""Reading .safetensors files with numpy alone (no torch, no safetensors package).

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the header),
an optional "__metadata__" entry, then the raw little-endian tensor bytes.

The file is memory-mapped. A tensor's bytes are copied out (and bf16 widened to float32) only when
it is loaded, one tensor or one slice of rows at a time; the pages just read are then dropped from
this process's mapping so that resident memory stays at the size of what is being converted, not
of the whole checkpoint (the kernel's page cache keeps them, so nothing is read twice).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from ggufsmith.readers.lazy_tensor import RowSlicedTensor
from ggufsmith.errors import ConversionError

# safetensors dtype name -> numpy dtype of its stored bytes (little-endian).
STORAGE_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 on load
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# A header larger than this is not a safetensors file we should trust (the format's own limit).
MAX_HEADER_BYTES = 100_000_000
_PAGE = mmap.PAGESIZE


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the upper half of a float32: widen by shifting the 16 bits into place."""
    out = np.empty(bits.shape, dtype=np.uint32)
    np.left_shift(bits, 16, out=out, dtype=np.uint32)
    return out.view(np.float32)


class SafetensorsFile:
    """One memory-mapped .safetensors file. `tensors` maps each name to a RowSlicedTensor."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb")
        try:
            self.size = os.fstat(self._file.fileno()).st_size
            header, self.data_start = self._read_header()
            self.metadata = header.pop("__metadata__", None) or {}
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
            self.tensors: dict[str, RowSlicedTensor] = {
                name: self._lazy_tensor(name, entry) for name, entry in header.items()
            }
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> ConversionError:
        return ConversionError(f"{self.path}: {what}; the file is damaged or not a safetensors file, download it again")

    def _read_header(self) -> tuple[dict, int]:
        prefix = self._file.read(8)
        if len(prefix) < 8:
            raise self._fail(f"only {self.size} bytes, too short for a header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > self.size:
            raise self._fail(f"header length {header_len} does not fit the file of {self.size} bytes")
        raw = self._file.read(header_len)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._fail(f"header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        return header, 8 + header_len

    def _lazy_tensor(self, name: str, entry: object) -> RowSlicedTensor:
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise self._fail(f"{where} has no dtype/shape/data_offsets entry")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype_name not in STORAGE_DTYPES:
            raise ConversionError(
                f"{self.path}: {where} has dtype {dtype_name!r}, which ggufsmith cannot read "
                f"(supported: {', '.join(STORAGE_DTYPES)})"
            )
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise self._fail(f"{where} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise self._fail(f"{where} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        storage = STORAGE_DTYPES[dtype_name]
        n_elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= begin <= end or self.data_start + end > self.size:
            raise self._fail(f"{where} data_offsets {offsets} lie outside the file")
        if end - begin != n_elements * storage.itemsize:
            raise self._fail(
                f"{where} spans {end - begin} bytes but shape {shape} of {dtype_name} needs {n_elements * storage.itemsize}"
            )
        shape_t = tuple(shape)
        row_length = shape_t[-1] if shape_t else 1
        start = self.data_start + begin

        def load_rows(first: int, stop: int, widen=bf16_bits_to_f32 if dtype_name == "BF16" else np.copy) -> np.ndarray:
            rows = stop - first
            data = self._read(start + first * row_length * storage.itemsize, rows * row_length, storage, widen)
            return data.reshape(rows, row_length)

        def load_stored_rows(first: int, stop: int) -> np.ndarray:
            return load_rows(first, stop, widen=np.copy)

        def load() -> np.ndarray:
            n_rows = n_elements // row_length if row_length else 0
            return load_rows(0, n_rows).reshape(shape_t) if n_elements else np.zeros(shape_t, _loaded_dtype(storage, dtype_name))

        return RowSlicedTensor(shape_t, dtype_name, load, f"{self.path.name}:{name}", load_rows, load_stored_rows)

    def _read(self, offset: int, count: int, storage: np.dtype, convert) -> np.ndarray:
        """convert(the `count` elements at byte `offset`): a copy out of the map, whose pages are then dropped."""
        nbytes = count * storage.itemsize
        if self._map is None:
            raise ConversionError(f"{self.path} was closed")
        view = np.frombuffer(self._map, dtype=storage, count=count, offset=offset)
        data = convert(view)
        del view
        if nbytes >= _PAGE and hasattr(self._map, "madvise"):
            # Dropping a read-only file mapping's pages is always safe: a later access faults
            # them back in from the page cache. This keeps RSS at one slice, not the whole file.
            page_start = offset - offset % _PAGE
            self._map.madvise(mmap.MADV_DONTNEED, page_start, min(offset + nbytes, self.size) - page_start)
        return data

    def close(self) -> None:
        m = getattr(self, "_map", None)
        if m is not None:
            try:
                m.close()
            except BufferError:  # a view is still alive; the map goes when it does
                pass
            self._map = None
        self._file.close()


def _loaded_dtype(storage: np.dtype, dtype_name: str) -> np.dtype:
    return np.dtype(np.float32) if dtype_name == "BF16" else storage
