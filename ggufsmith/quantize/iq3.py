"""IQ3_XXS and IQ3_S: groups of 4 magnitudes on a 256- or 512-point grid, signs apart, a 4-bit
scale per block of 32 and a float16 scale per super-block of 256, as ggml's
quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl make them.

Per block of 32 (position-major, numerics.py, all blocks of a chunk at once):
- weights: imatrix * sqrt(sigma2 + x^2) with sigma2 = 2 * sum(x^2 over the super-block) / 256, or
  x^2 without an imatrix; the magnitudes xval = |x| carry the search, the signs are stored apart.
  IQ3_XXS stores 7 sign bits per 8 values: an odd number of negatives is made even by flipping the
  value of least weight * x^2 (its magnitude then enters the search negated).
- trial scales (15 + 0.2 * is) / max for is in -15 .. 15 (IQ3_XXS) or -9 .. 9 (IQ3_S): every group
  of 4 rounds to levels 0..7 (values 2l+1); a group off the grid takes the neighbour (iq_grids.py)
  of least weighted error at that scale. The candidate with the largest sum(w x q)^2 / sum(w q^2)
  wins, its scale being sum(w x q) / sum(w q^2).
- if groups of the winner were off the grid, they are rounded again at its scale (IQ3_S: all
  groups) and the scale refitted.
- super-block: d = max block scale / 31, stored as float16(d * 1.0125) (IQ3_XXS) or d * 1.033
  (IQ3_S), block scales as nearest_int((scale / d - 1) / 2) in 0..15.

ggml's IQ3_S does not advance its qs and signs pointers past a block of zeros: the next block's
bytes land in its place, and the last slots stay zero. We place them the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize.iq_grids import GridTables, iq3_grid
from ggufsmith.quantize.numerics import (
    F32,
    float_warnings_off,
    fp16_bits,
    fp16_value,
    importance_by_position,
    nearest_int,
    position_major,
    sum_from_zero,
    transposed,
)
from ggufsmith.quantize.registry import QuantFormat, register

BLOCK = 32
GROUP = 4
GROUPS = BLOCK // GROUP
SUB_BLOCKS = QK_K // BLOCK
_MAX_LEVEL = 7  # kMaxQ - 1: levels 0..7, values 1, 3, .., 15
_IQ3_XXS_BYTES = 2 + QK_K // 4 + QK_K // 8
_IQ3_S_BYTES = 2 + QK_K // 4 + QK_K // 32 + QK_K // 8 + QK_K // 64
_IQ3_XXS_EPS = F32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS


class _Inputs(NamedTuple):
    x: np.ndarray  # [32, blocks] position-major
    weight: np.ndarray  # [32, blocks]
    xval: np.ndarray  # [32, blocks]: |x|, with IQ3_XXS's parity flips
    signs: np.ndarray  # uint8 [4, blocks]: bit i of byte k set if value 8k + i is stored negated


def _inputs(rows: np.ndarray, importance: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(position-major x [32, blocks], weights [32, blocks])."""
    x = position_major(rows, BLOCK)
    if importance is None:
        return x, x * x
    columns = position_major(rows, QK_K)
    sigma2 = F32(2) * sum_from_zero(columns * columns) / F32(QK_K)
    sigma2 = np.repeat(sigma2, SUB_BLOCKS)
    return x, importance_by_position(importance, BLOCK, rows.shape[0]) * np.sqrt(sigma2 + x * x)


