"""IQ4_NL and IQ4_XS: 4-bit indices into ggml's non-linear table of 16 levels (kvalues_iq4nl).

Both follow ggml's quantize_row_iq4_nl_impl as ggml_quantize_chunk calls it (15 extra trial scales
per block of 32, with or without an importance matrix):

- weights: imatrix * sqrt(sigma2 + x^2), sigma2 = 2 * mean square of the super-block (32 values
  for IQ4_NL, 256 for IQ4_XS); without an imatrix, x^2.
- each block of 32: first scale max / 127 (the value of largest magnitude on the table's -127
  end), then the scales (itry - 127) / max for itry in -7 .. 7; every candidate maps each value to
  its nearest level and keeps the least-squares scale sum(w q x) / sum(w q^2) of the candidate
  with the largest sum(w q x)^2 / sum(w q^2).
- IQ4_NL stores that scale as float16 and the nearest levels for it. IQ4_XS stores one float16
  super-scale d = -max_scale / 32 (max_scale: the block scale of largest magnitude) and a 6-bit
  l in -32 .. 31 per block (block scale d * l), and the nearest levels for d * l.

Everything is computed position-major (numerics.py) on all blocks of a chunk at once, with ggml's
float32 sums in order; degenerate blocks (all zero, subnormal, overflowing squares) go through the
same IEEE operations as in C.

Layouts (ggml-common.h): IQ4_NL = float16 d, qs[16]; IQ4_XS = float16 d, uint16 scales_h,
scales_l[4], qs[128]; a byte of qs holds level j (low nibble) and j + 16 (high) of its 32.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.numerics import (
    F32,
    GROUP_MAX_EPS,
    float_warnings_off,
    fp16_bits,
    fp16_value,
    importance_by_position,
    nearest_int,
    position_major,
    signed_max_abs,
    sum_from_zero,
    transposed,
)
from ggufsmith.quantize.registry import QuantFormat, register

BLOCK = 32
SUB_BLOCKS = QK_K // BLOCK  # blocks of 32 per IQ4_XS super-block
# ggml-common.h's kvalues_iq4nl, ascending.
LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_LEVELS_F32 = LEVELS.astype(F32)
# ggml's ntry for quantize_iq4_nl / quantize_iq4_xs: trial scales (itry + LEVELS[0]) / max.
_TRIES = 7
# The level every zero maps to (the first one above 0), as best_index_int8(0.0) picks it.
_ZERO_LEVEL = 8
_IQ4_NL_BYTES = 2 + BLOCK // 2
_IQ4_XS_BYTES = 2 + 2 + SUB_BLOCKS // 2 + QK_K // 2


def _reference_nearest_level(v: np.float32) -> int:
    """best_index_int8 for one float32, literally: the building block of the tables below."""
    if v <= _LEVELS_F32[0]:
        return 0
    if v >= _LEVELS_F32[-1]:
        return LEVELS.size - 1
    upper = int(np.searchsorted(_LEVELS_F32, v, side="right"))
    return upper - 1 if (v - _LEVELS_F32[upper - 1]) < (_LEVELS_F32[upper] - v) else upper


def _first_rounding_up(lower: int) -> np.float32:
    """The smallest float32 between levels `lower` and `lower + 1` that goes to the upper one.
    `v - lo < hi - v` is monotone in v, and float32 rounding moves its flip at most a few ulps
    from the midpoint: walk there from the midpoint."""
    v = np.float32((int(LEVELS[lower]) + int(LEVELS[lower + 1])) / 2)
    while _reference_nearest_level(v) != lower:
        v = np.nextafter(v, np.float32(-np.inf))
    while _reference_nearest_level(v) == lower:
        v = np.nextafter(v, np.float32(np.inf))
    return v


def _bin_tables() -> tuple[np.ndarray, np.ndarray]:
    """For every integer t in [LEVELS[0] - 1, LEVELS[-1]]: (the level of t, the float32 in (t, t + 1)
    where the level goes one up, or NaN, which no value reaches, not even +Inf). Levels are integers at least 11 apart, so a unit interval
    holds at most one such boundary, and the level of v is found from floor(v) with two look-ups."""
    first = int(LEVELS[0]) - 1
    bins = np.arange(first, int(LEVELS[-1]) + 1)
    base = np.array([_reference_nearest_level(np.float32(t)) for t in bins], dtype=np.uint8)
    boundary = np.full(bins.size, np.nan, dtype=F32)
    for lower in range(LEVELS.size - 1):
        b = _first_rounding_up(lower)
        t = int(np.floor(b))
        if b != t:
            boundary[t - first] = b
    return base, boundary


_BIN_BASE, _BIN_BOUNDARY = _bin_tables()
_FIRST_BIN, _LAST_BIN = F32(int(LEVELS[0]) - 1), F32(int(LEVELS[-1]))


def nearest_levels(scaled: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8(16, kvalues_iq4nl, v) for every v, as uint8 indices: the nearest
    level, the lower one only if v - lower < upper - v in float32, 0 at or below the first level,
    15 at or above the last and for NaN (which fails every comparison in C)."""
    bins = np.floor(scaled)
    np.clip(bins, _FIRST_BIN, _LAST_BIN, out=bins)
    bins -= _FIRST_BIN
    index = bins.astype(np.intp)
    levels = _BIN_BASE.take(index, mode="clip")
    levels += scaled >= _BIN_BOUNDARY.take(index, mode="clip")
    nan = np.isnan(scaled)
    if nan.any():
        levels[nan] = LEVELS.size - 1
    return levels


