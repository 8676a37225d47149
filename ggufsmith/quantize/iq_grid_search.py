"""The grid search shared by ggml's IQ3_XXS, IQ3_S, IQ2_XXS and IQ2_XS quantizers, on all blocks of
a chunk at once (position-major, numerics.py: x[i, b] is value i of block b).

Per block (32 values, or 16 for IQ2_XS):
- weights: imatrix * sqrt(sigma2 + x^2) (sigma2 from the super-block's sum of squares), or x^2
  without an imatrix; the search runs on magnitudes xval = |x|, the signs are stored apart, 7 bits
  per 8 values for the types with even sign parity: an odd number of negatives is made even by
  flipping the value of least weight * x^2, whose magnitude then enters the search negated.
- trial scales (center + step * is) / base for is in -trials .. trials: every group of 4 or 8
  values rounds to levels nearest_int((xval / scale - 1) / 2) (fitted values 2l + 1); a group off
  the grid takes its neighbour (iq_grids.py) of least sum(sqrt(w) * diff^2) at that scale. The
  candidate with the largest sum(w x q)^2 / sum(w q^2) wins, its scale being sum(w x q) / sum(w q^2).
- then, depending on the type, the groups of the winner that were off the grid, or all groups, are
  rounded again at its scale, moved onto the grid, and the scale refitted.

ggml's neighbour search aborts when no neighbour's error is below FLT_MAX (|x| beyond ~1e12 makes
weight * diff^2 overflow): we raise NoNeighbour there, which the types turn into a QuantizationError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ggufsmith.constants import QK_K
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize.iq_grids import GridTables
from ggufsmith.quantize.numerics import (
    F32,
    fp16_bits,
    fp16_value,
    importance_by_position,
    nearest_int,
    position_major,
    sum_from_zero,
)

SIGN_GROUP = 8  # values per sign byte


@dataclass(frozen=True)
class GridSearch:
    grid: Callable[[], GridTables]  # the type's tables, built on first use
    group: int  # values per grid point
    bits: int  # bits per level in a packed point
    max_level: int  # levels 0 .. max_level
    center: float  # trial scales (center + step * is) / base
    step: float
    trials: int
    start_on_grid: bool  # the winner's groups count as on the grid until a trial improves
    refit_all: bool  # the refit rounds every group again, not only those off the grid
    always_refit: bool = False  # refit whenever the scale is positive (no on-grid bookkeeping)


class NoNeighbour(Exception):
    """ggml aborts: see search()."""


def refuse_overflow(type_name: str) -> QuantizationError:
    return QuantizationError(
        f"{type_name} cannot quantize values this large (|x| above ~1e12, less with a large imatrix, overflows "
        "the float32 errors of its grid search, where ggml aborts or falls back to a search we do not reproduce); "
        "scale the tensor down or choose another type"
    )


def assert_scales_valid(scale: np.ndarray, type_name: str) -> None:
    """ggml's GGML_ASSERT(scale >= 0) at the end of every block: a NaN scale (float32 overflow in
    the sums, for |x| beyond ~1e12) aborts it; we refuse."""
    if not (scale >= 0).all():
        raise refuse_overflow(type_name)


def block_inputs(
    rows: np.ndarray, importance: np.ndarray | None, block: int, doubled_sigma2: bool, sigma2_floor: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(position-major x [block, blocks], weights [block, blocks]). With an imatrix the weights are
    imatrix * sqrt(sigma2 + x^2), sigma2 = 2 * sum(x^2) / 256 (doubled_sigma2, IQ3 and IQ2_S) or
    sum(x^2) / 256 over the super-block, summed in order; without, x^2, or 0.25 * sigma2 + x^2
    with sigma2_floor (IQ2_S)."""
    x = position_major(rows, block)
    if importance is None and not sigma2_floor:
        return x, x * x
    columns = position_major(rows, QK_K)
    sum_x2 = sum_from_zero(columns * columns)
    sigma2 = (F32(2) * sum_x2 if doubled_sigma2 else sum_x2) / F32(QK_K)
    sigma2 = np.repeat(sigma2, QK_K // block)
    if importance is None:
        return x, F32(0.25) * sigma2 + x * x
    return x, importance_by_position(importance, block, rows.shape[0]) * np.sqrt(sigma2 + x * x)


def signs_and_magnitudes(x: np.ndarray, weight: np.ndarray, even_parity: bool) -> tuple[np.ndarray, np.ndarray]:
    """(xval [block, blocks], sign bytes uint8 [block / 8, blocks]: bit i set if value 8k + i is
    stored negated). even_parity: 7-bit signs with the parity flip of the module docstring."""
    n_sign_groups = x.shape[0] // SIGN_GROUP
    negative = (x < 0).reshape(n_sign_groups, SIGN_GROUP, -1)  # -0.0 is positive, as `x >= 0` in C
    xval = np.abs(x)
    bits = (negative.astype(np.uint8) << np.arange(SIGN_GROUP, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    if even_parity:
        odd = (negative.sum(axis=1) % 2).astype(bool)
        if odd.any():
            energy = ((weight * x) * x).reshape(n_sign_groups, SIGN_GROUP, -1)
            nan = np.isnan(energy)
            flip = np.argmin(np.where(nan, np.inf, energy), axis=1)
            flip[nan[:, 0, :]] = 0  # nothing compares below a NaN start: ggml keeps value 0
            k, b = np.nonzero(odd)
            i = flip[k, b]
            xval.reshape(n_sign_groups, SIGN_GROUP, -1)[k, i, b] *= -1
            bits[k, b] ^= np.uint8(1) << i.astype(np.uint8)
        bits &= 127
    return xval, bits


def pack(spec: GridSearch, levels: np.ndarray) -> np.ndarray:
    """int32 levels [block, blocks] -> packed points [block / group, blocks]: level i at bits*i."""
    g = levels.reshape(-1, spec.group, levels.shape[-1])
    packed = g[:, 0].copy()
    for i in range(1, spec.group):
        packed |= g[:, i] << (spec.bits * i)
    return packed


def _round_levels(spec: GridSearch, xval: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """clamp(nearest_int(0.5 * (inverse * xval - 1)), 0, max_level) as int32, C's arithmetic order."""
    levels = nearest_int(F32(0.5) * (xval * inverse - F32(1)))
    np.clip(levels, 0, spec.max_level, out=levels)
    return levels


# Neighbour tiles hold at most this many candidates (k x groups): 256 KiB of float32 per array,
# within L2. Measured on captured searches against the candidates laid end to end: 1.4-1.8x faster for
# IQ3_XXS and IQ3_S, 1.0-1.3x for IQ2_XXS and IQ2_XS (lists of ~20-70 neighbours).
NEIGHBOUR_TILE = 1 << 16
_MIN_WIDTH = 4


def neighbour_tiles(tables: GridTables, packed: np.ndarray):
    """The neighbour lists of the off-grid points `packed` [n], as tiles: yields (groups, points),
    groups an index array into packed and points int32 [k, len(groups)], column j the neighbours
    of groups[j] in ggml's order. The lists are bucketed by length (k a power of two, at least
    4, the lists longer than k / 2) and padded by repeating their last neighbour: a repeat comes
    after its equal, so it never changes the first least (first_least_of_columns). Laid end to end
    instead, every per-group value has to be repeated for each candidate (1 ns a value, the
    searches' largest cost); here it broadcasts along the rows."""
    counts = tables.neighbour_counts[packed]
    starts = tables.neighbour_starts[packed].astype(np.intp)
    top, shorter, width = int(counts.max()), 0, _MIN_WIDTH
    while True:
        bucket = ((counts > shorter) & (counts <= width)).nonzero()[0]
        step = max(1, NEIGHBOUR_TILE // width)
        for start in range(0, bucket.size, step):
            groups = bucket[start : start + step]
            first = starts[groups]
            at = np.minimum(first + np.arange(width, dtype=np.intp)[:, None], first + (counts[groups] - 1))
            yield groups, np.take(tables.neighbours, at)
        if width >= top:
            return
        shorter, width = width, 2 * width


def add_squared_error(error: np.ndarray | None, q: np.ndarray, scale: np.ndarray, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """One coordinate of ggml's neighbour error, `diff = scale*q - x; d2 += weight*diff*diff`, in
    its order, on a tile of candidates (q [k, groups]; the others per group, broadcast along the
    rows). error is None for the first coordinate: d2 starts at 0, and 0 + term is term (term is
    +0 or more, or NaN)."""
    diff = np.multiply(q, scale)
    diff -= x
    term = np.multiply(weight, diff)
    term *= diff
    if error is None:
        return term
    error += term
    return error


def first_least_of_columns(points: np.ndarray, error: np.ndarray) -> np.ndarray:
    """Per column of a tile, the point of least error, the first of equals, as ggml's
    `if (d2 < best)` from FLT_MAX (NaN never wins); raises NoNeighbour where no error is finite
    (ggml aborts)."""
    least = np.fmin.reduce(error, axis=0)
    if not np.isfinite(least).all():
        raise NoNeighbour
    # the first row holding it: the largest k - row among the rows equal to it (np.argmax along
    # axis 0 measured 3-7x slower)
    k = error.shape[0]
    dtype = np.int8 if k < 128 else np.int16
    countdown = (k - np.arange(k, dtype=dtype))[:, None]
    first = k - np.maximum.reduce(np.multiply(error == least, countdown, dtype=dtype), axis=0).astype(np.intp)
    return points[first, np.arange(points.shape[1])]


def _best_neighbours(spec: GridSearch, packed: np.ndarray, xval: list[np.ndarray], waux: list[np.ndarray], scale: np.ndarray) -> np.ndarray:
    """Grid index of ggml's find_best_neighbour for off-grid groups: packed [n], xval and waux as
    `group` vectors [n] (one per coordinate), scale [n]. The neighbour of least
    sum(waux * diff * diff), diff = scale * q - xval, summed in order."""
    tables = spec.grid()
    chosen = np.empty(packed.size, dtype=np.int32)
    for groups, points in neighbour_tiles(tables, packed):
        values = np.take(tables.values_by_coordinate, points, axis=1)  # [dims, k, groups]
        s = scale[groups]
        error = None
        for i in range(spec.group):
            error = add_squared_error(error, values[i], s, xval[i][groups], waux[i][groups])
        chosen[groups] = first_least_of_columns(points, error)
    return chosen


def _onto_grid(
    spec: GridSearch, levels: np.ndarray, xval: np.ndarray, waux: np.ndarray, scale: np.ndarray, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Move every group of `levels` [block, blocks] (only `groups`, bool [block / group, blocks], if
    given) onto the grid: (levels on the grid, on_grid [block / group, blocks]: whether each was)."""
    tables = spec.grid()
    packed = pack(spec, levels)
    on_grid = tables.index_of[packed] >= 0
    move = ~on_grid if groups is None else (~on_grid & groups)
    if move.any():
        n_blocks = levels.shape[1]
        k, b = np.nonzero(move)
        # value i of group k of block b sits at flat index (group * k + i) * blocks + b
        first_value = k * (spec.group * n_blocks) + b
        at = [first_value + i * n_blocks for i in range(spec.group)]
        flat_x, flat_w = xval.reshape(-1), waux.reshape(-1)
        chosen = _best_neighbours(spec, packed[k, b], [flat_x.take(j) for j in at], [flat_w.take(j) for j in at], scale[b])
        levels = levels.copy()
        flat_levels = levels.reshape(-1)
        for i in range(spec.group):
            flat_levels[at[i]] = tables.levels[chosen, i]
    return levels, on_grid


def _fit(weight: np.ndarray, xval: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum w xval q, sum w q^2) per block, q = 2 * level + 1, summed in order."""
    q = 2 * levels.astype(F32) + F32(1)
    return sum_from_zero((weight * xval) * q), sum_from_zero((weight * q) * q)


def search(
    spec: GridSearch, weight: np.ndarray, xval: np.ndarray, base: np.ndarray, scale: np.ndarray, levels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The trial-scale search and refit of blocks that are not all zero: (scale [blocks], levels int32
    [block, blocks], every group on the grid). `base` divides the trial scales; `scale` and `levels`
    (zeros if None) are kept if no trial improves on nothing and there is no refit.

    Raises NoNeighbour where ggml aborts: no neighbour with a finite error, or final levels off the
    grid (kept initial levels, when NaN scales from overflowing sums prevent every trial and refit)."""
    waux = np.sqrt(weight)
    n_blocks = base.size
    scale = scale.copy()
    best = np.zeros(n_blocks, dtype=F32)
    levels = np.zeros(xval.shape, dtype=np.int32) if levels is None else levels.astype(np.int32)
    on_grid = np.full((xval.shape[0] // spec.group, n_blocks), spec.start_on_grid)
    for step in range(-spec.trials, spec.trials + 1):
        inverse = (F32(spec.center) + F32(step) * F32(spec.step)) / base
        trial, trial_on_grid = _onto_grid(spec, _round_levels(spec, xval, inverse), xval, waux, F32(1) / inverse)
        sum_qx, sum_q2 = _fit(weight, xval, trial)
        better = (sum_q2 > 0) & (sum_qx * sum_qx > best * sum_q2)
        scale = np.where(better, sum_qx / sum_q2, scale)
        best = np.where(better, scale * sum_qx, best)
        levels = np.where(better, trial, levels)
        on_grid = np.where(better, trial_on_grid, on_grid)

    refit = scale > 0
    if not spec.always_refit:
        refit &= (~on_grid).any(axis=0)
    if refit.any():
        b = np.flatnonzero(refit)
        x_r, w_r = xval[:, b], waux[:, b]
        rounded = _round_levels(spec, x_r, F32(1) / scale[b])
        redo = None
        if not spec.refit_all:  # groups that were on the grid keep their levels
            redo = ~on_grid[:, b]
            rounded = np.where(np.repeat(redo, spec.group, axis=0), rounded, levels[:, b])
        moved, _ = _onto_grid(spec, rounded, x_r, w_r, scale[b], redo)
        levels[:, b] = moved
        sum_qx, sum_q2 = _fit(weight[:, b], x_r, moved)
        scale[b] = np.where(sum_q2 > 0, sum_qx / sum_q2, scale[b])
    if (levels > spec.max_level).any() or (spec.grid().index_of[pack(spec, levels)] < 0).any():
        raise NoNeighbour
    return scale, levels


def search_blocks(
    spec: GridSearch, type_name: str, active: np.ndarray, weight: np.ndarray, xval: np.ndarray, signs: np.ndarray,
    even_parity: bool, base: np.ndarray, scale: np.ndarray, levels: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """search() on the active blocks: (block scales [blocks], grid indices int32 [groups per block,
    blocks]), 0 for the others. A negative winning scale (never for finite data: as ggml) is made
    positive and the block's sign bytes `signs` [sign bytes per block, blocks] inverted in place,
    their 7 stored bits for the even-parity types, all 8 for the others. NoNeighbour becomes the
    type's QuantizationError."""
    n_blocks = active.size
    scales = np.zeros(n_blocks, dtype=F32)
    index = np.zeros((xval.shape[0] // spec.group, n_blocks), dtype=np.int32)
    b = np.flatnonzero(active)
    if b.size == 0:
        return scales, index
    try:
        found, levels = search(spec, weight[:, b], xval[:, b], base[b], scale[b], None if levels is None else levels[:, b])
    except NoNeighbour:
        raise refuse_overflow(type_name) from None
    negative = found < 0
    if negative.any():
        found = np.where(negative, -found, found)
        signs[:, b[negative]] = ~signs[:, b[negative]] & (127 if even_parity else 255)
    assert_scales_valid(found, type_name)
    scales[b] = found
    index[:, b] = spec.grid().index_of[pack(spec, levels)]
    return scales, index


def super_scales(
    scales: np.ndarray, active: np.ndarray, per_super: int, top: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d = max_scale / (2 * top + 1) per super-block; block scales nearest_int((scale / d - 1) / 2)
    in 0..top, [supers, per_super]; whether max_scale is non-zero, ggml storing nothing if not).
    max_scale is MAX(max_scale, scale) over the active blocks in order: a NaN scale is replaced by
    the next one."""
    by_super = scales.reshape(-1, per_super)
    act = active.reshape(-1, per_super)
    max_scale = np.zeros(by_super.shape[0], dtype=F32)
    for ib in range(per_super):
        s = by_super[:, ib]
        max_scale = np.where(act[:, ib] & ~(max_scale > s), s, max_scale)
    d = max_scale / F32(2 * top + 1)
    levels = np.clip(nearest_int(F32(0.5) * ((F32(1) / d)[:, None] * by_super - F32(1))), 0, top)
    return d, levels, max_scale != 0


def new_super_blocks(d: np.ndarray, block_bytes: int) -> np.ndarray:
    """uint8 [supers, block_bytes]: zeros but for the float16 super-block scale `d` in bytes 0..1."""
    out = np.zeros((d.size, block_bytes), dtype=np.uint8)
    out[:, :2] = fp16_bits(d).view(np.uint8).reshape(-1, 2)
    return out


# ---------------------------------------------------------------- decoding


def read_super_blocks(data: np.ndarray, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(the quantized rows as super-blocks uint8 [supers, block_bytes], their float16 scale d in
    bytes 0..1 as float32 [supers])."""
    blocks = np.ascontiguousarray(data).reshape(-1, block_bytes)
    return blocks, fp16_value(blocks[:, :2].copy().view(np.uint16)[:, 0])


def even_parity_negatives(sign7: np.ndarray) -> np.ndarray:
    """bool [..., 8]: which of 8 values are negative, from 7 stored sign bits; the 8th makes the
    count of negatives even (ggml's ksigns_iq2xs table)."""
    sign7 = sign7.astype(np.uint32)
    parity = np.zeros(sign7.shape, dtype=np.uint32)
    for bit in range(7):
        parity ^= (sign7 >> bit) & 1
    return sign_bits(sign7 | (parity << 7))


def sign_bits(sign8: np.ndarray) -> np.ndarray:
    """bool [..., 8]: bit i of each byte."""
    return ((sign8[..., None] >> np.arange(8, dtype=sign8.dtype)) & 1).astype(bool)


def signed(values: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """ggml's `db * grid[j] * (sign ? -1.f : 1.f)`: the sign multiplies an already rounded product."""
    return np.where(negative, -values, values)
