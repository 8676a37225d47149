"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups position-major (see numerics.py), all at once.

Speed: make_qx_quants tries 19 scales per group, ~8 passes over the data each, so it works on tiles
of TILE_GROUPS groups whose buffers are reused across candidates. Buffers
are cache-line aligned (numpy's AVX-512 loops run up to ~1.5x faster on them).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    aligned_copy,
    aligned_empty,
    all_bits_where,
    clamped_levels,
    select_bits,
    signed_max_abs,
    signed_max_of_extremes,
    sum_of_products,
    sum_of_triple_products,
)

# Groups per tile in make_qx_quants: 16 x 16384 float32 = 1 MiB per buffer, five buffers; a whole
# K-quant chunk of Q6_K in one tile. Measured 5% faster for Q6_K than L2-sized tiles of 4096 groups
# on the 2-core AMD EPYC (see SEARCH_BATCH_ELEMENTS in search_affine.py).
TILE_GROUPS = 16384


def make_qx_quants(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants_with_largest without the largest magnitude."""
    scale, levels, _ = make_qx_quants_with_largest(x, nmax, weights)
    return scale, levels


def make_qx_quants_with_largest(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, float]:
    """ggml's make_qx_quants with rmse_type 1: a symmetric scale per group, chosen among 19 candidates
    (-nmax/max stretched by -0.9 .. +0.9 levels) to minimise the weighted squared error.

    x: float32[n, groups], position-major. weights: float32[n, groups], or None for ggml's default
    x*x. Returns (scale float32[groups], levels uint8[n, groups] in 0 .. 2*nmax-1, the largest
    magnitude in x: NaN or Inf if x has any); groups whose largest magnitude is below
    GROUP_MAX_EPS get scale 0 and levels 0, as in ggml.
    """
    n, n_groups = x.shape
    scale = np.empty(n_groups, dtype=np.float32)
    levels = np.empty((n, n_groups), dtype=np.uint8)
    largest = []
    for start in range(0, n_groups, TILE_GROUPS):
        tile = slice(start, start + TILE_GROUPS)
        tile_weights = None if weights is None else aligned_copy(weights[:, tile])
        scale[tile], levels[:, tile], tile_largest = _make_qx_quants_tile(aligned_copy(x[:, tile]), nmax, tile_weights)
        largest.append(tile_largest)
    return scale, levels, float(np.max(largest))  # (np.max propagates NaN)


def _make_qx_quants_tile(x: np.ndarray, nmax: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, float]:
    with np.errstate(all="ignore"):  # all-zero groups divide by zero; they are overwritten below
        # Cache-line aligned buffers: numpy's AVX-512 loops are much faster on them.
        if weights is None:
            weights = np.multiply(x, x, out=aligned_empty(x.shape))
        weighted_x = np.multiply(weights, x, out=aligned_empty(x.shape))
        # the extremes propagate NaN and Inf: finite data iff the largest magnitude is finite
        high, low = np.maximum.reduce(x, axis=0), np.minimum.reduce(x, axis=0)
        largest = float(np.maximum.reduce(np.maximum(high, -low)))
        finite = math.isfinite(largest)
        amax, signed_max = signed_max_of_extremes(x, high, low) if finite else signed_max_abs(x)
        levels = aligned_empty(x.shape)
        terms = aligned_empty(x.shape)

        def sums(numerator: np.float32) -> tuple[np.ndarray, np.ndarray]:
            """C's sumlx += w*x*l and suml2 += w*l*l, i.e. (w*x)*l and (w*l)*l, from 0, for the
            levels of iscale = numerator / max. |numerator| <= nmax - 0.6 (ggml's stretches of
            -0.6 .. -0.9) keeps every |iscale * x| below nmax - 1/2 (float rounding adds a few
            ulps): no clamp."""
            within = abs(float(numerator)) < nmax - 0.55
            clamped_levels(numerator / signed_max, x, nmax, finite, out=levels, within=within)
            sum_lx, sum_l2 = np.empty((2, x.shape[1]), dtype=np.float32)
            sum_of_products(weighted_x, levels, sum_lx, terms)
            sum_of_triple_products(weights, levels, levels, sum_l2, terms)
            return sum_lx, sum_l2

        # iscale = numerator / max for ggml's candidates in its order: -nmax, then -(nmax + 0.1*is)
        # for is = -9 .. 9 but 0. Each group's winner so far is kept as its candidate's index.
        numerators = _qx_numerators(nmax)
        sum_lx, sum_l2 = sums(numerators[0])
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        winner = np.zeros(x.shape[1], dtype=np.int32)
        take = np.empty(x.shape[1], dtype=np.int32)
        for index in range(1, numerators.size):
            sum_lx, sum_l2 = sums(numerators[index])
            better = sum_l2 > 0
            better &= sum_lx * sum_lx > best * sum_l2
            if not better.any():
                continue
            # winners updated with arithmetic, not masked stores (see select_bits)
            all_bits_where(better, take)
            candidate_scale = sum_lx / sum_l2
            select_bits(scale, candidate_scale, take)
            select_bits(best, candidate_scale * sum_lx, take)
            # indices come in increasing order: the better ones' index is the largest yet
            np.maximum(winner, take & np.int32(index), out=winner)
        # ggml recomputes the levels from the winning iscale; so do we, once, at the end
        best_iscale = numerators[winner] / signed_max
        best_levels = clamped_levels(best_iscale, x, nmax, finite, out=levels)
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (best_levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out, largest


@functools.cache
def _qx_numerators(nmax: int) -> np.ndarray:
    """make_qx_quants' candidate iscale numerators, float32, in ggml's order: -nmax, then
    -(nmax + 0.1f*is) for is = -9 .. 9 but 0."""
    stretches = [-(np.float32(nmax) + np.float32(0.1) * np.float32(step)) for step in range(-9, 10) if step]
    numerators = np.array([np.float32(-nmax), *stretches], dtype=np.float32)
    numerators.setflags(write=False)  # shared by every call
    return numerators