def _signs(x: np.ndarray, weight: np.ndarray, even_parity: bool) -> tuple[np.ndarray, np.ndarray]:
    """(xval, sign bytes [4, blocks]). With even_parity (IQ3_XXS), a group of 8 with an odd number
    of negative values gets the sign of its value of least weight * x * x (the first of equals)
    flipped: that value is then stored as if positive, its magnitude negated."""
    negative = x < 0  # -0.0 counts as positive, as in ggml's `x >= 0`
    xval = np.abs(x)
    bits = (negative.reshape(4, 8, -1).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(
        axis=1, dtype=np.uint8
    )
    if even_parity:
        odd = (negative.reshape(4, 8, -1).sum(axis=1) % 2).astype(bool)  # [4, blocks]
        if odd.any():
            energy = ((weight * x) * x).reshape(4, 8, -1)
            first_nan = np.isnan(energy[:, 0, :])
            flip = np.argmin(np.where(np.isnan(energy), np.inf, energy), axis=1)
            flip[first_nan] = 0  # nothing compares below a NaN start: ggml keeps value 0
            k, b = np.nonzero(odd)
            i = flip[k, b]
            xval.reshape(4, 8, -1)[k, i, b] *= -1
            bits[k, b] ^= (np.uint8(1) << i.astype(np.uint8))
        bits &= 127
    return xval, bits


def _round_levels(xval: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """clamp(nearest_int(0.5 * (inverse * xval - 1)), 0, 7) as int32, C's arithmetic order."""
    levels = nearest_int(F32(0.5) * (xval * inverse - F32(1)))
    np.clip(levels, 0, _MAX_LEVEL, out=levels)
    return levels


def _pack(levels: np.ndarray) -> np.ndarray:
    """int32 [32, blocks] levels -> [8, blocks] packed groups: level i of a group at bits 3i."""
    g = levels.reshape(GROUPS, GROUP, -1)
    return g[:, 0] | (g[:, 1] << 3) | (g[:, 2] << 6) | (g[:, 3] << 9)


class _NoNeighbour(Exception):
    """No neighbour has a finite error: for |x| beyond ~1e12, weight * diff * diff (~|x|^3) is Inf."""


def _best_neighbours(
    tables: GridTables, packed: np.ndarray, xval: list[np.ndarray], waux: list[np.ndarray], scale: np.ndarray
) -> np.ndarray:
    """Grid index of ggml's iq3_find_best_neighbour for off-grid groups: packed [n], xval and waux
    as 4 vectors [n] (one per coordinate), scale [n]. The neighbour of least sum(waux * diff * diff),
    diff = scale * q - xval, summed in order; the first of equals. Where none is below FLT_MAX ggml
    aborts: we raise _NoNeighbour.

    All candidates of all groups form one flat vector (groups have 2 to ~40 neighbours: padding to
    the longest would do 5 times the work), reduced per group with reduceat."""
    counts = tables.neighbour_counts[packed]
    first = np.cumsum(counts) - counts  # each group's first candidate in the flat vector
    local = np.arange(int(first[-1] + counts[-1])) - np.repeat(first, counts)
    candidates = tables.neighbours[np.repeat(tables.neighbour_starts[packed], counts) + local]
    s = np.repeat(scale, counts)
    error = np.zeros(candidates.size, dtype=F32)
    for i in range(GROUP):
        diff = s * tables.values_by_coordinate[i].take(candidates)
        diff -= np.repeat(xval[i], counts)
        error += (np.repeat(waux[i], counts) * diff) * diff
    error[np.isnan(error)] = np.inf
    least = np.minimum.reduceat(error, first)
    if not np.isfinite(least).all():
        raise _NoNeighbour
    position = np.where(error == np.repeat(least, counts), local, np.iinfo(np.int64).max)
    return candidates[first + np.minimum.reduceat(position, first)]


def _grid_levels(
    tables: GridTables, levels: np.ndarray, xval: np.ndarray, waux: np.ndarray, scale: np.ndarray, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Move every group of `levels` [32, blocks] (only `groups`, bool [8, blocks], if given) onto the
    grid: (levels on the grid [32, blocks], on_grid [8, blocks] - whether each already was)."""
    packed = _pack(levels)
    on_grid = tables.index_of[packed] >= 0
    move = ~on_grid if groups is None else (~on_grid & groups)
    if move.any():
        n_blocks = levels.shape[1]
        k, b = np.nonzero(move)
        # value i of group k of block b sits at flat index (4k + i) * blocks + b of a [32, blocks] array
        first_value = k * (GROUP * n_blocks) + b
        at = [first_value + i * n_blocks for i in range(GROUP)]
        flat_x, flat_w = xval.reshape(-1), waux.reshape(-1)
        chosen = _best_neighbours(tables, packed[k, b], [flat_x.take(j) for j in at], [flat_w.take(j) for j in at], scale[b])
        levels = levels.copy()
        flat_levels = levels.reshape(-1)
        for i in range(GROUP):
            flat_levels[at[i]] = tables.levels[chosen, i]
    return levels, on_grid


def _fit(weight: np.ndarray, xval: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum w xval q, sum w q^2) per block, q = 2 * level + 1, summed in order."""
    q = 2 * levels.astype(F32) + F32(1)
    return sum_from_zero((weight * xval) * q), sum_from_zero((weight * q) * q)


def _search(tables: GridTables, weight: np.ndarray, xval: np.ndarray, block_max: np.ndarray, trials: int, iq3_s: bool):
    """The trial-scale search and refit of one set of non-zero blocks: (scale [blocks], levels
    int32 [32, blocks] all on the grid)."""
    waux = np.sqrt(weight)
    n = block_max.size
    scale = block_max / F32(15)
    best = np.zeros(n, dtype=F32)
    levels = np.zeros(xval.shape, dtype=np.int32)
    # IQ3_S starts with every group "off the grid" (so an unimproved block is refitted), IQ3_XXS on it.
    on_grid = np.full((GROUPS, n), not iq3_s)
    for step in range(-trials, trials + 1):
        inverse = (F32(15) + F32(step) * F32(0.2)) / block_max
        trial, trial_on_grid = _grid_levels(tables, _round_levels(xval, inverse), xval, waux, F32(1) / inverse)
        sum_qx, sum_q2 = _fit(weight, xval, trial)
        better = (sum_q2 > 0) & (sum_qx * sum_qx > best * sum_q2)
        scale = np.where(better, sum_qx / sum_q2, scale)
        best = np.where(better, scale * sum_qx, best)
        levels = np.where(better, trial, levels)
        on_grid = np.where(better, trial_on_grid, on_grid)

    refit = (~on_grid).any(axis=0) & (scale > 0)
    if refit.any():
        b = np.flatnonzero(refit)
        x_r, w_r = xval[:, b], waux[:, b]
        redo = None if iq3_s else ~on_grid[:, b]
        rounded = _round_levels(x_r, F32(1) / scale[b])
        if redo is not None:  # IQ3_XXS keeps the groups that were on the grid
            rounded = np.where(np.repeat(redo, GROUP, axis=0), rounded, levels[:, b])
        moved, _ = _grid_levels(tables, rounded, x_r, w_r, scale[b], redo)
        levels[:, b] = moved
        sum_qx, sum_q2 = _fit(weight[:, b], x_r, moved)
        scale[b] = np.where(sum_q2 > 0, sum_qx / sum_q2, scale[b])
    return scale, levels


def _quantize_blocks(rows: np.ndarray, importance: np.ndarray | None, iq3_s: bool):
    """(block scales [blocks], grid indices int32 [8, blocks], sign bytes [4, blocks], non-zero
    blocks bool [blocks]) for every block of 32 of the chunk."""
    try:
        return _quantize_blocks_or_fail(rows, importance, iq3_s)
    except _NoNeighbour:
        name = "IQ3_S" if iq3_s else "IQ3_XXS"
        raise QuantizationError(
            f"{name} cannot quantize values this large (|x| above ~1e12 overflows the float32 errors of its grid search, "
            "and ggml aborts on them too); scale the tensor down or choose another type"
        ) from None


def _quantize_blocks_or_fail(rows: np.ndarray, importance: np.ndarray | None, iq3_s: bool):
    tables = iq3_grid(512 if iq3_s else 256)
    x, weight = _inputs(rows, importance)
    xval, signs = _signs(x, weight, even_parity=not iq3_s)
    block_max = np.maximum.reduce(xval, axis=0)  # plain max: no NaN, and a tie of equals is equal
    active = block_max != 0 if iq3_s else ~(block_max < _IQ3_XXS_EPS)
    scales = np.zeros(block_max.size, dtype=F32)
    index = np.zeros((GROUPS, block_max.size), dtype=np.int32)
    b = np.flatnonzero(active)
    if b.size:
        scale, levels = _search(tables, weight[:, b], xval[:, b], block_max[b], 9 if iq3_s else 15, iq3_s)
        negative = scale < 0  # never for finite data (weights and magnitudes are >= 0): as ggml
        if negative.any():
            scale = np.where(negative, -scale, scale)
            signs[:, b[negative]] = ~signs[:, b[negative]] & (255 if iq3_s else 127)
        scales[b] = scale
        index[:, b] = tables.index_of[_pack(levels)]
    return scales, index, signs, active


def _super_scales(scales: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d = max_scale / 31 per super-block, before the type's fudge factor; 4-bit block scales
    [supers, 8]; whether max_scale is non-zero - ggml stores d = 0 and no block scales if not)."""
    by_super = scales.reshape(-1, SUB_BLOCKS)
    act = active.reshape(-1, SUB_BLOCKS)
    max_scale = np.zeros(by_super.shape[0], dtype=F32)
    for ib in range(SUB_BLOCKS):  # MAX(max_scale, scale) in order: a NaN scale is replaced by the next
        s = by_super[:, ib]
        max_scale = np.where(act[:, ib] & ~(max_scale > s), s, max_scale)
    d = max_scale / F32(31)
    inverse = F32(1) / d
    levels = np.clip(nearest_int(F32(0.5) * (inverse[:, None] * by_super - F32(1))), 0, 15)
    return d, levels, max_scale != 0


# --- IQ3_XXS -----------------------------------------------------------------------------------


@float_warnings_off
def _iq3_xxs_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, iq3_s=False)
    d, block_levels, nonzero = _super_scales(scales, active)
    n_super = d.size
    signs = transposed(signs).astype(np.uint32)  # [blocks, 4]
    signs[~active] = 0  # ggml skips a block below the epsilon before storing its signs
    words = signs[:, 0] | (signs[:, 1] << 7) | (signs[:, 2] << 14) | (signs[:, 3] << 21)
    words = words.reshape(n_super, SUB_BLOCKS) | (block_levels.astype(np.uint32) << 28)
    out = np.zeros((n_super, _IQ3_XXS_BYTES), dtype=np.uint8)
    out[:, :2] = fp16_bits(np.where(nonzero, d * F32(1.0125), F32(0))).view(np.uint8).reshape(-1, 2)
    out[:, 2 : 2 + QK_K // 4] = transposed(index).astype(np.uint8).reshape(n_super, -1)
    out[:, 2 + QK_K // 4 :] = words.astype("<u4").view(np.uint8).reshape(n_super, -1)
    out[~nonzero, 2:] = 0  # ggml clears the whole super-block when every block scale is 0
    return out.reshape(rows.shape[0], -1)


# What a level decodes to. IQ3_S: 2l + 1, the values the quantizer fits. IQ3_XXS decodes with
# ggml's iq3xxs_grid, whose values are 4 * (2l + 1) but for the top level (62, not 60); its scale
# carries the factor 4 back as * 0.5 * 0.5.
_IQ3_XXS_VALUES = np.array([4, 12, 20, 28, 36, 44, 52, 62], dtype=F32)
_IQ3_S_VALUES = np.arange(1, 16, 2).astype(F32)


def _grid_values(tables: GridTables, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """float32 [..., 4]: the decoded values of grid points."""
    return values[tables.levels[index]]


def _signed(values: np.ndarray, negative: np.ndarray) -> np.ndarray:
    # ggml: db * grid * (sign ? -1.f : 1.f): the sign multiplies an already rounded product.
    return np.where(negative, -values, values)


@float_warnings_off
def _iq3_xxs_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _IQ3_XXS_BYTES)
    d = fp16_value(blocks[:, :2].copy().view(np.uint16)[:, 0])
    index = blocks[:, 2 : 2 + QK_K // 4].reshape(-1, SUB_BLOCKS, GROUPS)
    words = blocks[:, 2 + QK_K // 4 :].copy().view("<u4")  # [supers, 8]
    db = d[:, None] * (F32(0.5) + (words >> 28).astype(F32)) * F32(0.5)
    sign7 = (words[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # [supers, 8, 4]
    # The 8th sign of a group of 8 makes the count of negatives even (ggml's ksigns_iq2xs).
    parity = np.zeros(sign7.shape, dtype=np.uint32)
    for bit in range(7):
        parity ^= (sign7 >> bit) & 1
    sign8 = sign7 | (parity << 7)
    negative = ((sign8[..., None] >> np.arange(8, dtype=np.uint32)) & 1).astype(bool)  # [supers, 8, 4, 8]
    values = db[:, :, None, None] * _grid_values(iq3_grid(256), index, _IQ3_XXS_VALUES).reshape(-1, SUB_BLOCKS, 4, 8)
    return _signed(values, negative).reshape(data.shape[0], row_length)


# --- IQ3_S -------------------------------------------------------------------------------------


@float_warnings_off
def _iq3_s_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, iq3_s=True)
    d, block_levels, nonzero = _super_scales(scales, active)
    n_super = d.size
    index = transposed(index).reshape(n_super, SUB_BLOCKS, GROUPS)
    signs = transposed(signs).reshape(n_super, SUB_BLOCKS, 4)
    act = active.reshape(n_super, SUB_BLOCKS)
    # Non-zero blocks fill the qs/signs slots in order (see the module docstring).
    slot = np.cumsum(act, axis=1) - 1
    s, ib = np.nonzero(act)
    qs = np.zeros((n_super, SUB_BLOCKS, GROUPS), dtype=np.uint8)
    qs[s, slot[s, ib]] = (index[s, ib] & 255).astype(np.uint8)
    sign_bytes = np.zeros((n_super, SUB_BLOCKS, 4), dtype=np.uint8)
    sign_bytes[s, slot[s, ib]] = signs[s, ib]
    high = ((index >> 8) & 1).astype(np.uint8) << np.arange(GROUPS, dtype=np.uint8)
    qh = np.where(act, high.sum(axis=2, dtype=np.uint8), 0)

    out = np.zeros((n_super, _IQ3_S_BYTES), dtype=np.uint8)
    out[:, :2] = fp16_bits(np.where(nonzero, d * F32(1.033), F32(0))).view(np.uint8).reshape(-1, 2)
    out[:, 2:66] = qs.reshape(n_super, -1)
    out[:, 66:74] = qh
    out[:, 74:106] = sign_bytes.reshape(n_super, -1)
    low = np.where(nonzero[:, None], block_levels, 0).astype(np.uint8)
    out[:, 106:110] = low[:, 0::2] | (low[:, 1::2] << 4)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq3_s_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _IQ3_S_BYTES)
    d = fp16_value(blocks[:, :2].copy().view(np.uint16)[:, 0])
    qs = blocks[:, 2:66].reshape(-1, SUB_BLOCKS, GROUPS).astype(np.int32)
    qh = blocks[:, 66:74].astype(np.int32)
    index = qs | (((qh[:, :, None] >> np.arange(GROUPS)) & 1) << 8)
    nibbles = np.stack([blocks[:, 106:110] & 15, blocks[:, 106:110] >> 4], axis=2).reshape(-1, SUB_BLOCKS)
    db = d[:, None] * (1 + 2 * nibbles.astype(np.int32)).astype(F32)
    negative = ((blocks[:, 74:106].reshape(-1, SUB_BLOCKS, 4, 1) >> np.arange(8, dtype=np.uint8)) & 1).astype(bool)
    values = db[:, :, None, None] * _grid_values(iq3_grid(512), index, _IQ3_S_VALUES).reshape(-1, SUB_BLOCKS, 4, 8)
    return _signed(values, negative).reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.IQ3_XXS, _iq3_xxs_quantize, _iq3_xxs_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.IQ3_S, _iq3_s_quantize, _iq3_s_dequantize, supports_importance=True))