def _weighted_sums(x: np.ndarray, weights: np.ndarray, inverse_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum w q x, sum w q^2) per block, q the nearest level of inverse_scale * x, summed in order."""
    q = _LEVELS_F32[nearest_levels(x * inverse_scale)]
    wq = weights * q
    return sum_from_zero(wq * x), sum_from_zero(wq * q)


def block_scales(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The scale ggml's trial search picks for every block of 32: float32[blocks] from
    position-major x and weights [32, blocks]; 0 for a block whose largest |x| is below 1e-15."""
    amax, signed_max = signed_max_abs(x, finite=True)
    # -max / LEVELS[0]: the value of largest magnitude lands on level 0 (-127).
    scale = signed_max / F32(-LEVELS[0])
    sum_qx, sum_q2 = _weighted_sums(x, weights, F32(1) / scale)
    scale = np.where(sum_q2 > 0, sum_qx / sum_q2, F32(0))
    best = scale * sum_qx
    for itry in range(-_TRIES, _TRIES + 1):
        sum_qx, sum_q2 = _weighted_sums(x, weights, F32(itry + int(LEVELS[0])) / signed_max)
        better = (sum_q2 > 0) & (sum_qx * sum_qx > best * sum_q2)
        scale = np.where(better, sum_qx / sum_q2, scale)
        best = np.where(better, scale * sum_qx, best)
    scale[amax < GROUP_MAX_EPS] = 0
    return scale


