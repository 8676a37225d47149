"""Q4_1 and Q5_1: blocks of 32 weights stored as d * q + m, q of 4 or 5 bits, bit-exact with ggml.

Block layouts (little-endian, from ggml-common.h):
    Q4_1: d f16 | m f16 | qs[16]             (q[j] low nibble, q[j+16] high nibble)
    Q5_1: d f16 | m f16 | qh u32 | qs[16]    (bit j of qh is bit 4 of q[j])

Without an importance matrix ggml uses quantize_row_q4_1_ref / q5_1_ref: min and max of the block
and a rounding of (x - min) / d. With one it uses make_qkx3_quants with weights
imatrix * sqrt(sigma2 + x^2), sigma2 being the mean square of the whole row.
Temporaries: a few float32 arrays of the chunk's size.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.registry import QuantFormat, register
from ggufsmith.quantize.numerics import (
    F32,
    aligned_empty,
    first_max,
    first_min,
    float_warnings_off,
    fp16_bits,
    fp16_value,
    importance_by_position,
    sum_from_first,
    transposed,
)
from ggufsmith.quantize.search_affine import make_qkx_quants

BLOCK = 32


def _ref_levels(rows: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, min, levels[32, n_blocks] as the bytes C stores) of quantize_row_q{4,5}_1_ref."""
    # Position-major, so that reductions and per-block scalars run along the long axis (fast in
    # numpy) rather than along the 32 elements of a block.
    x = transposed(rows.reshape(-1, BLOCK))
    low = first_min(x)
    high = first_max(x)
    span = high - low
    d = span / F32(nmax)
    inv_d = np.where(d != 0, F32(1) / d, F32(0))
    scaled = np.subtract(x, low, out=aligned_empty(x.shape))
    scaled *= inv_d
    scaled += F32(0.5)
    if np.isfinite(inv_d).all() and np.isfinite(span).all():
        # Then 0.5 <= scaled < nmax + 1 (a finite 1/d means d is precise to 2^-21 even when
        # subnormal), so C's truncating conversion is a plain cast to bytes and Q4_1's MIN(15, .)
        # never binds.
        return d, low, scaled.astype(np.uint8)
    # Degenerate blocks (span overflowing, or 1/d infinite): emulate C's conversion exactly,
    # cvttss2si giving INT_MIN for NaN and out-of-range values, then the byte store.
    wide = scaled.astype(np.int32)
    if nmax == 15:  # MIN(15, (int8_t)v)
        return d, low, np.minimum(wide.astype(np.int8), 15).astype(np.uint8)
    return d, low, wide.astype(np.uint8)


def _imatrix_levels(rows: np.ndarray, importance: np.ndarray, nmax: int):
    """(d, min, levels[32, n_blocks]) of quantize_row_q{4,5}_1_impl with quant_weights."""
    n_rows, row_length = rows.shape
    columns = transposed(rows)
    sigma2 = sum_from_first(columns * columns) / F32(row_length)
    # position-major: x[i, block] is element i of each block; the blocks of a row share sigma2.
    x = transposed(rows.reshape(-1, BLOCK))
    qw = importance_by_position(importance, BLOCK, n_rows)
    s2 = np.repeat(sigma2, row_length // BLOCK)
    weights = qw * np.sqrt(s2 + x * x)
    scale, the_min, levels = make_qkx_quants(x, weights, nmax, -0.9, 0.05, 36, False)
    return scale, -the_min, levels.astype(np.uint8)


def _blocks(n_rows: int, d: np.ndarray, low: np.ndarray, *body: np.ndarray) -> np.ndarray:
    """Rows of blocks from per-block d, m and body bytes given position-major ([bytes, n_blocks])."""
    d16 = fp16_bits(d)
    m16 = fp16_bits(low)
    header = np.stack([d16 & 0xFF, d16 >> 8, m16 & 0xFF, m16 >> 8]).astype(np.uint8)
    return transposed(np.concatenate([header, *body])).reshape(n_rows, -1)


def _levels(rows: np.ndarray, importance: np.ndarray | None, nmax: int):
    if importance is None:
        return _ref_levels(rows, nmax)
    return _imatrix_levels(rows, importance, nmax)


@float_warnings_off
def quantize_q4_1(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, low, levels = _levels(rows, importance, 15)
    qs = levels[:16] | (levels[16:] << 4)
    return _blocks(rows.shape[0], d, low, qs)


@float_warnings_off
def quantize_q5_1(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, low, levels = _levels(rows, importance, 31)
    qs = (levels[:16] & 0x0F) | ((levels[16:] & 0x0F) << 4)
    # bit j of the little-endian u32 qh is bit 4 of level j: byte k gathers levels 8k .. 8k+7
    fifth = ((levels >> 4) & 1).reshape(4, 8, -1)
    qh = fifth[:, 0].copy()
    for bit in range(1, 8):
        qh |= fifth[:, bit] << bit
    return _blocks(rows.shape[0], d, low, qh, qs)


def _dequantize(blocks: np.ndarray, low_nibbles: np.ndarray, high_nibbles: np.ndarray, shape) -> np.ndarray:
    """x = q * d + m per block (ggml's order: the product rounds first); q given as its first and
    second 16 levels, uint8[n_blocks, 16] each."""
    header = blocks[:, :4].copy().view("<u2")
    values = aligned_empty((blocks.shape[0], BLOCK))
    np.copyto(values[:, :16], low_nibbles, casting="unsafe")
    np.copyto(values[:, 16:], high_nibbles, casting="unsafe")
    values *= fp16_value(header[:, 0])[:, None]
    values += fp16_value(header[:, 1])[:, None]
    return values.reshape(shape)


@float_warnings_off
def dequantize_q4_1(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 20)
    qs = blocks[:, 4:]
    return _dequantize(blocks, qs & 0x0F, qs >> 4, (data.shape[0], row_length))


@float_warnings_off
def dequantize_q5_1(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 24)
    qs = blocks[:, 8:]
    high = np.unpackbits(blocks[:, 4:8], axis=1, bitorder="little") << 4
    return _dequantize(blocks, (qs & 0x0F) | high[:, :16], (qs >> 4) | high[:, 16:], (data.shape[0], row_length))


register(QuantFormat(GGMLType.Q4_1, quantize_q4_1, dequantize_q4_1, supports_importance=True))
register(QuantFormat(GGMLType.Q5_1, quantize_q5_1, dequantize_q5_1, supports_importance=True))
