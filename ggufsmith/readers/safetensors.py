"""Reading .safetensors files: validated by the format's reference parser, read with numpy.

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the header),
an optional "__metadata__" entry, then the raw little-endian tensor bytes.

Who checks what:
  - The `safetensors` package (the format's reference implementation, in Rust) validates every
    file on open: the header's size and JSON, known dtypes, shapes of non-negative integers whose
    byte size does not overflow, tensors that lie one after the other from the start of the data
    without gap or overlap and cover it exactly. A file it refuses is refused here, with its reason.
  - ggufsmith reads the header too, because the package does not expose what reading needs: each
    tensor's byte offsets (its numpy API gives only copies, and cannot give bf16 without torch).
    Before asking the package, each entry is checked here so that the common damage (a truncated
    download, a dtype ggufsmith cannot convert, a bad shape) gets a message naming the tensor.
    Two more refusals are ours: a key given twice in the header (JSON readers keep one or the
    other: such a file means different things to different tools) and a shape too large for numpy.

The file is memory-mapped. A tensor's bytes are copied out (and bf16 widened to float32) only when
it is loaded, one tensor or one slice of rows at a time; the pages just read are then dropped from
this process's mapping so that resident memory stays at the size of what is being converted, not
of the whole checkpoint (the kernel's page cache keeps them, so nothing is read twice).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ggufsmith.errors import ConversionError
from ggufsmith.readers.file_rows import READABLE_DTYPES, FileRows
from ggufsmith.readers.jsonfile import parse_json, shown as _shown
from ggufsmith.readers.lazy_tensor import RowSlicedTensor

# safetensors dtype name -> numpy dtype of its stored bytes (little-endian). The format knows more
# (F4, U16...): ggufsmith refuses those by name.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 on load
    "F8_E4M3": np.dtype("u1"),  # decoded to float32 on load (readers/prequantized.py applies the scales)
    "F8_E5M2": np.dtype("u1"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# The safetensors library's own limit on the header's size.
MAX_HEADER_BYTES = 100_000_000
# numpy's limit on an array's size in bytes (and on any one dimension): a tensor must fit it even
# when another of its dimensions is 0.
MAX_ARRAY_BYTES = 2**63 - 1
_PAGE = mmap.PAGESIZE


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the upper half of a float32: widen by shifting the 16 bits into place."""
    out = np.empty(bits.shape, dtype=np.uint32)
    np.left_shift(bits, 16, out=out, dtype=np.uint32)
    return out.view(np.float32)