def _weights(x: np.ndarray, rows: np.ndarray, importance: np.ndarray | None, super_block: int) -> np.ndarray:
    """Per value of position-major x [32, blocks]: x^2, or imatrix * sqrt(sigma2 + x^2) with sigma2 =
    2/super_block * (sum of x^2 over the super-block, in order)."""
    squares = x * x
    if importance is None:
        return squares
    columns = position_major(rows, super_block)
    sigma2 = sum_from_zero(columns * columns) * F32(2 / super_block)
    sigma2 = np.repeat(sigma2, super_block // BLOCK)
    return importance_by_position(importance, BLOCK, rows.shape[0]) * np.sqrt(sigma2 + squares)


def _inverse_or_zero(d: np.ndarray) -> np.ndarray:
    """C's `d ? 1/d : 0` (NaN is true there, so its inverse is NaN)."""
    inverse = np.zeros_like(d)
    np.divide(F32(1), d, out=inverse, where=d != 0)
    return inverse


def _pack_levels(levels: np.ndarray) -> np.ndarray:
    """uint8[32, blocks] position-major -> uint8[blocks, 16]: byte j = level j | level j + 16 << 4."""
    by_block = transposed(levels)
    return by_block[:, : BLOCK // 2] | (by_block[:, BLOCK // 2 :] << 4)


# --- IQ4_NL ------------------------------------------------------------------------------------


@float_warnings_off
def _iq4_nl_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    x = position_major(rows, BLOCK)
    scale = block_scales(x, _weights(x, rows, importance, BLOCK))
    levels = nearest_levels(x * _inverse_or_zero(scale))
    out = np.empty((scale.size, _IQ4_NL_BYTES), dtype=np.uint8)
    out[:, :2] = fp16_bits(scale).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = _pack_levels(levels)
    return out.reshape(rows.shape[0], -1)


def _unpack_levels(packed: np.ndarray) -> np.ndarray:
    """uint8[..., 16] -> the 32 table values, as float32 [..., 32]."""
    return _LEVELS_F32[np.concatenate([packed & 0x0F, packed >> 4], axis=-1)]


@float_warnings_off
def _iq4_nl_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _IQ4_NL_BYTES)
    d = fp16_value(blocks[:, :2].copy().view(np.uint16)[:, 0])
    return (d[:, None] * _unpack_levels(blocks[:, 2:])).reshape(data.shape[0], row_length)


# --- IQ4_XS ------------------------------------------------------------------------------------


@float_warnings_off
def _iq4_xs_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    x = position_major(rows, BLOCK)
    scales = block_scales(x, _weights(x, rows, importance, QK_K))
    n_super = scales.size // SUB_BLOCKS
    # The block scale of largest magnitude, the first of ties, +0.0 if all are zero; NaN never wins.
    _, max_scale = signed_max_abs(np.ascontiguousarray(scales.reshape(n_super, SUB_BLOCKS).T))
    d = -max_scale / F32(32)
    inverse = np.repeat(_inverse_or_zero(d), SUB_BLOCKS)
    block_levels = np.clip(nearest_int(inverse * scales), -32, 31)
    block_d = np.repeat(d, SUB_BLOCKS) * block_levels.astype(F32)
    levels = nearest_levels(x * _inverse_or_zero(block_d))

    stored = (block_levels + 32).astype(np.uint16).reshape(n_super, SUB_BLOCKS)
    out = np.empty((n_super, _IQ4_XS_BYTES), dtype=np.uint8)
    out[:, :2] = fp16_bits(d).view(np.uint8).reshape(-1, 2)
    # scales_h: bits 2*ib, 2*ib+1 of a little-endian uint16 are the top two bits of block ib's l.
    high = np.zeros(n_super, dtype=np.uint16)
    for ib in range(SUB_BLOCKS):
        high |= (stored[:, ib] >> 4) << (2 * ib)
    out[:, 2:4] = high.astype("<u2").view(np.uint8).reshape(-1, 2)
    low = (stored & 0x0F).astype(np.uint8)
    out[:, 4:8] = low[:, 0::2] | (low[:, 1::2] << 4)
    out[:, 8:] = _pack_levels(levels).reshape(n_super, -1)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq4_xs_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _IQ4_XS_BYTES)
    d = fp16_value(blocks[:, :2].copy().view(np.uint16)[:, 0])
    high = blocks[:, 2:4].copy().view("<u2")[:, 0]
    low = blocks[:, 4:8]
    shifts = np.arange(SUB_BLOCKS)
    stored = ((low[:, shifts // 2] >> (4 * (shifts % 2))) & 0x0F) | (((high[:, None] >> (2 * shifts)) & 3) << 4).astype(np.uint8)
    block_d = d[:, None] * (stored.astype(np.int8) - np.int8(32)).astype(F32)  # [supers, 8]
    values = block_d[:, :, None] * _unpack_levels(blocks[:, 8:].reshape(-1, SUB_BLOCKS, BLOCK // 2))
    return values.reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.IQ4_NL, _iq4_nl_quantize, _iq4_nl_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.IQ4_XS, _iq4_xs_quantize, _iq4_xs_dequantize, supports_importance=True))
