"""IQ1_S and IQ1_M: groups of 8 values on a 2048-point grid of levels -1, 0, 1 shifted by +-0.125, a 3-bit
scale and the shift's sign per block of 32, as ggml's quantize_row_iq1_s_impl makes them. It needs
an importance matrix (ggml asserts on its absence, we refuse).

Per block of 32 (position-major, numerics.py, all blocks of a chunk at once):
- weights imatrix * sqrt(sigma2 + x^2), sigma2 = 2 * sum(x^2) / 256 over the super-block.
- the values sorted (a stable sort: glibc's qsort is a merge sort for arrays this small), prefix
  sums of w*x and w in that order; every split (i1 <= i2) of the sorted values into levels 0, 1, 2
  is tried with the values x_p = (-0.875, 0.125, 1.125), then x_m = (-1.125, -0.125, 0.875), in
  ggml's order: the first split with the largest sum(w x q)^2 / sum(w q^2) (as ggml compares) wins.
- groups of 8 off the grid take the neighbour (iq_grids.py) of least sum(w * (scale * q - x)^2),
  after which the scale is refitted if positive.
Super-block: d = max block scale / 15, stored as float16(d * 1.125); a block's scale as
nearest_int((scale / d - 1) / 2) in 0..7 at bit 12 of its qh, the shift x_m as bit 15.

Layout (ggml-common.h): float16 d, qs[32] (low 8 bits of the grid indices), qh uint16[8] (per
block of 32: the high 3 bits of its 4 indices, then the scale and the shift's sign).

IQ1_M (imatrix optional, weights x^2 without one) works on blocks of 16 whose two groups of 8 each
take x_p or x_m (4 combinations per split, from per-half prefix sums), 3-bit block scales, and a
super-block scale refitted over all 256 values and stored as float16(d * 1.1125) in the top
nibbles of the 4 uint16 of block scales. Layout: qs[32], qh[16] (per block of 16: the high 3 bits
of each index, the shift bits 0x08 / 0x80), scales uint16[4].
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.iq_grid_search import (
    NoNeighbour,
    add_squared_error,
    assert_scales_valid,
    block_inputs,
    first_least_of_columns,
    neighbour_tiles,
    new_super_blocks,
    read_super_blocks,
    refuse_overflow,
    super_scales,
)
from ggufsmith.quantize.iq_grids import iq1_grid
from ggufsmith.quantize.numerics import F32, float_warnings_off, fp16_bits, fp16_value, sum_from_zero, transposed
from ggufsmith.quantize.registry import QuantFormat, register

BLOCK = 32
GROUP = 8
GROUPS = BLOCK // GROUP
SUB_BLOCKS = QK_K // BLOCK
_IQ1_S_BYTES = 2 + QK_K // 8 + QK_K // 16
_EPS = F32(1e-12)  # GROUP_MAX_EPS_IQ1_S
DELTA = F32(0.125)  # IQ1S_DELTA
# The three level values with the shift +delta (x_p) and -delta (x_m), as ggml computes them.
_X_P = np.array([F32(-1) + DELTA, DELTA, F32(1) + DELTA], dtype=F32)
_X_M = np.array([F32(-1) - DELTA, -DELTA, F32(1) - DELTA], dtype=F32)


def _splits(block: int) -> tuple[np.ndarray, np.ndarray]:
    """Every split (i1, i2), 0 <= i1 <= i2 <= block, of a block's sorted values into levels 0, 1,
    2, in ggml's loop order: (i1 [splits], i2 [splits])."""
    pairs = [(i1, i2) for i1 in range(block + 1) for i2 in range(i1, block + 1)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


_I1, _I2 = _splits(BLOCK)


# ggml's test `sumqx*sumqx > best*sumq2` rounds each side by a few float32 ulps (~6e-8 each): a
# candidate whose ratio sumqx^2/sumq2 is below another's by more than _RATIO_GAP never passes it
# against that one, and that one always passes it against the candidate.
_RATIO_GAP = 1e-5
# The candidates within this fraction of a block's largest ratio are the ones ggml may end on; a
# block whose others are not _RATIO_GAP below them tries the next, wider fraction.
_NEAR = (1e-4, 1e-3, 1e-2)
# Blocks with more near candidates than this are compared one candidate at a time.
_MAX_NEAR = 64
# Products of sums outside this range may be subnormal or overflow in float32, where the ulp
# bound fails: such blocks are compared one candidate at a time too.
_SAFE_PRODUCTS = (1e-30, 1e30)


def _first_best(sum_qx: np.ndarray, sum_q2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's choice among [splits, options, blocks] candidates, tried split by split and option by
    option: the first with the largest sum(w x q)^2 / sum(w q^2), compared as ggml compares.
    Returns (found bool [blocks], split [blocks], option [blocks]), 0 where none was found.

    Candidates far below a block's largest ratio cannot be where ggml ends: when the near ones
    (within _NEAR of it) are _RATIO_GAP above all others, the first near one passes ggml's test
    against whatever came before and no other candidate passes it later, so only the near ones are
    compared, in ggml's order and arithmetic (usually one sum, or equal sums). A loop over every
    candidate (~600-1100 numpy calls on each block's vector) was a third of IQ1's time; it is left
    for the rare blocks where that does not hold (non-finite or extreme sums, crowded near ties)."""
    n_splits, n_options, n_blocks = sum_qx.shape
    qx, q2 = sum_qx.reshape(-1, n_blocks), sum_q2.reshape(-1, n_blocks)  # ggml's order
    winner = np.zeros(n_blocks, dtype=np.int64)
    with np.errstate(all="ignore"):
        valid = q2 > 0
        all_valid = bool(valid.all())
        squared = qx * qx
        ratio = squared / q2  # float32: a few ulps, far below _RATIO_GAP
        if not all_valid:  # (np.where on a mask costs ~10 passes: only when needed)
            ratio = np.where(valid, ratio, F32(-np.inf))
        top = np.maximum.reduce(ratio, axis=0)
        found = valid.any(axis=0)
        # products in float32's normal range (see _SAFE_PRODUCTS); NaN anywhere fails these too
        low, high = _SAFE_PRODUCTS
        smallest_q2 = np.minimum.reduce(q2 if all_valid else np.where(valid, q2, F32(np.inf)), axis=0)
        usable = (top > 0) & (top * smallest_q2 > low) & (top * np.maximum.reduce(q2, axis=0) < high)
        usable &= np.maximum.reduce(squared, axis=0) < high
    pending = np.flatnonzero(usable)
    for fraction in _NEAR:
        if not pending.size:
            break
        everything = pending.size == n_blocks
        r = ratio if everything else ratio[:, pending]
        threshold = top[pending] * F32(1 - fraction)
        near = r >= threshold
        n_near = near.sum(axis=0)
        # the others _RATIO_GAP below the near ones: nothing between threshold * (1 - gap) and it
        apart = (np.count_nonzero(r >= threshold * F32(1 - _RATIO_GAP), axis=0) == n_near) & (n_near <= _MAX_NEAR)
        done = pending[apart]
        if done.size:
            # each block's near candidates in ggml's order (nonzero lists them by candidate, a
            # stable sort by block keeps that within each), shorter lists padded with their last
            # (the same candidate again: equal sums, the same winner)
            rows, cols = np.nonzero(near)
            if not apart.all():  # (indexing the near columns of a mask first costs more)
                keep = apart[cols]
                rows, cols = rows[keep], (np.cumsum(apart) - 1)[cols[keep]]
            n_near = n_near[apart]
            by_block = np.argsort(cols, kind="stable")
            rows, cols = rows[by_block], cols[by_block]
            place = np.arange(rows.size) - np.repeat(np.cumsum(n_near) - n_near, n_near)
            k = int(n_near.max())
            listed = np.zeros((k, done.size), dtype=np.intp)
            listed[place, cols] = rows
            listed = np.take_along_axis(listed, np.minimum(np.arange(k)[:, None], n_near - 1), axis=0)
            flat = listed * n_blocks + done  # index into the [candidates, blocks] arrays, flattened
            row = _first_best_in_turn(qx.reshape(-1).take(flat), q2.reshape(-1).take(flat))
            winner[done] = listed[row, np.arange(done.size)]
        pending = pending[~apart]
    rest = np.union1d(np.flatnonzero(found & ~usable), pending)
    if rest.size:
        winner[rest] = _first_best_in_turn(qx[:, rest], q2[:, rest])
    return found, winner // n_options, winner % n_options


def _first_best_in_turn(qx: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """ggml's loop over the candidates [candidates, blocks] itself, from best = -FLT_MAX: the
    winning row of each block, 0 where none wins (the caller knows which blocks have a candidate)."""
    best = np.full(qx.shape[1], -np.finfo(F32).max, dtype=F32)
    winner = np.full(qx.shape[1], -1, dtype=np.int64)
    with np.errstate(all="ignore"):
        for c in range(qx.shape[0]):
            better = (q2[c] > 0) & (qx[c] * qx[c] > best * q2[c])
            if better.any():
                best = np.where(better, (qx[c] / q2[c]) * qx[c], best)
                winner = np.where(better, c, winner)
    return np.maximum(winner, 0)


def _levels_of_split(order: np.ndarray, i1: np.ndarray, i2: np.ndarray) -> np.ndarray:
    """int32 [block, blocks]: level 0, 1 or 2 of each value, for the split (i1, i2) [blocks] of the
    values sorted by `order` (argsort along axis 0), in the values' own order."""
    rank = np.arange(order.shape[0])[:, None]
    sorted_levels = (rank >= i1).astype(np.int32) + (rank >= i2)
    levels = np.empty_like(sorted_levels)
    np.put_along_axis(levels, order, sorted_levels, axis=0)
    return levels


def _split_sums(prefix: np.ndarray, values: np.ndarray, squared: bool) -> np.ndarray:
    """[splits, blocks]: (a * v0 + b * v1) + c * v2 (squared: ((a*v0)*v0 + (b*v1)*v1) + (c*v2)*v2),
    where a, b, c are the prefix-sum differences of the three parts of each split, as in ggml."""
    low, mid, high = prefix[_I1] - prefix[0], prefix[_I2] - prefix[_I1], prefix[-1] - prefix[_I2]
    if squared:
        return ((low * values[0]) * values[0] + (mid * values[1]) * values[1]) + (high * values[2]) * values[2]
    return (low * values[0] + mid * values[1]) + high * values[2]


def _best_splits(x: np.ndarray, weight: np.ndarray):
    """(scale [blocks], levels int32 [32, blocks], shift +1/-1 [blocks], found bool [blocks]) of the
    exhaustive split search."""
    order = np.argsort(x, axis=0, kind="stable")
    w_sorted = np.take_along_axis(weight, order, axis=0)
    x_sorted = np.take_along_axis(x, order, axis=0)
    zero = np.zeros((1, x.shape[1]), dtype=F32)
    # sumx[j + 1] = sumx[j] + w * x from sumx[0] = 0, in sorted order
    prefix_x = np.add.accumulate(np.concatenate([zero, w_sorted * x_sorted]), axis=0)
    prefix_w = np.add.accumulate(np.concatenate([zero, w_sorted]), axis=0)
    # [splits, shift, blocks], ggml's order: split c with x_p, then with x_m
    sum_qx = np.stack([_split_sums(prefix_x, values, False) for values in (_X_P, _X_M)], axis=1)
    sum_q2 = np.stack([_split_sums(prefix_w, values, True) for values in (_X_P, _X_M)], axis=1)
    found, split, minus = _first_best(sum_qx, sum_q2)
    b = np.arange(x.shape[1])
    scale = sum_qx[split, minus, b] / sum_q2[split, minus, b]
    return scale, _levels_of_split(order, _I1[split], _I2[split]), np.where(minus == 1, -1, 1), found


def _pack(levels: np.ndarray) -> np.ndarray:
    g = levels.reshape(-1, GROUP, levels.shape[-1])
    packed = g[:, 0].copy()
    for i in range(1, GROUP):
        packed |= g[:, i] << (2 * i)
    return packed


def _level_values(levels: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """The shifted values x_p or x_m of levels [block, blocks], minus [groups, blocks] per group."""
    minus = np.repeat(minus, GROUP, axis=0)
    return np.where(minus, _X_M[levels], _X_P[levels])


def _onto_grid(x, weight, levels, minus, scale, type_name):
    """(grid indices [groups, blocks], scale): each group of 8 levels on the grid, or else
    ggml's iq1_find_best_neighbour2 (least sum(w * (scale * q - x)^2)); a block that had a group
    off the grid gets its scale refitted if sum(w q x) and sum(w q^2) are positive."""
    tables = iq1_grid()
    packed = _pack(levels)
    chosen = tables.index_of[packed]
    k, j = np.nonzero(chosen < 0)
    if k.size == 0:
        return chosen, scale
    try:
        for groups, points in neighbour_tiles(tables, packed[k, j]):
            kk, jj = k[groups], j[groups]
            # each group's values of levels 0..2 (x_m or x_p), looked up by row * 3 + level
            values = np.where(minus[kk, jj][:, None], _X_M, _X_P).reshape(-1)
            row = 3 * np.arange(groups.size)
            levels = np.take(tables.levels, points, axis=0)  # [k, groups, 8]
            s = scale[jj]
            error = None
            for i in range(GROUP):
                q = np.take(values, row + levels[:, :, i])
                error = add_squared_error(error, q, s, x[GROUP * kk + i, jj], weight[GROUP * kk + i, jj])
            chosen[kk, jj] = first_least_of_columns(points, error)
    except NoNeighbour:
        raise refuse_overflow(type_name) from None
    refit = np.zeros(scale.size, dtype=bool)
    refit[j] = True
    q = _level_values(tables.levels[chosen].transpose(0, 2, 1).reshape(x.shape), minus)
    sum_qx, sum_q2 = sum_from_zero((weight * q) * x), sum_from_zero((weight * q) * q)
    return chosen, np.where(refit & (sum_qx > 0) & (sum_q2 > 0), sum_qx / sum_q2, scale)


def _search_blocks(x, weight, eps, best_splits, flip_shift, minus_groups, empty_shift, type_name):
    """The split search and the move onto the grid of every block whose largest magnitude is not
    below `eps`: (scales [blocks], grid indices int32 [groups, blocks], shifts [blocks], stored
    blocks bool). best_splits gives (scale, levels, shift, found); a negative scale is flipped
    (levels 2 - l, shift flip_shift(shift)); minus_groups(shift) says which groups take x_m.
    A block not stored keeps scale 0, grid point 0 and `empty_shift`."""
    n_blocks = x.shape[1]
    block_max = np.maximum.reduce(np.abs(x), axis=0)
    scales = np.zeros(n_blocks, dtype=F32)
    shifts = np.full(n_blocks, empty_shift, dtype=np.int64)
    index = np.zeros((x.shape[0] // GROUP, n_blocks), dtype=np.int32)
    b = np.flatnonzero(~(block_max < eps))
    if b.size:
        scale, levels, shift, found = best_splits(x[:, b], weight[:, b])
        b, scale, levels, shift = b[found], scale[found], levels[:, found], shift[found]
    if b.size:
        flip = scale < 0
        levels = np.where(flip, 2 - levels, levels)
        scale = np.where(flip, -scale, scale)
        shift = np.where(flip, flip_shift(shift), shift)
        chosen, scale = _onto_grid(x[:, b], weight[:, b], levels, minus_groups(shift), scale, type_name)
        assert_scales_valid(scale, type_name)
        scales[b], shifts[b], index[:, b] = scale, shift, chosen
    stored = np.zeros(n_blocks, dtype=bool)
    stored[b] = True
    return scales, index, shifts, stored


def _quantize_blocks(rows: np.ndarray, importance: np.ndarray):
    """IQ1_S's (scales [blocks], grid indices int32 [4, blocks], shifts +1/-1 [blocks], stored
    blocks bool): one shift per block of 32, -1 meaning x_m for all its groups."""
    x, weight = block_inputs(rows, importance, BLOCK, doubled_sigma2=True)
    return _search_blocks(x, weight, _EPS, _best_splits, lambda shift: -shift,
                          lambda shift: np.repeat((shift == -1)[None, :], GROUPS, axis=0), 1, "IQ1_S")


@float_warnings_off
def _iq1_s_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, shifts, stored = _quantize_blocks(rows, importance)
    d, block_levels, nonzero = super_scales(scales, stored, SUB_BLOCKS, top=7)
    n_super = d.size
    index = transposed(index)  # [blocks, 4]
    qh = ((index >> 8) << (3 * np.arange(GROUPS))).sum(axis=1).reshape(n_super, SUB_BLOCKS)
    high = (block_levels | np.where(shifts == -1, 8, 0).reshape(n_super, SUB_BLOCKS)) << 12
    qh = qh | np.where(nonzero[:, None], high, 0)
    out = new_super_blocks(np.where(nonzero, d * F32(1.125), F32(0)), _IQ1_S_BYTES)
    out[:, 2:34] = (index & 255).astype(np.uint8).reshape(n_super, -1)
    out[:, 34:] = qh.astype("<u2").view(np.uint8).reshape(n_super, -1)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq1_s_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ1_S_BYTES)
    qh = blocks[:, 34:].copy().view("<u2").astype(np.int32)  # [supers, 8]
    index = blocks[:, 2:34].reshape(-1, SUB_BLOCKS, GROUPS).astype(np.int32) | (((qh[:, :, None] >> (3 * np.arange(GROUPS))) & 7) << 8)
    dl = d[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    delta = np.where(qh & 0x8000, -DELTA, DELTA)
    grid = iq1_grid().levels[index].astype(F32) - F32(1)  # [supers, 8, 4, 8]: -1, 0, 1
    values = dl[:, :, None, None] * (grid + delta[:, :, None, None])
    return values.reshape(data.shape[0], row_length)


# --- IQ1_M -------------------------------------------------------------------------------------

M_BLOCK = 16
M_SUB_BLOCKS = QK_K // M_BLOCK
_IQ1_M_BYTES = QK_K // 8 + QK_K // 16 + QK_K // 32
_M_EPS = F32(1e-7)  # GROUP_MAX_EPS_IQ1_M
_M_I1, _M_I2 = _splits(M_BLOCK)
# ggml's constants of the collapsed sums: v0^2 - v1^2 and v1^2 - v2^2 of x_p and x_m.
_CP1, _CP2 = _X_P[0] * _X_P[0] - _X_P[1] * _X_P[1], _X_P[1] * _X_P[1] - _X_P[2] * _X_P[2]
_CM1, _CM2 = _X_M[0] * _X_M[0] - _X_M[1] * _X_M[1], _X_M[1] * _X_M[1] - _X_M[2] * _X_M[2]
# The qh bits of a block's shift k: group 0 takes x_m for k >= 2 (0x08), group 1 for odd k (0x80).
_SHIFT_MASKS = np.array([0x00, 0x80, 0x08, 0x88], dtype=np.int32)


def _best_splits_m(x: np.ndarray, weight: np.ndarray):
    """IQ1_M's split search over blocks of 16 whose two halves may each take x_p or x_m (shift k:
    0 = +,+ 1 = +,- 2 = -,+ 3 = -,-), with ggml's per-half prefix sums and collapsed formulas.
    Returns (scale, levels [16, blocks], k, found)."""
    order = np.argsort(x, axis=0, kind="stable")
    w_sorted = np.take_along_axis(weight, order, axis=0)
    wx_sorted = w_sorted * np.take_along_axis(x, order, axis=0)
    first_half = order < M_BLOCK // 2
    n_blocks = x.shape[1]
    px = np.zeros((2, M_BLOCK + 1, n_blocks), dtype=F32)
    pw = np.zeros((2, M_BLOCK + 1, n_blocks), dtype=F32)
    for j in range(M_BLOCK):  # only the sum of the value's half moves; the other is carried as is
        for h, mine in enumerate((first_half[j], ~first_half[j])):
            px[h, j + 1] = np.where(mine, px[h, j] + wx_sorted[j], px[h, j])
            pw[h, j + 1] = np.where(mine, pw[h, j] + w_sorted[j], pw[h, j])
    qx, q2 = {}, {}
    for h in (0, 1):
        tx, tw = px[h, M_BLOCK], pw[h, M_BLOCK]
        sx = px[h][_M_I1] + px[h][_M_I2]
        qx[h, "p"], qx[h, "m"] = tx * _X_P[2] - sx, tx * _X_M[2] - sx
        q2[h, "p"] = ((tw * _X_P[2]) * _X_P[2] + pw[h][_M_I1] * _CP1) + pw[h][_M_I2] * _CP2
        q2[h, "m"] = ((tw * _X_M[2]) * _X_M[2] + pw[h][_M_I1] * _CM1) + pw[h][_M_I2] * _CM2
    signs = (("p", "p"), ("p", "m"), ("m", "p"), ("m", "m"))
    sum_qx = np.stack([qx[0, a] + qx[1, b] for a, b in signs], axis=1)  # [splits, 4, blocks]
    sum_q2 = np.stack([q2[0, a] + q2[1, b] for a, b in signs], axis=1)

    found, split, k = _first_best(sum_qx, sum_q2)
    b = np.arange(n_blocks)
    scale = sum_qx[split, k, b] / sum_q2[split, k, b]
    return scale, _levels_of_split(order, _M_I1[split], _M_I2[split]), k, found


def _by_super_block(a: np.ndarray, n_super: int) -> np.ndarray:
    """Position-major blocks of 16 [16, supers * 16] -> [256, supers]: the super-block's values in
    memory order, for a sum over all of them in ggml's order."""
    by_block = a.reshape(M_BLOCK, n_super, M_SUB_BLOCKS).transpose(2, 0, 1)
    return np.ascontiguousarray(by_block).reshape(QK_K, n_super)


def _minus_groups(k: np.ndarray) -> np.ndarray:
    """[2, blocks]: whether each group of 8 of a block takes x_m, from its shift k."""
    return np.stack([k >= 2, k % 2 == 1])


@float_warnings_off
def _iq1_m_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    x, weight = block_inputs(rows, importance, M_BLOCK, doubled_sigma2=True)
    n_blocks = x.shape[1]
    # shift k of a block of 16: which of its two groups take x_m (_minus_groups); flipped, 3 - k
    scales, index, shifts, stored = _search_blocks(x, weight, _M_EPS, _best_splits_m, lambda k: 3 - k, _minus_groups,
                                                   0, "IQ1_M")

    d, block_levels, nonzero = super_scales(scales, stored, M_SUB_BLOCKS, top=7)
    n_super = d.size
    # The super-block scale is refitted over all 256 values, in order, with every block at its
    # 3-bit scale (empty blocks too: grid point 0, x_p, scale 1).
    grid_levels = iq1_grid().levels[index].transpose(0, 2, 1).reshape(M_BLOCK, n_blocks)
    q = _level_values(grid_levels, _minus_groups(shifts)) * (2 * block_levels.reshape(-1) + 1).astype(F32)
    weight, q, x = (_by_super_block(a, n_super) for a in (weight, q, x))
    wq = weight * q
    sum_qx, sum_q2 = sum_from_zero(wq * x), sum_from_zero(wq * q)
    d = np.where(sum_q2 > 0, sum_qx / sum_q2, d)
    d_bits = fp16_bits(d * F32(1.1125)).astype(np.int32)

    qh = (index[0] >> 8) | ((index[1] >> 8) << 4)  # [blocks]
    qh = np.where(np.repeat(nonzero, M_SUB_BLOCKS), qh | _SHIFT_MASKS[shifts], qh)
    sc = (block_levels << (3 * (np.arange(M_SUB_BLOCKS) % 4))).reshape(n_super, 4, 4).sum(axis=2)
    sc |= ((d_bits[:, None] >> (4 * np.arange(4))) & 0xF) << 12
    out = np.zeros((n_super, _IQ1_M_BYTES), dtype=np.uint8)
    out[:, :32] = transposed(index).astype(np.uint8).reshape(n_super, -1)
    out[:, 32:48] = qh.astype(np.uint8).reshape(n_super, -1)
    out[:, 48:] = np.where(nonzero[:, None], sc, 0).astype("<u2").view(np.uint8)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq1_m_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _IQ1_M_BYTES)
    sc = blocks[:, 48:].copy().view("<u2").astype(np.int32)  # [supers, 4]
    d_bits = ((sc >> 12) << (4 * np.arange(4))).sum(axis=1)
    d = fp16_value(d_bits.astype(np.uint16))
    block_scale = (sc[:, :, None] >> (3 * np.arange(4))) & 7  # [supers, 16 blocks]
    dl = d[:, None] * (2 * block_scale.reshape(-1, M_SUB_BLOCKS) + 1).astype(F32)
    qh = blocks[:, 32:48].astype(np.int32)  # [supers, 16]
    index = blocks[:, :32].reshape(-1, M_SUB_BLOCKS, 2).astype(np.int32) | (((qh[:, :, None] >> (4 * np.arange(2))) & 7) << 8)
    delta = np.where((qh[:, :, None] >> (4 * np.arange(2) + 3)) & 1, -DELTA, DELTA)  # [supers, 16, 2]
    grid = iq1_grid().levels[index].astype(F32) - F32(1)  # [supers, 16, 2, 8]
    values = dl[:, :, None, None] * (grid + delta[..., None])
    return values.reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.IQ1_S, _iq1_s_quantize, _iq1_s_dequantize, supports_importance=True,
                     requires_importance=True, chunk_elements=1 << 15))
register(QuantFormat(GGMLType.IQ1_M, _iq1_m_quantize, _iq1_m_dequantize, supports_importance=True, chunk_elements=1 << 15))
