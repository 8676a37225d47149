"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups position-major (see numerics.py), all at once.

Speed: make_qx_quants tries 19 scales per group, ~8 passes over the data each, so it works on tiles
of TILE_GROUPS groups whose buffers stay in the CPU's L2 cache, reused across candidates. Buffers
are cache-line aligned (numpy's AVX-512 loops run up to ~1.5x faster on them).
"""

from __future__ import annotations

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    ROUNDING_MAGIC,
    aligned_copy,
    aligned_empty,
    nearest_int,
    signed_max_abs,
    sum_from_zero,
)

# Groups per tile in make_qx_quants: 16 x 4096 float32 = 256 KiB per buffer, five buffers.
TILE_GROUPS = 4096
# make_q3_quants' sweeps work on vectors of one value per group: longer tiles amortize the
# ~600 numpy calls of a sweep, while 16 x 16384 float32 buffers still stay in L2.
Q3_TILE_GROUPS = 16384


def _clamped_levels(iscale: np.ndarray, x: np.ndarray, nmax: int, finite: bool, out: np.ndarray | None = None) -> np.ndarray:
    """clamp(nearest_int(iscale * x), -nmax, nmax - 1) as float32 (exact small integers).

    For finite x, |iscale * x| <= nmax + 1 and np.rint is nearest_int. Group scales searched in
    turn (Q3_K) can be NaN or Inf after float32 overflow: then only the bit-level emulation is right.
    """
    if finite:
        out = np.multiply(x, iscale, out=out)
        np.rint(out, out=out)
    else:
        rounded = nearest_int(x * iscale)
        if out is None:
            out = np.empty(rounded.shape, dtype=np.float32)
        out[...] = rounded
    np.clip(out, -nmax, nmax - 1, out=out)
    return out


def make_qx_quants(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants with rmse_type 1: a symmetric scale per group, chosen among 19 candidates
    (-nmax/max stretched by -0.9 .. +0.9 levels) to minimise the weighted squared error.

    x: float32[n, groups], position-major. weights: float32[n, groups], or None for ggml's default
    x*x. Returns (scale float32[groups], levels uint8[n, groups] in 0 .. 2*nmax-1); groups whose
    largest magnitude is below GROUP_MAX_EPS get scale 0 and levels 0, as in ggml.
    """
    n, n_groups = x.shape
    scale = np.empty(n_groups, dtype=np.float32)
    levels = np.empty((n, n_groups), dtype=np.uint8)
    for start in range(0, n_groups, TILE_GROUPS):
        tile = slice(start, start + TILE_GROUPS)
        tile_weights = None if weights is None else aligned_copy(weights[:, tile])
        scale[tile], levels[:, tile] = _make_qx_quants_tile(aligned_copy(x[:, tile]), nmax, tile_weights)
    return scale, levels


def _make_qx_quants_tile(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):  # all-zero groups divide by zero; they are overwritten below
        # Cache-line aligned buffers: numpy's AVX-512 loops are much faster on them.
        if weights is None:
            weights = np.multiply(x, x, out=aligned_empty(x.shape))
        weighted_x = np.multiply(weights, x, out=aligned_empty(x.shape))
        finite = bool(np.isfinite(x).all())
        amax, signed_max = signed_max_abs(x, finite)
        levels = aligned_empty(x.shape)
        terms = aligned_empty(x.shape)

        def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            _clamped_levels(iscale, x, nmax, finite, out=levels)
            sum_lx = sum_from_zero(np.multiply(weighted_x, levels, out=terms))
            np.multiply(weights, levels, out=terms)
            sum_l2 = sum_from_zero(np.multiply(terms, levels, out=terms))
            return sum_lx, sum_l2

        best_iscale = np.float32(-nmax) / signed_max
        sum_lx, sum_l2 = sums(best_iscale)
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(np.float32(nmax) + np.float32(0.1) * np.float32(step)) / signed_max
            sum_lx, sum_l2 = sums(iscale)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
            if not better.any():
                continue
            # ggml recomputes the levels from the winning iscale; so do we, once, at the end.
            best_iscale = np.where(better, iscale, best_iscale)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)

        best_levels = _clamped_levels(best_iscale, x, nmax, finite, out=levels)
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (best_levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_q3_quants with do_rmse: start from -nmax/max, then up to 5 sweeps that move one
    value at a time to the level that most improves the x*x-weighted fit, keeping running sums.

    x: float32[n, groups], position-major. Returns (scale float32[groups], levels uint8[n, groups]
    in 0 .. 2*nmax-1); all-zero groups get scale 0 and levels 0, as in ggml.
    """
    n, n_groups = x.shape
    amax = np.empty(n_groups, dtype=np.float32)
    levels = np.empty((n, n_groups), dtype=np.float32)
    sum_lx = np.empty(n_groups, dtype=np.float32)
    sum_l2 = np.empty(n_groups, dtype=np.float32)
    changed = np.empty(n_groups, dtype=bool)
    with np.errstate(all="ignore"):
        # The first sweep moves values in ~20% of the groups; it runs tile by tile, from cache.
        for start in range(0, n_groups, Q3_TILE_GROUPS):
            tile = slice(start, start + Q3_TILE_GROUPS)
            amax[tile], levels[:, tile], sum_lx[tile], sum_l2[tile], changed[tile] = _q3_first_sweep(
                np.ascontiguousarray(x[:, tile]), nmax
            )
        # A sweep that changes nothing leaves the state as it was, so later sweeps would change
        # nothing either: ggml's early exit only saves time, and dropping settled groups is exact.
        # The later sweeps run on the unsettled groups of all tiles together: they are few, and a
        # sweep costs ~400 numpy calls whatever its size.
        active = np.flatnonzero(changed)
        for _ in range(4):
            if active.size == 0:
                break
            x_sub, levels_sub = np.take(x, active, axis=1), np.take(levels, active, axis=1)
            lx_sub, l2_sub = sum_lx[active], sum_l2[active]
            weights_sub = x_sub * x_sub
            changed = _q3_sweep(x_sub, weights_sub, weights_sub * x_sub, levels_sub, lx_sub, l2_sub, nmax)
            levels[:, active], sum_lx[active], sum_l2[active] = levels_sub, lx_sub, l2_sub
            active = active[changed]

        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, np.float32(0))
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out


def _q3_first_sweep(x: np.ndarray, nmax: int):
    """Start values (levels from -nmax/max, their sums) and the first sweep, for one tile of groups.
    Returns (amax, levels, sum_lx, sum_l2, changed). All-zero groups are swept too (cheaper than
    skipping them); the caller resets them."""
    amax, signed_max = signed_max_abs(x, finite=True)  # quantized data: the registry checked it
    iscale = np.float32(-nmax) / signed_max
    levels = _clamped_levels(iscale, x, nmax, finite=True)
    weights = x * x
    weighted_x = weights * x
    sum_lx = sum_from_zero(weighted_x * levels)
    sum_l2 = sum_from_zero(weights * levels * levels)
    changed = _q3_sweep(x, weights, weighted_x, levels, sum_lx, sum_l2, nmax)
    return amax, levels, sum_lx, sum_l2, changed


def _q3_sweep(x, weights, weighted_x, levels, sum_lx, sum_l2, nmax: int) -> np.ndarray:
    """One sweep of make_q3_quants over every group given, updating levels and the running sums in
    place; returns which groups changed.

    For each position the proposed level is computed for all groups in preallocated buffers; only
    ~2% of groups propose a different level, so the acceptance test and the updates run on those
    alone."""
    n, n_groups = x.shape
    slx, sl2, new, t1 = np.empty((4, n_groups), dtype=np.float32)
    movable = np.empty(n_groups, dtype=bool)
    test = np.empty(n_groups, dtype=bool)
    changed = np.zeros(n_groups, dtype=bool)
    t1_bits = t1.view(np.int32)
    for i in range(n):
        old = levels[i]
        # slx = sumlx - w*x*L; sl2 = suml2 - w*L*L
        np.multiply(weighted_x[i], old, out=t1)
        np.subtract(sum_lx, t1, out=slx)
        np.multiply(weights[i], old, out=t1)
        t1 *= old
        np.subtract(sum_l2, t1, out=sl2)
        # new = clamp(nearest_int(x * sl2 / slx)), nearest_int through the float32 magic add
        np.multiply(x[i], sl2, out=t1)
        t1 /= slx
        t1 += ROUNDING_MAGIC
        t1_bits &= 0x007FFFFF
        t1_bits -= 0x00400000
        np.copyto(new, t1_bits, casting="unsafe")
        np.clip(new, -nmax, nmax - 1, out=new)
        # ggml only considers the move if slx > 0 and the level differs
        np.greater(slx, 0, out=movable)
        np.not_equal(new, old, out=test)
        movable &= test
        candidates = np.flatnonzero(movable)
        if candidates.size == 0:
            continue
        level = new[candidates]
        run_lx, run_l2 = sum_lx[candidates], sum_l2[candidates]
        new_lx = slx[candidates] + weighted_x[i, candidates] * level
        new_l2 = sl2[candidates] + weights[i, candidates] * level * level
        # accept if new_l2 > 0 and new_lx^2 * suml2 > sumlx^2 * new_l2
        accept = (new_l2 > 0) & (new_lx * new_lx * run_l2 > run_lx * run_lx * new_l2)
        accepted = candidates[accept]
        levels[i, accepted] = level[accept]
        sum_lx[accepted] = new_lx[accept]
        sum_l2[accepted] = new_l2[accept]
        changed[accepted] = True
    return changed
