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
from ggufsmith.quantize.numerics import (
    float_warnings_off,
    largest_magnitudes,
    position_major,
    signed_max_of_finite,
    sum_of_squares_by_row,
    transposed,
)
from ggufsmith.quantize.search_symmetric import make_qx_quants

BLOCK = 32
HALF = BLOCK // 2


# The float32 just below 0.5. Adding it with the value's sign and truncating is C's roundf (halves
# away from zero) for |value| < 2**22; np.rint would round halves to even.
_JUST_BELOW_HALF = np.float32(0.49999997)


def _largest_magnitudes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numerics.largest_magnitudes of each block of 32, from integer reduceats over the flat data."""
    flat = blocks.reshape(-1)
    starts = np.arange(0, flat.size, BLOCK)
    return largest_magnitudes(
        np.maximum.reduceat(flat.view(np.int32), starts), np.maximum.reduceat(flat.view(np.uint32), starts)
    )


def _block_abs_max(blocks: np.ndarray) -> np.ndarray:
    """max |x| of each block of 32."""
    return np.maximum(*_largest_magnitudes(blocks)).view(np.float32)


def _block_signed_max(blocks: np.ndarray) -> np.ndarray:
    """The value of largest magnitude in each block, the first one if several, +0.0 for a block of
    zeros: ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` starting from 0."""
    return signed_max_of_finite(*_largest_magnitudes(blocks), lambda tied: blocks[tied].T)


def _inverse_or_zero(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, np.float32(1) / d, np.float32(0))


def _zero_overflowed_blocks(scaled: np.ndarray, inv: np.ndarray) -> None:
    """1/d overflows to Inf for a subnormal d, making x/d Inf or NaN; ggml's float-to-int cast turns
    those into 0 on x86. Any other block has |x/d| <= 2**bits, so only these need care."""
    overflowed = ~np.isfinite(inv)
    if overflowed.any():
        scaled[overflowed] = 0


def _store_scales(out: np.ndarray, d: np.ndarray) -> None:
    """Write each block's float16 d into the first two bytes of its row of `out`, through a uint16
    view (one strided element per block is much faster than a 2-byte-wide copy)."""
    out.view(np.uint16)[:, 0] = d.astype("<f2").view(np.uint16)


def _row_weights(rows: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """imatrix * sqrt(sigma2 + x^2), sigma2 the row's mean square summed in order as ggml does."""
    sigma2 = sum_of_squares_by_row(rows) / np.float32(rows.shape[1])
    return importance[None, :] * np.sqrt(sigma2[:, None] + rows * rows)


# --- Q8_0: int8 values, d = amax / 127 -----------------------------------------------------------


@float_warnings_off
def _q8_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_rows = rows.shape[0]
    blocks = rows.reshape(-1, BLOCK)
    d = _block_abs_max(blocks) / np.float32(127)
    inv = _inverse_or_zero(d)
    scaled = blocks * inv[:, None]
    _zero_overflowed_blocks(scaled, inv)
    scaled += np.copysign(_JUST_BELOW_HALF, scaled)
    out = np.empty((blocks.shape[0], 2 + BLOCK), dtype=np.uint8)
    _store_scales(out, d)
    np.copyto(out[:, 2:].view(np.int8), scaled, casting="unsafe")  # truncates, completing roundf
    return out.reshape(n_rows, -1)


@float_warnings_off
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
    x = position_major(rows, BLOCK)
    w = position_major(weights, BLOCK)
    d, levels = make_qx_quants(x, 1 << (bits - 1), w)
    return d, transposed(levels)


def _levels(rows: np.ndarray, importance: np.ndarray | None, bits: int) -> tuple[np.ndarray, np.ndarray]:
    if importance is None:
        return _levels_ref(rows, bits)
    return _levels_weighted(rows, importance, bits)


# Levels are packed eight bytes at a time through uint64 views: no level has bits above its width,
# so shifts never carry into the neighbouring byte.
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_BITS = np.uint64(0x0101010101010101)
# Multiplying eight 0/1 bytes by this gathers them into the top byte, byte i as bit i.
_GATHER_BITS = np.uint64(0x0102040810204080)


def _pack_nibbles(levels: np.ndarray, out: np.ndarray, mask: bool) -> None:
    """Byte j of out's rows = (levels[:, j] & 15) | (levels[:, j + 16] & 15) << 4 for levels
    uint8[blocks, 32] (`mask=False` when every level is below 16 already); out is a uint16[blocks, 8]
    view, so that the copy moves 2 bytes at a time.

    Word k of a block's 8-byte words pairs with word k + 2; each of the two pairings runs as one
    long strided loop, much faster than numpy's loops over rows of 2 words."""
    words = levels.reshape(-1).view(np.uint64)
    packed = np.empty((levels.shape[0], 2), dtype=np.uint64)
    for k in (0, 1):
        high, low = words[2 + k :: 4], words[k::4]
        if mask:
            high, low = high & _LOW_NIBBLES, low & _LOW_NIBBLES
        np.left_shift(high, np.uint64(4), out=packed[:, k])
        packed[:, k] |= low
    out[...] = packed.view(np.uint16)


@float_warnings_off
def _q4_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 4)
    out = np.empty((levels.shape[0], 2 + HALF), dtype=np.uint8)
    _store_scales(out, d)
    _pack_nibbles(np.ascontiguousarray(levels), out.view(np.uint16)[:, 1:], mask=False)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _q5_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 5)
    levels = np.ascontiguousarray(levels)
    out = np.empty((levels.shape[0], 2 + 4 + HALF), dtype=np.uint8)
    _store_scales(out, d)
    # qh: bit j of the little-endian uint32 is the 5th bit of value j, so byte k gathers the 5th
    # bits of values 8k .. 8k+7.
    fifth = levels.view(np.uint64) >> np.uint64(4)
    fifth &= _LOW_BITS
    fifth *= _GATHER_BITS
    fifth >>= np.uint64(56)
    out[:, 2:6] = fifth
    _pack_nibbles(levels, out.view(np.uint16)[:, 3:], mask=True)
    return out.reshape(rows.shape[0], -1)


def _signed_values(levels: np.ndarray, d: np.ndarray, offset: int, n_rows: int, row_length: int) -> np.ndarray:
    # ggml: (int)(level - offset) * d, one float32 rounding.
    values = (levels.astype(np.int8) - np.int8(offset)).astype(np.float32) * d[:, None]
    return values.reshape(n_rows, row_length)


@float_warnings_off
def _q4_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + HALF)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    packed = blocks[:, 2:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=1)
    return _signed_values(levels, d, 8, data.shape[0], row_length)


@float_warnings_off
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
