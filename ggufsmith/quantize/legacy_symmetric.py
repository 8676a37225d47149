"""Q8_0, Q4_0 and Q5_0: blocks of 32 values sharing one float16 scale, no offset.

Without an importance vector these follow ggml's quantize_row_*_ref (scale from the value of
largest magnitude, truncating casts); with one, Q4_0 and Q5_0 follow quantize_row_q4_0_impl /
q5_0_impl (per-value weights imatrix * sqrt(row variance + x^2), scale from make_qx_quants).
Q8_0 accepts an importance vector and ignores it, as ggml does.

Every step is a numpy operation over all blocks of the chunk at once; the registry hands us at
most ~1M values, so temporaries stay within a few copies of 4 MiB.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.registry import QuantFormat, register
from ggufsmith.quantize.search_symmetric import from_position_major, ieee_quiet, make_qx_quants, to_position_major

BLOCK = 32
HALF = BLOCK // 2


# The float32 just below 0.5. Adding it with the value's sign and truncating is C's roundf (halves
# away from zero) for |value| < 2**22; np.rint would round halves to even.
_JUST_BELOW_HALF = np.float32(0.49999997)


def _block_abs_max(blocks: np.ndarray) -> np.ndarray:
    """max |x| of each block of 32. Non-negative floats order as their bit patterns, and an
    integer reduceat over the flat array is several times faster than a float .max(axis=1)."""
    magnitudes = (blocks.view(np.uint32) & np.uint32(0x7FFFFFFF)).reshape(-1)
    starts = np.arange(0, magnitudes.size, BLOCK)
    return np.maximum.reduceat(magnitudes, starts).view(np.float32)


def _any_per_block(mask: np.ndarray) -> np.ndarray:
    """mask.any(axis=1) for bool[blocks, 32], through 8-byte words."""
    words = np.ascontiguousarray(mask).view(np.uint64)
    return (words[:, 0] | words[:, 1] | words[:, 2] | words[:, 3]) != 0


def _block_signed_max(blocks: np.ndarray) -> np.ndarray:
    """The value of largest magnitude in each block, the first one if several, +0.0 for a block of
    zeros: ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` starting from 0."""
    amax = _block_abs_max(blocks)
    positive = _any_per_block(blocks == amax[:, None])
    negative = _any_per_block(blocks == -amax[:, None])
    signed = np.where(negative & ~positive, -amax, amax)
    ties = np.flatnonzero(positive & negative & (amax > 0))
    if ties.size:
        first = np.argmax(np.abs(blocks[ties]) == amax[ties, None], axis=1)
        signed[ties] = blocks[ties, first]
    return signed


def _inverse_or_zero(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, np.float32(1) / d, np.float32(0))


def _zero_overflowed_blocks(scaled: np.ndarray, inv: np.ndarray) -> None:
    """1/d overflows to Inf for a subnormal d, making x/d Inf or NaN; ggml's float-to-int cast turns
    those into 0 on x86. Any other block has |x/d| <= 2**bits, so only these need care."""
    overflowed = ~np.isfinite(inv)
    if overflowed.any():
        scaled[overflowed] = 0


def _scale_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype("<f2").view(np.uint8).reshape(-1, 2)


def _row_weights(rows: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """imatrix * sqrt(sigma2 + x^2), sigma2 the row's mean square summed in order as ggml does."""
    squares = rows * rows
    sigma2 = np.cumsum(squares, axis=1, dtype=np.float32)[:, -1] / np.float32(rows.shape[1])
    return importance[None, :] * np.sqrt(sigma2[:, None] + squares)


# --- Q8_0: int8 values, d = amax / 127 -----------------------------------------------------------


@ieee_quiet
def _q8_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_rows = rows.shape[0]
    blocks = rows.reshape(-1, BLOCK)
    d = _block_abs_max(blocks) / np.float32(127)
    inv = _inverse_or_zero(d)
    scaled = blocks * inv[:, None]
    _zero_overflowed_blocks(scaled, inv)
    scaled += np.copysign(_JUST_BELOW_HALF, scaled)
    out = np.empty((blocks.shape[0], 2 + BLOCK), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    np.copyto(out[:, 2:].view(np.int8), scaled, casting="unsafe")  # truncates, completing roundf
    return out.reshape(n_rows, -1)


@ieee_quiet
def _q8_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + BLOCK)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    values = blocks[:, 2:].view(np.int8).astype(np.float32) * d
    return values.reshape(data.shape[0], row_length)


# --- Q4_0 and Q5_0: d = max / -2^(bits-1), the value of largest magnitude maps to level 0 --------


def _levels_ref(rows: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q{4,5}_0_ref: (d float32[blocks], levels uint8[blocks, 32] in 0 .. 2^bits-1)."""
    blocks = rows.reshape(-1, BLOCK)
    half_range = 1 << (bits - 1)
    d = _block_signed_max(blocks) / np.float32(-half_range)
    inv = _inverse_or_zero(d)
    shifted = blocks * inv[:, None]
    shifted += np.float32(half_range + 0.5)
    _zero_overflowed_blocks(shifted, inv)
    # MIN(2**bits - 1, (int8_t)shifted): the cast truncates toward zero. Outside overflowed blocks
    # |x / d| <= 2**(bits-1) * (1 + 2**-21), so the cast gives 0 .. 2**bits and only 2**bits needs
    # lowering by one: a shift and a subtract, several times faster than np.minimum on uint8.
    levels = shifted.astype(np.int8).view(np.uint8)
    levels -= levels >> bits
    return d, levels


def _levels_weighted(rows: np.ndarray, importance: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q{4,5}_0_impl with quant_weights: make_qx_quants per block."""
    weights = _row_weights(rows, importance)
    x = to_position_major(rows.reshape(-1, BLOCK))
    w = to_position_major(weights.reshape(-1, BLOCK))
    d, levels = make_qx_quants(x, 1 << (bits - 1), w)
    return d, from_position_major(levels)


def _levels(rows: np.ndarray, importance: np.ndarray | None, bits: int) -> tuple[np.ndarray, np.ndarray]:
    if importance is None:
        return _levels_ref(rows, bits)
    return _levels_weighted(rows, importance, bits)


@ieee_quiet
def _q4_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 4)
    out = np.empty((levels.shape[0], 2 + HALF), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    levels[:, HALF:] <<= 4
    np.bitwise_or(levels[:, :HALF], levels[:, HALF:], out=out[:, 2:])
    return out.reshape(rows.shape[0], -1)


@ieee_quiet
def _q5_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 5)
    out = np.empty((levels.shape[0], 2 + 4 + HALF), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    # qh: bit j of the little-endian uint32 is the 5th bit of value j.
    out[:, 2:6] = np.packbits(levels >> 4, axis=1, bitorder="little")
    out[:, 6:] = (levels[:, :HALF] & 0x0F) | ((levels[:, HALF:] & 0x0F) << 4)
    return out.reshape(rows.shape[0], -1)


def _signed_values(levels: np.ndarray, d: np.ndarray, offset: int, n_rows: int, row_length: int) -> np.ndarray:
    # ggml: (int)(level - offset) * d, one float32 rounding.
    values = (levels.astype(np.int8) - np.int8(offset)).astype(np.float32) * d[:, None]
    return values.reshape(n_rows, row_length)


@ieee_quiet
def _q4_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + HALF)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    packed = blocks[:, 2:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=1)
    return _signed_values(levels, d, 8, data.shape[0], row_length)


@ieee_quiet
def _q5_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + 4 + HALF)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    high = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little") << 4
    packed = blocks[:, 6:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=1) | high
    return _signed_values(levels, d, 16, data.shape[0], row_length)


# ggml's quantize_q8_0 takes an imatrix and ignores it; so do we, so that one imatrix can be passed
# for every tensor of a mixed-type conversion.
register(QuantFormat(GGMLType.Q8_0, _q8_0_quantize, _q8_0_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.Q4_0, _q4_0_quantize, _q4_0_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.Q5_0, _q5_0_quantize, _q5_0_dequantize, supports_importance=True))
