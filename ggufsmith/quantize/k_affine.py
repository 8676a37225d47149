"""Q2_K, Q4_K and Q5_K: 256-weight super-blocks of sub-blocks stored as d_j * q - m_j, bit-exact
with ggml.

Each sub-block (16 weights for Q2_K, 32 for Q4_K/Q5_K) gets its own scale and min from an
iterative search; those are quantized again against one f16 scale and one f16 min per
super-block, and the weights are finally rounded against the quantized scale and min.

Block layouts (little-endian, from ggml-common.h):
    Q2_K: scales[16] (scale | min << 4) | qs[64] (2 bits) | d f16 | dmin f16
    Q4_K: d f16 | dmin f16 | scales[12] (6-bit scales and mins) | qs[128] (4 bits)
    Q5_K: d f16 | dmin f16 | scales[12] | qh[32] (5th bits) | qs[128]

Without an importance matrix ggml uses quantize_row_q*_K_ref (make_qkx2_quants, max-based
super-block scales); with one, quantize_row_q*_K_impl (make_qkx3_quants with weights
imatrix * sqrt(sigma2 + x^2), then make_qp_quants for the super-block scales).

All sub-blocks of a chunk are searched at once in position-major layout (see search_affine);
temporaries are a few float32 arrays of the chunk's size.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.registry import K_QUANT_CHUNK_ELEMENTS, QuantFormat, register
from ggufsmith.quantize.numerics import (
    F32,
    NEAREST_INT_EXACT,
    clamp,
    float_warnings_off,
    fp16_bits,
    fp16_value,
    importance_by_position,
    nearest_int,
    nearest_int_clipped,
    position_major,
    sum_from_first,
)
from ggufsmith.quantize.search_affine import make_qkx_quants, make_qp_quants


def _imatrix_weights(rows: np.ndarray, x: np.ndarray, importance: np.ndarray, sigma_factor: int) -> np.ndarray:
    """importance * sqrt(sigma2 + x^2) for x in position-major layout, sigma2 being sigma_factor
    times the mean square of the super-block."""
    sub = x.shape[0]
    per_super = QK_K // sub
    squares = x * x
    # The super-block's sum of squares in C order (sub-block j, then position i), from x's layout
    # [i, super-block * per_super + j]: the squares reordered to rows j * sub + i (one copy), then
    # summed row after row.
    in_c_order = squares.reshape(sub, -1, per_super).transpose(2, 0, 1).reshape(QK_K, -1)
    total = sum_from_first(in_c_order)
    sigma2 = F32(sigma_factor) * total / F32(QK_K)
    squares += np.repeat(sigma2, per_super)[None, :]
    np.sqrt(squares, out=squares)
    squares *= importance_by_position(importance, sub, rows.shape[0])
    return squares


def _requantize(rows: np.ndarray, levels: np.ndarray, d: np.ndarray, dm: np.ndarray, nmax: int) -> np.ndarray:
    """Round every value against its sub-block's stored scale d and min dm, as float32
    [sub-blocks, n]: on the rows as sub-blocks (rows [sub-blocks, n]; d, dm [sub-blocks]), so
    that the levels come out in the values' own order, ready to pack (a uint8 transpose of the
    search's position-major levels cost ~3% of Q4_K's time). Sub-blocks with d == 0 keep the
    levels of the search (levels [n, sub-blocks]): C skips them."""
    fresh = rows + dm[:, None]
    fresh /= d[:, None]
    if max(np.max(fresh), -np.min(fresh)) <= NEAREST_INT_EXACT:  # False for NaN: then bit by bit
        np.rint(fresh, out=fresh)  # nearest_int in its exact range
        clamp(fresh, 0, nmax)
    else:
        fresh = nearest_int_clipped(fresh, 0, nmax)
    keep = np.flatnonzero(d == 0)  # rare: patched rather than a full-size np.where
    if keep.size:
        fresh[keep] = levels[:, keep].T
    return fresh


def _max_positive(values: np.ndarray) -> np.ndarray:
    """C's `if (v > best) best = v` from best = 0 over axis 1: +0 unless something is positive."""
    best = np.fmax.reduce(values, axis=1)  # a NaN never passes `v > best`
    return np.where(best > 0, best, F32(0))


