"""Q6_K and Q3_K: super-blocks of 256 values in 16 groups of 16, each group with its own signed
scale, the scales quantized (8 bits in Q6_K, 6 bits in Q3_K) against one float16 super-scale.

Without an importance vector these follow ggml's quantize_row_q6_K_ref / q3_K_ref; with one,
quantize_row_q6_K_impl / q3_K_impl. All groups of a chunk are searched at once (see
search_symmetric); the registry hands us at most ~1M values, so temporaries stay within a few
dozen MiB.
"""

from __future__ import annotations

import math

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.registry import K_QUANT_CHUNK_ELEMENTS, QuantFormat, register
from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    NEAREST_INT_EXACT,
    NonFiniteInput,
    clamp,
    float_warnings_off,
    fp16_round_trip,
    importance_by_position,
    nearest_int,
    position_major,
    round_clamped,
    scratch,
    signed_max_abs,
    sum_from_zero,
    sum_of_squares_by_row,
)
from ggufsmith.quantize.search_q3 import make_q3_quants
from ggufsmith.quantize.search_symmetric import make_qx_quants, make_qx_quants_with_largest

GROUP = 16
GROUPS = QK_K // GROUP


def _requantize(
    by_group: np.ndarray, search_levels, group_scale: np.ndarray, nmax: int, largest: float | None = None
) -> np.ndarray:
    """Levels of every group against its final (stored) scale, uint8 [groups, 16] in the values'
    own order, from the rows as groups (by_group [groups, 16]): so the levels need no transpose
    to be packed (a uint8 transpose of a chunk cost ~6% of Q6_K's time). Groups whose scale is 0
    keep the search's levels, search_levels(groups) -> uint8 [len(groups), 16], as ggml's
    `if (!d) continue;` does. largest: the largest magnitude in by_group, if known."""
    fresh = _fresh_levels(by_group, group_scale, nmax, largest)
    keep = np.flatnonzero(group_scale == 0)  # rare: patched rather than a full-size np.where
    if keep.size:
        fresh[keep] = search_levels(keep)
    return fresh


# _fresh_levels works on slices of this many groups (512K values): its float32 temporaries stay
# ~2 MiB each however large the chunk (Q3_K's are 2M values).
_FRESH_GROUPS = 1 << 15


def _fresh_levels(by_group: np.ndarray, group_scale: np.ndarray, nmax: int, largest: float | None) -> np.ndarray:
    """clamp(nearest_int(x / group_scale)) + nmax as uint8, for by_group [groups, n] and
    group_scale [groups]; meaningless where group_scale is 0 (divided by 1 there, so that no Inf
    sends every group the slow way). With `largest` (the largest |x|) a slice whose every
    |x / scale| is within np.rint's exact range, by a margin of 2, skips round_clamped's range check."""
    levels = np.empty(by_group.shape, dtype=np.int8)
    for start in range(0, by_group.shape[0], _FRESH_GROUPS):
        part = slice(start, start + _FRESH_GROUPS)
        scale = group_scale[part]
        scale_or_one = scale + (scale == 0)  # (np.where is several times slower)
        # each value's own divisor: a plain divide of two arrays is faster than a broadcast over rows of 16
        divisor = np.repeat(scale_or_one, by_group.shape[1])
        # a kept buffer: a fresh one this size costs a page fault per 4 KiB (see scratch)
        new = np.divide(by_group[part].reshape(-1), divisor, out=scratch("fresh_levels", divisor.shape))
        if largest is not None and largest <= NEAREST_INT_EXACT / 2 * float(np.minimum.reduce(np.abs(scale_or_one))):
            np.rint(new, out=new)
            clamp(new, -nmax, nmax - 1)
        else:
            round_clamped(new, nmax)
        levels[part] = new.reshape(-1, by_group.shape[1])  # -nmax .. nmax-1: the offset added on bytes
    levels += np.int8(nmax)
    return levels.view(np.uint8)