def _float8_table(exponent_bits: int, mantissa_bits: int, *, has_infinity: bool) -> np.ndarray:
    """The float32 value of each of the 256 bytes of an 8-bit float (exact: float32 holds them all).
    E4M3 ("fn": finite, NaN only at S.1111.111) and E5M2 (IEEE-like: infinities and NaNs)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << mantissa_bits) - 1)
    bias = (1 << (exponent_bits - 1)) - 1
    fraction = mantissa / (1 << mantissa_bits)
    values = np.where(exponent == 0, fraction * 2.0 ** (1 - bias), (1 + fraction) * 2.0 ** (exponent - bias)) * sign
    top = exponent == (1 << exponent_bits) - 1
    if has_infinity:
        values = np.where(top, np.where(mantissa == 0, sign * np.inf, np.nan), values)
    else:
        values = np.where(top & (mantissa == (1 << mantissa_bits) - 1), np.nan, values)
    return values.astype(np.float32)


_E4M3 = _float8_table(4, 3, has_infinity=False)
_E5M2 = _float8_table(5, 2, has_infinity=True)
# Stored types decoded to float32 when loaded.
WIDEN = {"BF16": bf16_bits_to_f32, "F8_E4M3": lambda codes: _E4M3[codes], "F8_E5M2": lambda codes: _E5M2[codes]}


@dataclass(frozen=True)
class _Layout:
    """Where one tensor lies in the file, from its header entry."""

    name: str
    dtype_name: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    n_elements: int


class SafetensorsFile:
    """One memory-mapped .safetensors file. `tensors` maps each name to a RowSlicedTensor."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._map: mmap.mmap | None = None
        self._file = open(self.path, "rb")
        try:
            self.size = os.fstat(self._file.fileno()).st_size
            header, self.data_start = self._read_header()
            metadata = header.pop("__metadata__", None)
            layouts = [self._layout(name, entry) for name, entry in header.items()]
            self._check_with_reference_parser()
            self.metadata: dict[str, str] = metadata or {}
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
            self.tensors: dict[str, RowSlicedTensor] = {layout.name: self._lazy_tensor(layout) for layout in layouts}
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fail(self, what: str) -> ConversionError:
        return ConversionError(f"{self.path}: {what}; the file is damaged or not a safetensors file, download it again")

    def _read_header(self) -> tuple[dict, int]:
        prefix = self._file.read(8)
        if len(prefix) < 8:
            raise self._fail(f"only {self.size} bytes, too short for a header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > self.size:
            raise self._fail(f"header length {header_len} does not fit the file of {self.size} bytes")
        header = parse_json(self._file.read(header_len), f"{self.path} (safetensors header)", unique_keys=True)
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        return header, 8 + header_len

    def _layout(self, name: str, entry: object) -> _Layout:
        """The entry's dtype, shape and place, checked enough to name the tensor in any error."""
        where = f"tensor {name!r}" if len(name) <= 300 else f"tensor {name[:100]!r}... ({len(name)} characters)"
        if not isinstance(entry, dict):
            raise self._fail(f"{where} has {_shown(entry)} instead of its dtype, shape and data_offsets")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(dtype_name, str) and dtype_name in STORAGE_DTYPES):
            raise ConversionError(
                f"{self.path}: {where} has dtype {_shown(dtype_name)}, which ggufsmith cannot read "
                f"(supported: {', '.join(STORAGE_DTYPES)})"
            )
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise self._fail(f"{where} has shape {_shown(shape)}; dimensions must be non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise self._fail(f"{where} has data_offsets {_shown(offsets)}; expected [begin, end] byte offsets")
        itemsize = STORAGE_DTYPES[dtype_name].itemsize
        nonzero_elements = _capped_product(d for d in shape if d)
        if nonzero_elements * itemsize > MAX_ARRAY_BYTES:
            raise self._fail(f"{where} has shape {_shown(shape)}, too large for any real tensor")
        n_elements = nonzero_elements if all(shape) else 0
        begin, end = offsets
        if begin > end:
            raise self._fail(f"{where} has data_offsets {_shown(offsets)} that end before they begin")
        if end - begin != n_elements * itemsize:
            raise self._fail(
                f"{where} spans {_shown(end - begin)} bytes but shape {_shown(shape)} of {dtype_name} needs "
                f"{n_elements * itemsize}"
            )
        if self.data_start + end > self.size:
            raise ConversionError(
                f"{self.path}: {where} data_offsets {_shown(offsets)} lie outside the file ({self.size - self.data_start} "
                "bytes of tensor data): the file is truncated, download it again"
            )
        return _Layout(name, dtype_name, tuple(shape), self.data_start + begin, n_elements)

    def _check_with_reference_parser(self) -> None:
        """The safetensors package's verdict on the whole file (layout, coverage, exact JSON types)."""
        try:
            with safe_open(self.path, framework="numpy"):
                pass
        except SafetensorError as e:
            reason = " ".join(str(e).split()).removeprefix("Error while deserializing header: ")
            raise self._fail(f"refused by the safetensors library ({reason[:200]})") from None

    def _lazy_tensor(self, layout: _Layout) -> RowSlicedTensor:
        storage = STORAGE_DTYPES[layout.dtype_name]
        shape, start, n_elements = layout.shape, layout.start, layout.n_elements
        row_length = shape[-1] if shape else 1
        widen_on_load = WIDEN.get(layout.dtype_name, np.copy)

        def load_rows(first: int, stop: int, widen=widen_on_load) -> np.ndarray:
            rows = stop - first
            data = self._read(start + first * row_length * storage.itemsize, rows * row_length, storage, widen)
            return data.reshape(rows, row_length)

        def load_stored_rows(first: int, stop: int) -> np.ndarray:
            return load_rows(first, stop, widen=np.copy)

        def load() -> np.ndarray:
            if not n_elements:
                return np.zeros(shape, np.float32 if layout.dtype_name in WIDEN else storage)
            return load_rows(0, n_elements // row_length).reshape(shape)

        def file_rows(first: int, stop: int) -> FileRows:
            return FileRows(str(self.path), start + first * row_length * storage.itemsize, layout.dtype_name,
                            stop - first, row_length)

        return RowSlicedTensor(shape, layout.dtype_name, load, f"{self.path.name}:{layout.name}", load_rows,
                               load_stored_rows, file_rows if layout.dtype_name in READABLE_DTYPES and shape else None)

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
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive; the map goes when it does
                pass
            self._map = None
        self._file.close()


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the .safetensors file at `path`, loaded (bf16 widened to float32).

    The whole reader in one call, header to data: what a fuzzer drives. Raises ConversionError
    (and OSError when the file cannot be opened), nothing else."""
    with SafetensorsFile(path) as f:
        return {name: tensor.load() for name, tensor in f.tensors.items()}


def _is_count(value: object) -> bool:
    """A JSON non-negative integer (json gives True/False for true/false: bool is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _capped_product(values) -> int:
    """The product of `values`, or any number above MAX_ARRAY_BYTES once it is known to exceed it
    (a hostile shape of a million huge dimensions must not cost a multiplication of millions of digits)."""
    n = 1
    for v in values:
        n *= v
        if n > MAX_ARRAY_BYTES:
            break
    return n
