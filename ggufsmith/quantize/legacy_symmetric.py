"""Q8_0, Q4_0 and Q5_0: blocks of 32 values sharing one float16 scale, no offset.

Without an importance vector these follow ggml's quantize_row_*_ref (scale from the value of
largest magnitude, truncating casts); with one, Q4_0 and Q5_0 follow quantize_row_q4_0_impl /
q5_0_impl (per-value weights imatrix * sqrt(row variance + x^2), scale from make_qx_quants).
Q8_0 ignores importance in ggml too, so it does not accept any.

Every step is a numpy operation over all blocks of the chunk at once; the registry hands us at
most ~1M values, so temporaries stay within a few copies of 4 MiB.
"""

from __future__ import annotations

import functools

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.registry import QuantFormat, register
from ggufsmith.quantize.search_symmetric import from_position_major, make_qx_quants, to_position_major

BLOCK = 32
HALF = BLOCK // 2


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """C's roundf: halves go away from zero (np.rint would round them to even)."""
    whole = np.trunc(values)
    away = np.abs(values - whole) >= np.float32(0.5)
    return whole + np.copysign(away.astype(np.float32), values)


def _ieee_quiet(func):
    """Run a row function with numpy's float warnings off: for extreme inputs ggml's float32 math
    overflows to Inf and makes NaN (e.g. 1/d of a subnormal d), and we reproduce it, not warn."""

    @functools.wraps(func)
    def quiet(*args):
        with np.errstate(all="ignore"):
            return func(*args)

    return quiet


def _inverse_or_zero(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, np.float32(1) / d, np.float32(0))


def _truncate_to_uint8(values: np.ndarray, top: int) -> np.ndarray:
    """MIN(top, (int8_t)value): the cast truncates toward zero. ggml never feeds it values outside
    0 .. 17 except NaN/Inf from an overflowing 1/d, which x86 (and numpy) cast to 0."""
    as_int = np.where(np.isfinite(values), values, np.float32(0)).astype(np.int32)
    return np.minimum(as_int.astype(np.int8), top).astype(np.uint8)


def _scale_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype("<f2").view(np.uint8).reshape(-1, 2)


def _row_weights(rows: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """imatrix * sqrt(sigma2 + x^2), sigma2 the row's mean square summed in order as ggml does."""
    squares = rows * rows
    sigma2 = np.cumsum(squares, axis=1, dtype=np.float32)[:, -1] / np.float32(rows.shape[1])
    return importance[None, :] * np.sqrt(sigma2[:, None] + squares)


# --- Q8_0: int8 values, d = amax / 127 -----------------------------------------------------------


@_ieee_quiet
def _q8_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_rows = rows.shape[0]
    blocks = rows.reshape(-1, BLOCK)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = _inverse_or_zero(d)
    scaled = blocks * inv[:, None]
    # 1/d overflows for subnormal d; the C cast of the resulting Inf/NaN gives 0 on x86.
    scaled[~np.isfinite(scaled)] = 0
    quants = _round_half_away(scaled).astype(np.int8)
    out = np.empty((blocks.shape[0], 2 + BLOCK), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    out[:, 2:] = quants.view(np.uint8)
    return out.reshape(n_rows, -1)


@_ieee_quiet
def _q8_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + BLOCK)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    values = blocks[:, 2:].view(np.int8).astype(np.float32) * d
    return values.reshape(data.shape[0], row_length)


# --- Q4_0 and Q5_0: d = max / -2^(bits-1), the value of largest magnitude maps to level 0 --------


def _levels_ref(rows: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q{4,5}_0_ref: (d float32[blocks], levels uint8[blocks, 32] in 0 .. 2^bits-1)."""
    blocks = rows.reshape(-1, BLOCK)
    ax = np.abs(blocks)
    first = np.argmax(ax, axis=1)[:, None]
    amax = np.take_along_axis(ax, first, axis=1)[:, 0]
    signed_max = np.where(amax > 0, np.take_along_axis(blocks, first, axis=1)[:, 0], np.float32(0))
    half_range = 1 << (bits - 1)
    d = signed_max / np.float32(-half_range)
    inv = _inverse_or_zero(d)
    shifted = blocks * inv[:, None] + np.float32(half_range + 0.5)
    return d, _truncate_to_uint8(shifted, 2 * half_range - 1)


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


@_ieee_quiet
def _q4_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 4)
    out = np.empty((levels.shape[0], 2 + HALF), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    out[:, 2:] = levels[:, :HALF] | (levels[:, HALF:] << 4)
    return out.reshape(rows.shape[0], -1)


@_ieee_quiet
def _q5_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, levels = _levels(rows, importance, 5)
    high_bits = (levels >> 4).astype(np.uint32) << np.arange(BLOCK, dtype=np.uint32)
    qh = np.bitwise_or.reduce(high_bits, axis=1).astype("<u4")
    out = np.empty((levels.shape[0], 2 + 4 + HALF), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    out[:, 2:6] = qh.view(np.uint8).reshape(-1, 4)
    out[:, 6:] = (levels[:, :HALF] & 0x0F) | ((levels[:, HALF:] & 0x0F) << 4)
    return out.reshape(rows.shape[0], -1)


def _signed_values(levels: np.ndarray, d: np.ndarray, offset: int, n_rows: int, row_length: int) -> np.ndarray:
    # ggml: (int)(level - offset) * d, one float32 rounding.
    values = (levels.astype(np.int8) - np.int8(offset)).astype(np.float32) * d[:, None]
    return values.reshape(n_rows, row_length)


@_ieee_quiet
def _q4_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + HALF)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    packed = blocks[:, 2:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=1)
    return _signed_values(levels, d, 8, data.shape[0], row_length)


@_ieee_quiet
def _q5_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + 4 + HALF)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    qh = blocks[:, 2:6].copy().view("<u4")
    high = ((qh >> np.arange(BLOCK, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    packed = blocks[:, 6:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=1) | high
    return _signed_values(levels, d, 16, data.shape[0], row_length)


register(QuantFormat(GGMLType.Q8_0, _q8_0_quantize, _q8_0_dequantize))
register(QuantFormat(GGMLType.Q4_0, _q4_0_quantize, _q4_0_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.Q5_0, _q5_0_quantize, _q5_0_dequantize, supports_importance=True))
