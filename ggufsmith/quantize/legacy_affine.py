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
from ggufsmith.quantize.search_affine import (
    F32,
    first_max,
    first_min,
    float_exceptions_expected,
    fp16_bits,
    fp16_value,
    make_qkx_quants,
    seq_sum,
)

BLOCK = 32


def _ref_levels(rows: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, min, rounded int32 levels) of quantize_row_q{4,5}_1_ref for blocks[n_blocks, 32]."""
    blocks = rows.reshape(-1, BLOCK)
    low = first_min(blocks, axis=1)
    high = first_max(blocks, axis=1)
    d = (high - low) / F32(nmax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_d = np.where(d != 0, F32(1) / d, F32(0))
        scaled = (blocks - low[:, None]) * inv_d[:, None]
        scaled += F32(0.5)
        # C converts with truncation toward zero (cvttss2si: NaN and out-of-range give INT_MIN).
        levels = scaled.astype(np.int32)
    return d, low, levels


def _imatrix_levels(rows: np.ndarray, importance: np.ndarray, nmax: int):
    """(d, min, levels[n_blocks, 32]) of quantize_row_q{4,5}_1_impl with quant_weights."""
    n_rows, row_length = rows.shape
    sigma2 = seq_sum(rows.T * rows.T) / F32(row_length)
    # position-major: x[i, block] is element i of each block; the blocks of a row share sigma2.
    x = rows.reshape(n_rows, -1, BLOCK).transpose(2, 0, 1).reshape(BLOCK, -1)
    qw = np.broadcast_to(importance.reshape(-1, BLOCK).T[:, None, :], (BLOCK, n_rows, row_length // BLOCK))
    s2 = np.repeat(sigma2, row_length // BLOCK)[None, :]
    weights = qw.reshape(BLOCK, -1) * np.sqrt(s2 + x * x)
    scale, the_min, levels = make_qkx_quants(x, weights, nmax, -0.9, 0.05, 36, False)
    return scale, -the_min, levels.T.astype(np.int32)


def _header(d: np.ndarray, low: np.ndarray) -> np.ndarray:
    return np.stack([fp16_bits(d), fp16_bits(low)], axis=1).view(np.uint8)


@float_exceptions_expected
def quantize_q4_1(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_rows = rows.shape[0]
    if importance is None:
        d, low, levels = _ref_levels(rows, 15)
        levels = np.minimum(levels.astype(np.int8), 15).astype(np.uint8)  # MIN(15, (int8_t)v)
    else:
        d, low, levels = _imatrix_levels(rows, importance, 15)
        levels = levels.astype(np.uint8)
    qs = levels[:, :16] | (levels[:, 16:] << 4)
    out = np.concatenate([_header(d, low), qs], axis=1)
    return out.reshape(n_rows, -1)


@float_exceptions_expected
def quantize_q5_1(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_rows = rows.shape[0]
    if importance is None:
        d, low, levels = _ref_levels(rows, 31)
    else:
        d, low, levels = _imatrix_levels(rows, importance, 31)
    levels = levels.astype(np.uint8)  # (uint8_t) keeps the low byte
    qs = (levels[:, :16] & 0x0F) | ((levels[:, 16:] & 0x0F) << 4)
    high_bits = ((levels >> 4) & 1).astype(np.uint32) << np.arange(BLOCK, dtype=np.uint32)
    qh = np.bitwise_or.reduce(high_bits, axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)
    out = np.concatenate([_header(d, low), qh, qs], axis=1)
    return out.reshape(n_rows, -1)


def _dequantize(d_bits: np.ndarray, m_bits: np.ndarray, levels: np.ndarray, shape) -> np.ndarray:
    d = fp16_value(d_bits)[:, None]
    m = fp16_value(m_bits)[:, None]
    values = levels.astype(F32) * d
    values += m
    return values.reshape(shape)


@float_exceptions_expected
def dequantize_q4_1(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 20)
    header = blocks[:, :4].copy().view("<u2")
    qs = blocks[:, 4:]
    levels = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return _dequantize(header[:, 0], header[:, 1], levels, (data.shape[0], row_length))


@float_exceptions_expected
def dequantize_q5_1(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 24)
    header = blocks[:, :4].copy().view("<u2")
    qh = blocks[:, 4:8].copy().view("<u4")
    qs = blocks[:, 8:]
    high = ((qh >> np.arange(BLOCK, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    levels = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | high
    return _dequantize(header[:, 0], header[:, 1], levels, (data.shape[0], row_length))


register(QuantFormat(GGMLType.Q4_1, quantize_q4_1, dequantize_q4_1, supports_importance=True))
register(QuantFormat(GGMLType.Q5_1, quantize_q5_1, dequantize_q5_1, supports_importance=True))
