"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups *position-major*: `x[k]` is the k-th value of every
group, a contiguous vector over all groups. A sum over the group is then a Python loop over its
16/32 positions, each step one vector operation across thousands of groups, which keeps ggml's
exact float32 summation order (np.sum would sum pairwise and round differently).

ggml-quants.c is compiled without FMA contraction (x86-64 baseline, no -ffast-math), so every
`a*b + c` below is two roundings, as numpy does it.
"""

from __future__ import annotations

import numpy as np

# ggml treats a group whose largest magnitude is below this as all zero.
GROUP_MAX_EPS = np.float32(1e-15)

_ROUNDING_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it leaves round(x) in the low mantissa bits


def nearest_int(values: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit: round half to even through the float32 magic-number add.

    Equal to np.rint for |values| < 2**22; beyond that it wraps as the C code does.
    """
    bits = (values.astype(np.float32, copy=False) + _ROUNDING_MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def signed_max_abs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest |x|, the x that has it) per group along axis 0; the first of equal magnitudes wins,
    a group of zeros gives +0.0, and NaN never wins (a scale can be NaN after float32 overflow), as
    ggml's `if (ax > amax) { amax = ax; max = x; }` starting from 0."""
    ax = np.abs(x)
    ax[np.isnan(ax)] = 0
    first = np.argmax(ax, axis=0)
    amax = np.take_along_axis(ax, first[None], axis=0)[0]
    signed = np.take_along_axis(x, first[None], axis=0)[0]
    return amax, np.where(amax > 0, signed, np.float32(0))


def ordered_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in index order, starting from +0.0, as a C `for` loop with `s += t[i]`."""
    total = np.zeros(terms.shape[1:], dtype=np.float32)
    for term in terms:
        total += term
    return total


def _clamped_levels(iscale: np.ndarray, x: np.ndarray, nmax: int, finite: bool = True) -> np.ndarray:
    """clamp(nearest_int(iscale * x), -nmax, nmax - 1) as float32 (exact small integers).

    For finite x, |iscale * x| <= nmax + 1 and np.rint is nearest_int. Group scales searched in
    turn (Q3_K) can be NaN or Inf after float32 overflow: then only the bit-level emulation is right.
    """
    if not finite:
        levels = nearest_int(iscale * x).astype(np.float32)
        np.clip(levels, -nmax, nmax - 1, out=levels)
        return levels
    levels = np.rint(iscale * x)
    np.clip(levels, -nmax, nmax - 1, out=levels)
    return levels


def make_qx_quants(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants with rmse_type 1: a symmetric scale per group, chosen among 19 candidates
    (-nmax/max stretched by -0.9 .. +0.9 levels) to minimise the weighted squared error.

    x: float32[n, groups], position-major. weights: float32[n, groups], or None for ggml's default
    x*x. Returns (scale float32[groups], levels uint8[n, groups] in 0 .. 2*nmax-1); groups whose
    largest magnitude is below GROUP_MAX_EPS get scale 0 and levels 0, as in ggml.
    """
    with np.errstate(all="ignore"):  # all-zero groups divide by zero; they are overwritten below
        if weights is None:
            weights = x * x
        weighted_x = weights * x
        amax, signed_max = signed_max_abs(x)
        finite = bool(np.isfinite(x).all())

        def candidate(iscale_numerator: np.float32):
            iscale = iscale_numerator / signed_max
            levels = _clamped_levels(iscale, x, nmax, finite)
            sum_lx = ordered_sum(weighted_x * levels)
            sum_l2 = ordered_sum(weights * levels * levels)
            return levels, sum_lx, sum_l2

        best_levels, sum_lx, sum_l2 = candidate(np.float32(-nmax))
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        for step in range(-9, 10):
            if step == 0:
                continue
            numerator = -(np.float32(nmax) + np.float32(0.1) * np.float32(step))
            levels, sum_lx, sum_l2 = candidate(numerator)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
            if not better.any():
                continue
            best_levels = np.where(better, levels, best_levels)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)

    all_zero = amax < GROUP_MAX_EPS
    scale = np.where(all_zero, np.float32(0), scale)
    levels = (best_levels + np.float32(nmax)).astype(np.uint8)
    levels[:, all_zero] = 0
    return scale, levels


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_q3_quants with do_rmse: start from -nmax/max, then up to 5 sweeps that move one
    value at a time to the level that most improves the x*x-weighted fit, keeping running sums.

    x: float32[n, groups], position-major. Returns (scale float32[groups], levels uint8[n, groups]
    in 0 .. 2*nmax-1); all-zero groups get scale 0 and levels 0, as in ggml.
    """
    n = x.shape[0]
    with np.errstate(all="ignore"):
        amax, signed_max = signed_max_abs(x)
        iscale = np.float32(-nmax) / signed_max
        levels = _clamped_levels(iscale, x, nmax)
        weights = x * x
        weighted_x = weights * x
        sum_lx = ordered_sum(weighted_x * levels)
        sum_l2 = ordered_sum(weights * levels * levels)

        # A sweep that changes nothing leaves the state as it was, so later sweeps would change
        # nothing either: ggml's early exit only saves time, and dropping settled groups is exact.
        active = np.flatnonzero(amax >= GROUP_MAX_EPS)
        for _ in range(5):
            if active.size == 0:
                break
            xa, wa, wxa, la = x[:, active], weights[:, active], weighted_x[:, active], levels[:, active]
            run_lx, run_l2 = sum_lx[active], sum_l2[active]
            changed = np.zeros(active.size, dtype=bool)
            for i in range(n):
                old = la[i]
                slx = run_lx - wxa[i] * old
                sl2 = run_l2 - wa[i] * old * old
                new = nearest_int(xa[i] * sl2 / slx).astype(np.float32)
                np.clip(new, -nmax, nmax - 1, out=new)
                new_lx = slx + wxa[i] * new
                new_l2 = sl2 + wa[i] * new * new
                accept = (
                    (slx > 0)
                    & (new != old)
                    & (new_l2 > 0)
                    & (new_lx * new_lx * run_l2 > run_lx * run_lx * new_l2)
                )
                la[i] = np.where(accept, new, old)
                run_lx = np.where(accept, new_lx, run_lx)
                run_l2 = np.where(accept, new_l2, run_l2)
                changed |= accept
            levels[:, active] = la
            sum_lx[active] = run_lx
            sum_l2[active] = run_l2
            active = active[changed]

        all_zero = amax < GROUP_MAX_EPS
        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, np.float32(0))
    scale = np.where(all_zero, np.float32(0), scale)
    out = (levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out
