"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups *position-major*: `x[k]` is the k-th value of every
group, a contiguous vector over all groups. A sum over a group is then a reduction over axis 0,
which numpy performs as an outer loop over positions with a vector accumulator: ggml's exact
summation order (np.sum over the last axis would sum pairwise and round differently).

ggml-quants.c is compiled without FMA contraction (x86-64 baseline, no -ffast-math), so every
`a*b + c` below is two roundings, as numpy does it.

Speed: make_qx_quants tries 19 scales per group, ~8 passes over the data each, so it works on tiles
of TILE_GROUPS groups whose buffers stay in the CPU's L2 cache, reused across candidates. Choices
between candidates use a bitwise select, because np.where with an unpredictable mask is an order
of magnitude slower than arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np

# ggml treats a group whose largest magnitude is below this as all zero.
GROUP_MAX_EPS = np.float32(1e-15)

# Groups per tile in make_qx_quants: 16 x 4096 float32 = 256 KiB per buffer, five buffers.
TILE_GROUPS = 4096
# make_q3_quants' sweeps work on vectors of one value per group: longer tiles amortize the
# ~600 numpy calls of a sweep, while 16 x 16384 float32 buffers still stay in L2.
Q3_TILE_GROUPS = 16384

_ROUNDING_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it leaves round(x) in the low mantissa bits
_ZERO = np.float32(0)
_TRANSPOSE_SLICE = 256


def ieee_quiet(func):
    """Run a row function with numpy's float warnings off: for extreme inputs ggml's float32 math
    overflows to Inf and makes NaN (e.g. 1/d of a subnormal d, x*x of a huge x), and we reproduce
    that rather than warn about it."""

    @functools.wraps(func)
    def quiet(*args):
        with np.errstate(all="ignore"):
            return func(*args)

    return quiet