def _ref_super_scale(values: np.ndarray, top_level: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q*_K_ref's quantization of the sub-block scales (or mins) of each super-block,
    values[n_super, n_sub]: (float16 bits of max / top_level, nearest_int(top_level / max * value)
    stored into uint8 as C does, without a clamp)."""
    top = _max_positive(values)
    inverse = np.where(top > 0, F32(top_level) / top, F32(0))
    stored = nearest_int(inverse[:, None] * values).astype(np.uint8)
    return fp16_bits(top / F32(top_level)), stored


def _imatrix_super_scales(scales, mins, weights, n_sub: int, top_level: int):
    """quantize_row_q*_K_impl's: sub-block scales and mins each quantized by make_qp_quants, weighted
    by the sub-block's total weight. Returns (d bits, dmin bits, ls, lm uint8[n_super, n_sub])."""
    sum_w = sum_from_first(weights).reshape(-1, n_sub).T
    d_block, ls = make_qp_quants(scales.reshape(-1, n_sub).T, top_level, sum_w)
    m_block, lm = make_qp_quants(mins.reshape(-1, n_sub).T, top_level, sum_w)
    return fp16_bits(d_block), fp16_bits(m_block), ls.T.astype(np.uint8), lm.T.astype(np.uint8)


# ---------------------------------------------------------------- Q4_K and Q5_K (8 x 32)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12 scale bytes of Q4_K/Q5_K from 8 scale and 8 min levels (uint8[n, 8] each)."""
    out = np.empty((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return out


def _unpack_scales_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7: (sc, m) as uint8[n, 8]."""
    sc = np.empty((scales.shape[0], 8), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[:, 0:4] = scales[:, 0:4] & 63
    m[:, 0:4] = scales[:, 4:8] & 63
    sc[:, 4:8] = (scales[:, 8:12] & 0x0F) | ((scales[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (scales[:, 8:12] >> 4) | ((scales[:, 4:8] >> 6) << 4)
    return sc, m


def _k4_levels(rows: np.ndarray, importance: np.ndarray | None, nmax: int, rmin: float, nstep: int):
    """Search, super-block scales and final rounding shared by Q4_K and Q5_K.

    Returns (d bits, dmin bits, 12 scale bytes, levels uint8[n_super, 256]).
    """
    n_super = rows.size // QK_K
    x = position_major(rows, 32)  # [32, n_super * 8]
    if importance is None:
        sum_x2 = sum_from_first(x * x)
        av_x = np.sqrt(sum_x2 / F32(32))
        weights = av_x + np.abs(x)
        scales, mins, levels = make_qkx_quants(x, weights, nmax, rmin, 0.1, nstep, False)
        d_bits, ls = _ref_super_scale(scales.reshape(n_super, 8), 63)
        dmin_bits, lm = _ref_super_scale(mins.reshape(n_super, 8), 63)
        # uint8_t ls = nearest_int(...); ls = MIN(63, ls): the byte store comes before the clamp.
        ls = np.minimum(ls, 63)
        lm = np.minimum(lm, 63)
    else:
        weights = _imatrix_weights(rows, x, importance, 2)
        scales, mins, levels = make_qkx_quants(x, weights, nmax, -0.9, 0.05, 36, False)
        d_bits, dmin_bits, ls, lm = _imatrix_super_scales(scales, mins, weights, 8, 63)
        if nmax == 31:  # only Q5_K's impl clamps these
            ls = np.minimum(ls, 63)
            lm = np.minimum(lm, 63)

    packed_scales = _pack_scales_k4(ls, lm)
    sc, m = _unpack_scales_k4(packed_scales)
    d = (fp16_value(d_bits)[:, None] * sc).reshape(-1)
    dm = (fp16_value(dmin_bits)[:, None] * m).reshape(-1)
    levels = _requantize(rows.reshape(-1, 32), levels, d, dm, nmax).astype(np.uint8).reshape(n_super, QK_K)
    return d_bits, dmin_bits, packed_scales, levels


def _header(d_bits: np.ndarray, dmin_bits: np.ndarray) -> np.ndarray:
    return np.stack([d_bits, dmin_bits], axis=1).astype("<u2").view(np.uint8)


@float_warnings_off
def quantize_q4_k(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d_bits, dmin_bits, scales, levels = _k4_levels(rows, importance, 15, -1.0, 20)
    halves = levels.reshape(-1, 4, 2, 32)  # 64-weight groups: first 32 low nibbles, next 32 high
    qs = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([_header(d_bits, dmin_bits), scales, qs], axis=1)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def quantize_q5_k(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d_bits, dmin_bits, scales, levels = _k4_levels(rows, importance, 31, -0.5, 15)
    halves = levels.reshape(-1, 4, 2, 32)
    low = halves & 0x0F
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    fifth = (halves >> 4).astype(np.uint8)  # [n, 4 groups, 2 halves, 32]
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)  # bit 2g + h
    qh = np.bitwise_or.reduce((fifth << shifts[None, :, :, None]).reshape(-1, 8, 32), axis=1)
    out = np.concatenate([_header(d_bits, dmin_bits), scales, qh, qs], axis=1)
    return out.reshape(rows.shape[0], -1)


def _dequantize_k4(d_bits, dmin_bits, scales, levels, shape) -> np.ndarray:
    """d * sc * q - dmin * m per 32-weight sub-block, in ggml's float order."""
    sc, m = _unpack_scales_k4(scales)
    d = fp16_value(d_bits)[:, None] * sc  # [n, 8]
    dm = fp16_value(dmin_bits)[:, None] * m
    values = levels.reshape(-1, 8, 32).astype(F32) * d[:, :, None]
    values -= dm[:, :, None]
    return values.reshape(shape)


@float_warnings_off
def dequantize_q4_k(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 144)
    header = blocks[:, :4].copy().view("<u2")
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    levels = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    return _dequantize_k4(header[:, 0], header[:, 1], blocks[:, 4:16], levels, (data.shape[0], row_length))


@float_warnings_off
def dequantize_q5_k(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 176)
    header = blocks[:, :4].copy().view("<u2")
    qh = blocks[:, 16:48].reshape(-1, 1, 1, 32)
    qs = blocks[:, 48:].reshape(-1, 4, 1, 32)
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)[None, :, :, None]
    fifth = ((qh >> shifts) & 1) << 4
    levels = np.concatenate([qs & 0x0F, qs >> 4], axis=2) | fifth
    return _dequantize_k4(header[:, 0], header[:, 1], blocks[:, 4:16], levels, (data.shape[0], row_length))


# ---------------------------------------------------------------- Q2_K (16 x 16)


@float_warnings_off
def quantize_q2_k(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_super = rows.size // QK_K
    x = position_major(rows, 16)  # [16, n_super * 16]
    if importance is None:
        scales, mins, levels = make_qkx_quants(x, np.abs(x), 3, -0.5, 0.1, 15, True)
        # C stores these ints into bytes without a clamp: keep the low bits as it does.
        d_bits, ls = _ref_super_scale(scales.reshape(n_super, 16), 15)
        dmin_bits, lm = _ref_super_scale(mins.reshape(n_super, 16), 15)
    else:
        weights = _imatrix_weights(rows, x, importance, 1)
        scales, mins, levels = make_qkx_quants(x, weights, 3, -0.9, 0.05, 36, False)
        d_bits, dmin_bits, ls, lm = _imatrix_super_scales(scales, mins, weights, 16, 15)

    packed_scales = ls | (lm << 4)
    d = (fp16_value(d_bits)[:, None] * (packed_scales & 0x0F)).reshape(-1)
    dm = (fp16_value(dmin_bits)[:, None] * (packed_scales >> 4)).reshape(-1)
    levels = _requantize(rows.reshape(-1, 16), levels, d, dm, 3)
    # 128-weight halves: byte l holds weights l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7
    quarters = levels.astype(np.uint8).reshape(n_super, 2, 4, 32)
    qs = quarters[:, :, 0] | (quarters[:, :, 1] << 2) | (quarters[:, :, 2] << 4) | (quarters[:, :, 3] << 6)
    out = np.concatenate([packed_scales, qs.reshape(n_super, 64), _header(d_bits, dmin_bits)], axis=1)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def dequantize_q2_k(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 84)
    scales = blocks[:, :16]
    qs = blocks[:, 16:80].reshape(-1, 2, 1, 32)
    header = blocks[:, 80:84].copy().view("<u2")
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    levels = ((qs >> shifts) & 3).reshape(-1, 16, 16)  # [n, sub-block, 16]
    d = fp16_value(header[:, 0])[:, None] * (scales & 0x0F)
    dm = fp16_value(header[:, 1])[:, None] * (scales >> 4)
    values = levels.astype(F32) * d[:, :, None]
    values -= dm[:, :, None]
    return values.reshape(data.shape[0], row_length)


register(
    QuantFormat(
        GGMLType.Q4_K, quantize_q4_k, dequantize_q4_k, supports_importance=True, chunk_elements=K_QUANT_CHUNK_ELEMENTS
    )
)
register(
    QuantFormat(
        GGMLType.Q5_K, quantize_q5_k, dequantize_q5_k, supports_importance=True, chunk_elements=K_QUANT_CHUNK_ELEMENTS
    )
)
register(
    QuantFormat(
        GGMLType.Q2_K, quantize_q2_k, dequantize_q2_k, supports_importance=True, chunk_elements=K_QUANT_CHUNK_ELEMENTS
    )
)
