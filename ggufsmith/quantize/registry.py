"""The one place that knows which tensor types ggufsmith can quantize and dequantize.

A family module (float.py, legacy_*.py, k_*.py) calls `register(...)` for each type it implements
with two row functions working on a chunk of whole rows:

    quantize_rows(rows: float32[n_rows, row_length], importance: float32[row_length] | None)
        -> uint8[n_rows, row_bytes]
    dequantize_rows(data: uint8[n_rows, row_bytes], row_length: int) -> float32[n_rows, row_length]

`quantize` and `dequantize` below validate, split big tensors into chunks so that memory stays
bounded, and call them. Block sizes and bytes per block come from constants.GGML_TYPE_LAYOUT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ggufsmith.constants import GGML_TYPE_LAYOUT, GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize.allocator import keep_freed_memory
from ggufsmith.quantize.numerics import NonFiniteInput

QuantizeRows = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]
DequantizeRows = Callable[[np.ndarray, int], np.ndarray]

# Rows are processed in chunks of about this many input elements (512 KiB of float32), so the
# temporaries of a family's vectorized code stay a small multiple of that, whatever the tensor size.
# Small enough that those temporaries stay in a core's L2 cache across the many numpy passes of a
# quantizer: measured on a 2 MiB-L2 Xeon, 1<<17 makes Q8_0 2.3x and F16/BF16 1.3-3x faster than
# 1<<20, and no type slower (smaller chunks start to lose to per-call overhead).
CHUNK_ELEMENTS = 1 << 17
# The K-quants (whose searches work in cache-sized batches of their own) take chunks twice as
# large: their per-chunk work outside the search (super-block scales, make_qp_quants' sweeps,
# packing) is many small numpy calls whose cost is per call, not per value. Measured 1-8% faster
# than 1<<17 for Q2_K/Q4_K/Q6_K with and without an imatrix once the chunks' temporaries stopped
# faulting in fresh pages (allocator.py); 1<<19 no faster.
K_QUANT_CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class QuantFormat:
    ggml_type: GGMLType
    quantize_rows: QuantizeRows
    dequantize_rows: DequantizeRows
    supports_importance: bool = False  # accepts llama.cpp imatrix weights
    requires_importance: bool = False  # ggml refuses to quantize it without them (IQ2_XXS, IQ2_XS, IQ1_S)
    checks_finite: bool = True  # NaN/Inf are rejected (block types); float types keep them
    # quantize_rows finds NaN/Inf itself (raising numerics.NonFiniteInput) at no extra pass, so
    # the registry skips its own scan (Q3_K: its search's largest magnitude is NaN or Inf then)
    finds_non_finite: bool = False
    # Input elements per quantize_rows call, if not CHUNK_ELEMENTS: for a type whose per-call cost
    # has a large fixed part (Q3_K's iterative sweeps).
    chunk_elements: int | None = None
    # The same when an importance vector is given, if it differs (Q3_K: its imatrix search is
    # another, tiled anyway, and best on smaller chunks).
    importance_chunk_elements: int | None = None
    # For stored data: which rows (uint8[n_rows, row_bytes] -> bool[n_rows]) hold blocks that
    # ggml_validate_row_data rejects although they decode to finite values (MXFP4's exponent 0xFF,
    # E8M0's NaN). Blocks that decode to NaN or Inf need no such test.
    invalid_rows: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def block_size(self) -> int:
        return GGML_TYPE_LAYOUT[self.ggml_type].block_size

    @property
    def type_size(self) -> int:
        return GGML_TYPE_LAYOUT[self.ggml_type].type_size

    def row_bytes(self, row_length: int) -> int:
        return row_length // self.block_size * self.type_size


_FORMATS: dict[GGMLType, QuantFormat] = {}


def register(fmt: QuantFormat) -> None:
    if fmt.ggml_type in _FORMATS:
        raise ValueError(f"{fmt.ggml_type.name} is registered twice")
    _FORMATS[fmt.ggml_type] = fmt


def get_format(ggml_type: GGMLType | int | str) -> QuantFormat:
    """The registered format of a type, by enum, id or name ('q4_k', 'Q4_K')."""
    try:
        if isinstance(ggml_type, str):
            ggml_type = GGMLType[ggml_type.upper()]
        ggml_type = GGMLType(ggml_type)
    except (KeyError, ValueError):
        raise QuantizationError(f"unknown tensor type {ggml_type!r}") from None
    fmt = _FORMATS.get(ggml_type)
    if fmt is None:
        supported = ", ".join(t.name for t in supported_types())
        raise QuantizationError(f"ggufsmith cannot (de)quantize {ggml_type.name}; supported: {supported}")
    return fmt


def supported_types() -> list[GGMLType]:
    return sorted(_FORMATS)


def _rows_of(shape: tuple[int, ...], what: str) -> tuple[int, int]:
    """(n_rows, row_length) of a tensor: rows are along the last (contiguous) axis, as in ggml."""
    if len(shape) == 0:
        raise QuantizationError(f"{what}: a scalar has no rows to quantize")
    row_length = int(shape[-1])
    n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return n_rows, row_length


def quantize(array: np.ndarray, ggml_type: GGMLType | int | str, importance: np.ndarray | None = None) -> np.ndarray:
    """Quantize `array` (any float dtype, rows along the last axis) to the bytes of `ggml_type`.

    Returns a flat uint8 array of exactly the tensor's GGUF data size. `importance` is llama.cpp's
    imatrix for this tensor: one non-negative weight per column (per element of a row).
    """
    fmt = get_format(ggml_type)
    array = np.asarray(array)
    n_rows, row_length = _rows_of(array.shape, fmt.ggml_type.name)
    if row_length % fmt.block_size:
        raise QuantizationError(
            f"{fmt.ggml_type.name} needs rows of a multiple of {fmt.block_size} elements; this tensor's rows have {row_length}"
        )
    if importance is None and fmt.requires_importance:
        raise QuantizationError(
            f"{fmt.ggml_type.name} needs an importance matrix (llama.cpp's imatrix) to quantize; none was given"
        )
    if importance is not None:
        if not fmt.supports_importance:
            raise QuantizationError(f"{fmt.ggml_type.name} does not use an importance matrix")
        importance = np.ascontiguousarray(importance, dtype=np.float32).reshape(-1)
        if importance.size != row_length:
            raise QuantizationError(
                f"importance vector has {importance.size} values for rows of {row_length} elements"
            )
    rows = array.reshape(n_rows, row_length)
    keep_freed_memory()  # the chunks' temporaries reuse the same pages (see allocator.py)
    out = np.empty((n_rows, fmt.row_bytes(row_length)), dtype=np.uint8)
    chunk_elements = fmt.chunk_elements or CHUNK_ELEMENTS
    if importance is not None and fmt.importance_chunk_elements:
        chunk_elements = fmt.importance_chunk_elements
    step = max(1, chunk_elements // max(row_length, 1))
    for start in range(0, n_rows, step):
        chunk = np.ascontiguousarray(rows[start : start + step], dtype=np.float32)
        if fmt.checks_finite and not fmt.finds_non_finite and not np.isfinite(chunk).all():
            raise _non_finite(chunk, start, fmt)
        try:
            out[start : start + step] = fmt.quantize_rows(chunk, importance)
        except NonFiniteInput:
            raise _non_finite(chunk, start, fmt) from None
    return out.reshape(-1)


def _non_finite(chunk: np.ndarray, start: int, fmt: QuantFormat) -> QuantizationError:
    bad = int(np.argwhere(~np.isfinite(chunk))[0][0]) + start
    return QuantizationError(f"row {bad} contains NaN or Inf; {fmt.ggml_type.name} cannot represent it")


def dequantize(data: np.ndarray | bytes | memoryview, ggml_type: GGMLType | int | str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode the GGUF bytes of a tensor of `shape` (numpy order, rows last) to float32."""
    fmt = get_format(ggml_type)
    shape = tuple(int(s) for s in shape)
    n_rows, row_length = _rows_of(shape, fmt.ggml_type.name)
    if row_length % fmt.block_size:
        raise QuantizationError(f"{fmt.ggml_type.name} rows must be a multiple of {fmt.block_size}, got {row_length}")
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
    row_bytes = fmt.row_bytes(row_length)
    if raw.size != n_rows * row_bytes:
        raise QuantizationError(
            f"{fmt.ggml_type.name} tensor of shape {shape} needs {n_rows * row_bytes} bytes, got {raw.size}"
        )
    raw = raw.reshape(n_rows, row_bytes)
    out = np.empty((n_rows, row_length), dtype=np.float32)
    step = max(1, CHUNK_ELEMENTS // max(row_length, 1))
    for start in range(0, n_rows, step):
        out[start : start + step] = fmt.dequantize_rows(raw[start : start + step], row_length)
    return out.reshape(shape)