def nearest_int(values: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit: round half to even through the float32 magic-number add.

    Equal to np.rint for |values| < 2**22; beyond that (and for NaN/Inf) it wraps as the C code does.
    """
    bits = (values.astype(np.float32, copy=False) + _ROUNDING_MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def select(mask: np.ndarray, if_true: np.ndarray, if_false: np.ndarray) -> np.ndarray:
    """np.where(mask, if_true, if_false) for float32 arrays of one shape, bit for bit, but fast."""
    true_bits = if_true.view(np.uint32)
    false_bits = if_false.view(np.uint32)
    return (((true_bits ^ false_bits) & np.negative(mask, dtype=np.uint32)) ^ false_bits).view(np.float32)


def signed_max_abs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest |x|, the x that has it) per group along axis 0; the first of equal magnitudes wins,
    a group of zeros gives +0.0, and NaN never wins (a scale can be NaN after float32 overflow), as
    ggml's `if (ax > amax) { amax = ax; max = x; }` starting from 0."""
    amax = np.fmax.reduce(np.abs(x), axis=0)  # fmax skips NaN
    amax[~(amax > 0)] = 0
    # np.argmax over axis 0 is slow; the sign is all we need, and only a tie between +amax and
    # -amax in one group needs to know which came first.
    positive = np.logical_or.reduce(x == amax, axis=0)
    negative = np.logical_or.reduce(x == -amax, axis=0)
    signed = np.where(negative & ~positive, -amax, amax)
    ties = np.flatnonzero(positive & negative & (amax > 0))
    if ties.size:
        tied = x[:, ties]
        first = np.argmax(np.abs(tied) == amax[ties], axis=0)
        signed[ties] = tied[first, np.arange(ties.size)]
    return amax, signed


def to_position_major(groups: np.ndarray) -> np.ndarray:
    """float32[groups, n] -> contiguous float32[n, groups]. Transposed in slices that stay in cache,
    which is several times faster than one np.ascontiguousarray(groups.T)."""
    out = np.empty(groups.shape[::-1], dtype=groups.dtype)
    for start in range(0, groups.shape[0], _TRANSPOSE_SLICE):
        out[:, start : start + _TRANSPOSE_SLICE] = groups[start : start + _TRANSPOSE_SLICE].T
    return out


def from_position_major(by_position: np.ndarray) -> np.ndarray:
    """The inverse of to_position_major."""
    out = np.empty(by_position.shape[::-1], dtype=by_position.dtype)
    for start in range(0, by_position.shape[1], _TRANSPOSE_SLICE):
        out[start : start + _TRANSPOSE_SLICE] = by_position[:, start : start + _TRANSPOSE_SLICE].T
    return out


def ordered_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in index order starting from +0.0, as a C loop `s = 0; s += t[i]`.

    For a C-contiguous [n, groups >= 2] array numpy's reduce adds whole rows in order. With one
    group the array is effectively 1-D and numpy sums it pairwise, which rounds differently: then
    (and for any other layout) add the rows one by one.
    """
    if terms.ndim == 2 and terms.shape[1] >= 2 and terms.flags.c_contiguous:
        return np.add.reduce(terms, axis=0, initial=_ZERO)
    total = np.zeros(terms.shape[1:], dtype=np.float32)
    for row in terms:
        total += row
    return total


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
        tile_weights = None if weights is None else np.ascontiguousarray(weights[:, tile])
        scale[tile], levels[:, tile] = _make_qx_quants_tile(np.ascontiguousarray(x[:, tile]), nmax, tile_weights)
    return scale, levels


def _make_qx_quants_tile(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):  # all-zero groups divide by zero; they are overwritten below
        if weights is None:
            weights = x * x
        weighted_x = weights * x
        amax, signed_max = signed_max_abs(x)
        finite = bool(np.isfinite(x).all())
        levels = np.empty_like(x)
        terms = np.empty_like(x)

        def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            _clamped_levels(iscale, x, nmax, finite, out=levels)
            sum_lx = ordered_sum(np.multiply(weighted_x, levels, out=terms))
            np.multiply(weights, levels, out=terms)
            sum_l2 = ordered_sum(np.multiply(terms, levels, out=terms))
            return sum_lx, sum_l2

        best_iscale = np.float32(-nmax) / signed_max
        sum_lx, sum_l2 = sums(best_iscale)
        scale = select(sum_l2 != 0, sum_lx / sum_l2, np.zeros_like(sum_lx))
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
            best_iscale = select(better, iscale, best_iscale)
            scale = select(better, sum_lx / sum_l2, scale)
            best = select(better, scale * sum_lx, best)

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
    scale = np.empty(n_groups, dtype=np.float32)
    levels = np.empty((n, n_groups), dtype=np.uint8)
    for start in range(0, n_groups, Q3_TILE_GROUPS):
        tile = slice(start, start + Q3_TILE_GROUPS)
        scale[tile], levels[:, tile] = _make_q3_quants_tile(np.ascontiguousarray(x[:, tile]), nmax)
    return scale, levels


def _make_q3_quants_tile(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):
        amax, signed_max = signed_max_abs(x)
        iscale = np.float32(-nmax) / signed_max
        levels = _clamped_levels(iscale, x, nmax, finite=True)
        weights = x * x
        weighted_x = weights * x
        sum_lx = ordered_sum(weighted_x * levels)
        sum_l2 = ordered_sum(weights * levels * levels)

        # A sweep that changes nothing leaves the state as it was, so later sweeps would change
        # nothing either: ggml's early exit only saves time, and dropping settled groups is exact.
        # All-zero groups are swept too (cheaper than skipping them) and reset below.
        changed = _q3_sweep(x, weights, weighted_x, levels, sum_lx, sum_l2, nmax)
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

        scale = select(sum_l2 > 0, sum_lx / sum_l2, np.zeros_like(sum_lx))
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out


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
        t1 += _ROUNDING_MAGIC
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