def _super_scale(group_scales: np.ndarray, when_finite: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(largest |scale| of each block, the signed scale that has it, the block's group scales).
    when_finite: take signed_max_abs's integer way (6x faster here) if every scale is finite
    (Q3_K's measured gain; Q6_K keeps the float way, untried with it)."""
    by_block = group_scales.reshape(-1, GROUPS)
    if when_finite and np.isfinite(group_scales).all():
        amax, signed = signed_max_abs(np.ascontiguousarray(by_block.T), finite=True)
    else:
        amax, signed = signed_max_abs(by_block.T)
    return amax, signed, by_block


# --- Q6_K: 6-bit levels (-32 .. 31), int8 group scales ---------------------------------------------

Q6_K_BYTES = QK_K // 2 + QK_K // 4 + GROUPS + 2


@float_warnings_off
def _q6_k_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_blocks = rows.size // QK_K
    x = position_major(rows, GROUP)
    weights = None
    if importance is not None:
        weights = importance_by_position(importance, GROUP, rows.shape[0])
    group_scales, search_levels, largest = make_qx_quants_with_largest(x, 32, weights)  # position-major
    if not math.isfinite(largest):  # the registry leaves NaN and Inf to us (finds_non_finite)
        raise NonFiniteInput

    amax, max_scale, by_block = _super_scale(group_scales)
    iscale = np.float32(-128) / max_scale
    d_bytes, d = fp16_round_trip(np.float32(1) / iscale)
    scales = np.minimum(127, nearest_int(iscale[:, None] * by_block)).astype(np.int8)
    group_scale = (d[:, None] * scales.astype(np.float32)).reshape(-1)
    levels = _requantize(rows.reshape(-1, GROUP), lambda groups: search_levels[:, groups].T, group_scale, 32, largest)
    levels = levels.reshape(n_blocks, QK_K)

    quarters = levels.reshape(n_blocks, 2, 4, 32)  # [block, half of 128, quarter of 32, value]
    low, high = quarters & 0x0F, quarters >> 4
    out = np.empty((n_blocks, Q6_K_BYTES), dtype=np.uint8)
    out[:, :128] = (low[:, :, :2] | (low[:, :, 2:] << 4)).reshape(n_blocks, 128)
    out[:, 128:192] = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n_blocks, 64)
    out[:, 192:208] = scales.view(np.uint8)
    out[:, 208:] = d_bytes
    out[amax < GROUP_MAX_EPS] = 0  # ggml zeroes the whole block: levels, scales and d
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _q6_k_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, Q6_K_BYTES)
    n_blocks = blocks.shape[0]
    ql = blocks[:, :128].reshape(n_blocks, 2, 2, 32)
    qh = blocks[:, 128:192].reshape(n_blocks, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # quarters 0,1 then 2,3
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    levels = (low | (high << 4)).astype(np.int8) - np.int8(32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = blocks[:, 208:].copy().view("<f2").astype(np.float32)
    group_scale = d * scales  # ggml: d * sc * q, left to right
    values = group_scale[:, :, None] * levels.reshape(n_blocks, GROUPS, GROUP).astype(np.float32)
    return values.reshape(data.shape[0], row_length)


# --- Q3_K: 3-bit levels (-4 .. 3), 6-bit group scales ---------------------------------------------

Q3_K_BYTES = QK_K // 8 + QK_K // 4 + 12 + 2


def _q3_k_scales_ref(group_scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q3_K_ref's 6-bit group scales (0 .. 63, 32 meaning 0) and super-scale."""
    _, max_scale, by_block = _super_scale(group_scales, when_finite=True)
    no_scale = np.flatnonzero(max_scale == 0)  # rare: patched below (np.where is slow)
    # -32 / 1 where the block has no scale, so no Inf: every product is 0 there
    iscale = np.float32(-32) / (max_scale + (max_scale == 0))
    product = iscale[:, None] * by_block
    if np.isfinite(product).all():
        # |product| <= 32 and a bit: np.rint is nearest_int
        np.rint(product, out=product)
        stored = (clamp(product, -32, 31) + np.float32(32)).astype(np.uint8)
    else:  # an Inf or NaN group scale: the bit-level nearest_int
        stored = (np.clip(nearest_int(product), -32, 31) + 32).astype(np.uint8)
    d = np.float32(1) / iscale
    stored[no_scale] = 0
    d[no_scale] = 0
    return stored, d


def _q3_k_scales_weighted(group_scales: np.ndarray, group_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q3_K_impl's: the group scales themselves quantized by make_qx_quants,
    weighted by each group's total weight."""
    by_position = np.ascontiguousarray(group_scales.reshape(-1, GROUPS).T)
    weights = np.ascontiguousarray(group_weights.reshape(-1, GROUPS).T)
    d, stored = make_qx_quants(by_position, 32, weights)
    return np.ascontiguousarray(stored.T), d


def _q3_k_group_weights(rows: np.ndarray, importance: np.ndarray, x: np.ndarray) -> np.ndarray:
    """imatrix * sqrt(sigma2 + x^2) by position, sigma2 = 2 * mean square of the super-block."""
    sum_x2 = sum_of_squares_by_row(rows.reshape(-1, QK_K))
    sigma2 = np.float32(2) * sum_x2 / np.float32(QK_K)
    sigma2_by_group = np.repeat(sigma2, GROUPS)
    return importance_by_position(importance, GROUP, rows.shape[0]) * np.sqrt(sigma2_by_group + x * x)


# make_q3_quants' later rounds cost ~45 numpy calls each whatever their width (about ten per
# call, on ever fewer groups; its start and first round go tile by tile), so Q3_K asks the
# registry for chunks of 2M values (8 MiB of float32) rather than its default 128K: against 512K,
# the ratio to ggml's C went 0.69-0.74x -> 0.79-0.85x (interleaved, median of 12). With an
# imatrix (make_qx_quants, tiled anyway) chunks of 512K stay best: 1M was 10% slower.
Q3_K_CHUNK_ELEMENTS = 1 << 21
Q3_K_IMATRIX_CHUNK_ELEMENTS = 1 << 19


@float_warnings_off
def _q3_k_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    n_blocks = rows.size // QK_K
    by_group = rows.reshape(-1, GROUP)
    if importance is None:
        group_scales, levels_of, largest = make_q3_quants(by_group, 4)
        stored, d = _q3_k_scales_ref(group_scales)
    else:
        x = position_major(rows, GROUP)
        weights = _q3_k_group_weights(rows, importance, x)
        group_scales, search_levels, largest = make_qx_quants_with_largest(x, 4, weights)  # position-major
        if not math.isfinite(largest):
            raise NonFiniteInput
        stored, d = _q3_k_scales_weighted(group_scales, sum_from_zero(weights))

        def levels_of(groups: np.ndarray) -> np.ndarray:
            return search_levels[:, groups].T
    d_bytes, d_stored = fp16_round_trip(d)
    group_scale = (d_stored[:, None] * (stored.astype(np.float32) - np.float32(32))).reshape(-1)
    levels = _requantize(by_group, levels_of, group_scale, 4, largest).reshape(n_blocks, QK_K)

    out = np.empty((n_blocks, Q3_K_BYTES), dtype=np.uint8)
    _pack_q3_k_levels(levels, out)
    _pack_q3_k_scales(stored, out)
    out[:, 108:] = d_bytes
    return out.reshape(rows.shape[0], -1)


# Bytes as lanes: the levels packed 8 to a uint64, every shift below keeps each byte's bits within
# that byte, so one operation does the work of eight uint8 ones (5x faster than on the bytes).
_BYTES_BIT_0 = np.uint64(0x0101010101010101)
_BYTES_BITS_0_1 = np.uint64(0x0303030303030303)


_BYTES_LOW_NIBBLE = np.uint64(0x0F0F0F0F0F0F0F0F)
_BYTES_BITS_0_1_OF_4 = np.uint32(0x03030303)


def _pack_q3_k_scales(stored: np.ndarray, out: np.ndarray) -> None:
    """The 6-bit group scales (uint8 [blocks, 16], C-contiguous) into out[:, 96:108]: byte m
    (0 .. 7) holds scale m's low 4 bits and scale m+8's in its high half; byte 8+m (0 .. 3) holds
    bits 4-5 of scales m, 4+m, 8+m, 12+m at bits 0-1, 2-3, 4-5, 6-7. On lanes as in the levels'
    packing below (a reduce over the middle axis of [blocks, 4, 4] was 8x slower)."""
    halves = stored.view(np.uint64)  # [block, scales 0-7 | scales 8-15]
    low = halves[:, 0] & _BYTES_LOW_NIBBLE
    low |= (halves[:, 1] & _BYTES_LOW_NIBBLE) << np.uint64(4)
    out[:, 96:104] = low.view(np.uint8).reshape(-1, 8)
    quarters = (stored.view(np.uint32) >> np.uint32(4)) & _BYTES_BITS_0_1_OF_4  # [block, 4 scales each]
    high = quarters[:, 0] | (quarters[:, 1] << np.uint32(2))
    high |= quarters[:, 2] << np.uint32(4)
    high |= quarters[:, 3] << np.uint32(6)
    out[:, 104:108] = high.view(np.uint8).reshape(-1, 4)


def _pack_q3_k_levels(levels: np.ndarray, out: np.ndarray) -> None:
    """Levels 0 .. 7 (uint8 [blocks, 256], C-contiguous) into out[:, :96]: bit 2 of value
    32*b + m is bit b of hmask byte m; bits 0-1 of value 128*h + 32*q + m are bits 2q, 2q+1 of
    byte 32*h + m of the 2-bit planes. The words are transposed to [word, block] first, so that
    every operation runs along the blocks (on a block's 4 words at a time, numpy's per-row cost
    made this 1.6x slower)."""
    n_blocks = levels.shape[0]
    words = np.ascontiguousarray(levels.view(np.uint64).T).reshape(8, 4, n_blocks)  # [eighth of 32 values, 8 values, block]
    high = words >> np.uint64(2)
    high &= _BYTES_BIT_0
    hmask = high[0].copy()
    for b in range(1, 8):  # explicit ORs: reduce over a short axis is several times slower
        hmask |= high[b] << np.uint64(b)
    out[:, :32] = np.ascontiguousarray(hmask.T).view(np.uint8)
    low = (words & _BYTES_BITS_0_1).reshape(2, 4, 4, n_blocks)  # [half, quarter, 8 values, block]
    planes = low[:, 0] | (low[:, 1] << np.uint64(2))
    planes |= low[:, 2] << np.uint64(4)
    planes |= low[:, 3] << np.uint64(6)
    out[:, 32:96] = np.ascontiguousarray(planes.reshape(8, n_blocks).T).view(np.uint8)


@float_warnings_off
def _q3_k_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, Q3_K_BYTES)
    n_blocks = blocks.shape[0]
    hmask = blocks[:, :32]
    qs = blocks[:, 32:96].reshape(n_blocks, 2, 1, 32)
    packed = blocks[:, 96:108]
    low_nibbles = np.concatenate([packed[:, :8] & 0x0F, packed[:, :8] >> 4], axis=1)
    shifts = (2 * (np.arange(GROUPS) // 4)).astype(np.uint8)
    top_bits = (packed[:, 8 + np.arange(GROUPS) % 4] >> shifts) & 3
    scales = (low_nibbles | (top_bits << 4)).astype(np.int8) - np.int8(32)
    d = blocks[:, 108:].copy().view("<f2").astype(np.float32)
    group_scale = d * scales.astype(np.float32)

    low = ((qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).reshape(n_blocks, 8, 32)
    high = ((hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 2
    # ggml: level - (high bit set ? 0 : 4), i.e. (level | high << 2) - 4
    levels = (low | high).view(np.int8) - np.int8(4)
    values = np.repeat(group_scale.reshape(-1), GROUP) * levels.reshape(-1).astype(np.float32)
    return values.reshape(data.shape[0], row_length)


register(
    QuantFormat(
        GGMLType.Q6_K,
        _q6_k_quantize,
        _q6_k_dequantize,
        supports_importance=True,
        chunk_elements=K_QUANT_CHUNK_ELEMENTS,
        finds_non_finite=True,
    )
)
register(
    QuantFormat(
        GGMLType.Q3_K,
        _q3_k_quantize,
        _q3_k_dequantize,
        supports_importance=True,
        chunk_elements=Q3_K_CHUNK_ELEMENTS,
        importance_chunk_elements=Q3_K_IMATRIX_CHUNK_ELEMENTS,
        finds_non_finite=True,
    )
)
