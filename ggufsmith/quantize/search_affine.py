"""The scale-and-min searches of ggml's affine quant types, vectorized across blocks.

ggml quantizes one block at a time with small iterative searches (make_qkx2_quants,
make_qkx3_quants, make_qp_quants in ggml-quants.c). To be bit-exact with it we reproduce its
float32 arithmetic step for step, but on all blocks of a chunk at once:

* arrays are laid out position-major, shape (n, blocks): row i holds element i of every block, so
  a sum over a block's positions is a chain of whole-row additions in C's order (numerics.sum_from_first);
* a block leaves a search early in C; here every block runs every step and masks decide which
  results are kept, which gives the same values because the skipped steps never feed back;
* C's `nearest_int` (the 12582912.f trick) is emulated on the float's bits, so even values out
  of its intended range (huge, inf, NaN from degenerate blocks) round as they do in ggml; where a
  bound proves every value is within that range, np.rint (also round-half-even) does it faster.

All arithmetic stays float32, without fused multiply-add (see numerics.py). The searches run on
batches of at most SEARCH_BATCH_ELEMENTS inputs (a whole K-quant chunk); callers hold a few arrays
of the registry's chunk size.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.quantize.numerics import (
    F32,
    GROUP_MAX_EPS,
    NEAREST_INT_EXACT,
    aligned_copy,
    aligned_empty,
    all_bits_where,
    clamp,
    first_min,
    float_warnings_off,
    nearest_int,
    nearest_int_clipped,
    scratch,
    select_bits,
    sum_from_first,
    sum_of_products,
    sum_of_triple_products,
)

# Blocks searched together. Each candidate scale is ~16 numpy passes over the batch, each with
# ~1-2 us of dispatch: larger batches amortize it. A K-quant chunk (1<<18 values, five search
# buffers of 1 MiB) in one batch was measured 10-17% faster for Q2_K/Q4_K/Q5_K, with and without an
# imatrix, than batches of 1<<16 sized for L2, on the 2-core AMD EPYC (1 MiB L2 per core, AVX-512;
# two processes at once, L3 shared): numpy's AVX-512 loops stream from L3 fast enough that the
# per-call cost mattered more (docs/performance.md, session 11).
SEARCH_BATCH_ELEMENTS = 1 << 18


@float_warnings_off
def make_qkx_quants(
    x: np.ndarray,
    weights: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants / make_qkx3_quants (identical when weights are given) on x[n, blocks].

    Finds per block a scale and a min so that x ~ scale * L - the_min with L in 0..nmax, trying
    nstep+1 candidate scales and refitting scale and min by weighted least squares. Returns
    (scale[blocks], the_min[blocks], L[n, blocks] as float32).
    """
    n, n_blocks = x.shape
    batch = max(8, SEARCH_BATCH_ELEMENTS // n)
    if n_blocks <= batch:
        return _search_batch(aligned_copy(x), aligned_copy(weights), nmax, rmin, rdelta, nstep, use_mad)
    scale = np.empty(n_blocks, dtype=F32)
    the_min = np.empty(n_blocks, dtype=F32)
    levels = np.empty((n, n_blocks), dtype=F32)
    for start in range(0, n_blocks, batch):
        part = slice(start, start + batch)
        scale[part], the_min[part], levels[:, part] = _search_batch(
            aligned_copy(x[:, part]), aligned_copy(weights[:, part]), nmax, rmin, rdelta, nstep, use_mad
        )
    return scale, the_min, levels


def _search_batch(x, w, nmax, rmin, rdelta, nstep, use_mad):
    fnmax = F32(nmax)
    n_blocks = x.shape[1]
    low = first_min(x)
    high = np.maximum.reduce(x, axis=0)
    lowest = low.copy()  # the data's minimum, for bounding |x - min| below
    sum_w = sum_from_first(w)
    sum_x = sum_from_first(w * x)
    low[low > 0] = 0  # the_min is never negative: blocks above zero get min 0
    flat = high == low
    flat_min = low[flat]  # flat blocks return early in C; their arithmetic here is discarded
    if flat_min.size:
        # Make it cheap: all levels 0 (so det = 0 and no candidate is ever kept), span 1, and
        # the bound in levels_into finite. x is our own copy; sum_w and sum_x are done.
        x[:, flat] = 0
        low[flat] = lowest[flat] = 0
        high[flat] = 1

    if n_blocks >= 8:  # a whole-row reduction over axis 0 is C's sequential order (numerics.py)
        def add_rows(terms, out):
            np.add.reduce(terms, axis=0, out=out)
    else:
        def add_rows(terms, out):
            out[...] = sum_from_first(terms)

    buf, tmp, tmp2 = (scratch(f"qkx.{name}", x.shape) for name in ("levels", "terms", "terms2"))
    bound = np.empty(n_blocks, dtype=F32)

    def levels_into(out, iscale, low, span):
        """out = MAX(0, MIN(nmax, nearest_int(iscale * (x - low)))) as float32; span = high - low."""
        np.subtract(x, low, out=out)
        np.multiply(out, iscale, out=out)
        # |x - min| <= max(high - min, min - lowest) per block, and rounding is monotonic: when
        # that bound times iscale is in nearest_int's exact range, np.rint rounds the same way.
        np.subtract(low, lowest, out=bound)
        np.maximum(span, bound, out=bound)
        np.multiply(bound, np.abs(iscale), out=bound)
        if np.maximum.reduce(bound) <= NEAREST_INT_EXACT:  # False for NaN
            np.rint(out, out=out)
            clamp(out, 0, fnmax)
        else:
            out[...] = nearest_int_clipped(out, 0, nmax)
        return out

    def error_into(out, scale, levels, low):
        """Sum over the block of w * |diff| (or w * diff^2), diff = scale*L + min - x, in C order."""
        diff = np.multiply(levels, scale, out=tmp)
        diff += low
        diff -= x
        if use_mad:  # C: best_error += w * diff, diff = |diff| or diff*diff
            return sum_of_products(np.abs(diff, out=diff), w, out, tmp2)
        return sum_of_triple_products(diff, diff, w, out, tmp2)

    # The kept fit of each block: the candidate's iscale, its error, scale and min, and the min its
    # levels were rounded with (ROUNDED_MIN: the kept min before it won). A candidate's values are
    # written into the rows of `trial` and the winners copied over together.
    ISCALE, ERROR, SCALE, MIN, ROUNDED_MIN = range(5)
    kept = np.empty((5, n_blocks), dtype=F32)
    trial = np.empty((5, n_blocks), dtype=F32)
    kept[MIN] = kept[ROUNDED_MIN] = low
    low = kept[MIN]
    span = high - low
    np.divide(fnmax, span, out=kept[ISCALE])
    # Winners are copied over bitwise (select_bits): calls whose cost does not depend on how many
    # blocks won (fancy indexing took 10-40 us a candidate).
    changed_bits = np.empty(kept.shape, dtype=np.int32)
    winner_bits = np.empty(n_blocks, dtype=np.int32)
    scale = kept[SCALE]
    np.divide(F32(1), kept[ISCALE], out=scale)
    error_into(kept[ERROR], scale, levels_into(buf, kept[ISCALE], low, span), low)

    # The three sums of a candidate and the 2x2 solve, as whole (3, blocks) operations:
    #   det = sum_w*sum_l2 - sum_l*sum_l, scale*det = sum_w*sum_xl - sum_x*sum_l,
    #   min*det = sum_x*sum_l2 - sum_l*sum_xl  (C's order within each product; x*y == y*x)
    # as firsts * seconds - sum_l * lasts, with firsts = [sum_w, sum_w, sum_x],
    # seconds = [sum_l2, sum_xl, sum_l2] and lasts = [sum_l, sum_x, sum_xl].
    firsts = np.stack([sum_w, sum_w, sum_x])
    seconds = np.empty((3, n_blocks), dtype=F32)
    lasts = np.empty((3, n_blocks), dtype=F32)
    lasts[1] = sum_x
    sum_l, sum_l2, sum_xl = lasts[0], seconds[0], seconds[1]
    solve = np.empty((3, n_blocks), dtype=F32)
    products = np.empty((3, n_blocks), dtype=F32)
    positive_min = np.empty(n_blocks, dtype=bool)
    better = np.empty(n_blocks, dtype=bool)
    improved = np.empty(n_blocks, dtype=bool)
    stretches = [F32(rmin) + F32(rdelta) * F32(step) + fnmax for step in range(nstep + 1)] if nstep >= 1 else []
    for stretch in stretches:
        trial_iscale = np.divide(stretch, span, out=trial[ISCALE])
        levels = levels_into(buf, trial_iscale, low, span)
        weighted = np.multiply(w, levels, out=tmp)  # C: sum_l += w*l; sum_l2 += w*l*l; sum_xl += w*l*x
        add_rows(weighted, sum_l)
        sum_of_products(weighted, levels, sum_l2, tmp2)
        sum_of_products(weighted, x, sum_xl, tmp2)
        seconds[2] = sum_l2
        lasts[2] = sum_xl
        np.multiply(firsts, seconds, out=solve)
        solve -= np.multiply(lasts, sum_l, out=products)
        det = solve[0]
        this_scale, this_min = trial[SCALE], trial[MIN]
        np.divide(solve[1:], det, out=trial[SCALE : MIN + 1])
        np.greater(this_min, 0, out=positive_min)
        if positive_min.any():
            # masked stores kept here: select_bits measured no faster (7 Dec, Q4_K/Q2_K alternated)
            np.putmask(this_min, positive_min, F32(0))
            np.putmask(this_scale, positive_min, sum_xl / sum_l2)
        error_into(trial[ERROR], this_scale, levels, this_min)
        np.greater(det, 0, out=better)
        better &= np.less(trial[ERROR], kept[ERROR], out=improved)
        if better.any():
            trial[ROUNDED_MIN] = low
            select_bits(kept, trial, all_bits_where(better, winner_bits), changed_bits)
            np.subtract(high, low, out=span)

    best_low = kept[ROUNDED_MIN]
    levels = levels_into(aligned_empty(x.shape), kept[ISCALE], best_low, high - best_low)
    if flat.any():
        levels[:, flat] = 0
        scale[flat] = 0
        low[flat] = flat_min
    return scale.copy(), -low, levels


@float_warnings_off
def make_qp_quants(x: np.ndarray, nmax: int, quant_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qp_quants on x[n, blocks] (non-negative per-sub-block scales or mins of super-blocks).

    Quantizes x to L in 0..nmax with one scale per block, choosing among 9 trial scales and then
    moving single levels while that improves the weighted fit. Returns (scale[blocks],
    L[n, blocks] as int32 holding the uint8 values C stores).
    """
    x = np.ascontiguousarray(x, dtype=F32)
    qw = np.ascontiguousarray(quant_weights, dtype=F32)
    n = x.shape[0]
    fnmax = F32(nmax)

    if np.isfinite(x).all():
        # C's max from 0: the largest value wherever it is positive; where it is not, the block
        # counts as all zero and its results are overwritten below, whatever the sign of zero.
        high = np.maximum.reduce(x, axis=0)
    else:
        high = np.zeros(x.shape[1], dtype=F32)
        for row in x:  # C's MAX(max, x[i]) = max > x[i] ? max : x[i], NaN included
            high = np.where(high > row, high, row)
    all_zero = high < GROUP_MAX_EPS

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fnmax / high
        # C stores the first rounding in uint8 (no clamp), so negative values wrap.
        first_levels = (nearest_int(iscale * x) & 0xFF).astype(F32)
        scale = F32(1) / iscale
        diff = x - scale * first_levels
        best_mse = sum_from_first(qw * diff * diff)
        for trial in (-4, -3, -2, -1, 1, 2, 3, 4):
            trial_iscale = (F32(0.1) * F32(trial) + fnmax) / high
            trial_scale = F32(1) / trial_iscale
            levels = np.minimum(nearest_int(trial_iscale * x), nmax).astype(F32)
            diff = x - trial_scale * levels
            mse = sum_from_first(qw * diff * diff)
            better = mse < best_mse
            best_mse = np.where(better, mse, best_mse)
            iscale = np.where(better, trial_iscale, iscale)

        levels_int = np.minimum(nearest_int(iscale * x), nmax)
        levels_u8 = levels_int & 0xFF  # what C's uint8_t L[] holds
        levels_f = levels_int.astype(F32)  # what C adds to the sums (the int before the store)
        wx = qw * x
        sumlx = sum_from_first(wx * levels_f)
        suml2 = sum_from_first(qw * levels_f * levels_f)

        _qp_sweeps(x, wx, qw, levels_u8, sumlx, suml2, nmax)
        result = np.where(suml2 > 0, sumlx / suml2, F32(0))

    result = np.where(all_zero, F32(0), result).astype(F32)
    levels_u8[:, all_zero] = 0
    return result, levels_u8


QP_SWEEPS = 5


def _qp_sweeps(x, wx, qw, levels_u8, sumlx, suml2, nmax) -> None:
    """make_qp_quants' up to QP_SWEEPS sweeps that move one level at a time, in place on
    levels_u8 (the uint8 values of C's L[], [n, blocks]) and the blocks' running sums.

    In C, position i of a sweep proposes a new level from the sums without i's term and keeps it
    if the fit improves; a block's state changes only when a move is kept, which is rare (~0.15
    moves per block on imatrix-weighted Q2_K scales). So rather than stepping through the n
    positions with ~20 small numpy calls each, each round computes every position's proposal and
    verdict from the current state at once and applies each block's first kept move at or after
    where its sweep stands: the positions before it were evaluated from that same state in C too.
    A block with no kept move ahead ends its sweep; if that sweep moved something and sweeps
    remain, the next one starts at position 0 from the same state, so its first kept move is the
    block's first kept move anywhere; otherwise the block is done and leaves the rounds.
    """
    n = x.shape[0]
    positions = np.arange(n)[:, None]
    ids = np.arange(x.shape[1])  # blocks still sweeping
    sweep = np.zeros(ids.size, dtype=np.int8)
    resume = np.zeros(ids.size, dtype=np.intp)  # where the block's current sweep stands
    moved = np.zeros(ids.size, dtype=bool)  # in its current sweep
    while ids.size:
        held_int = levels_u8[:, ids]
        held = held_int.astype(F32)
        weights, weighted_x = qw[:, ids], wx[:, ids]
        run_lx, run_l2 = sumlx[ids], suml2[ids]
        # C: slx = sumlx - w*x[i]*L[i]; sl2 = suml2 - w*L[i]*L[i]
        slx = run_lx - weighted_x * held
        sl2 = run_l2 - weights * held * held
        # C: if (slx > 0 && sl2 > 0) new_l = MIN(nmax, nearest_int(x[i]*sl2/slx)), tried if != L[i]
        new_l = np.minimum(nearest_int(x[:, ids] * sl2 / slx), nmax)
        tried = (slx > 0) & (sl2 > 0) & (new_l != held_int)
        new_f = new_l.astype(F32)
        slx += weighted_x * new_f
        sl2 += weights * new_f * new_f
        kept = tried & (slx * slx * run_l2 > run_lx * run_lx * sl2)

        ahead = kept & (positions >= resume)
        has_ahead = ahead.any(axis=0)
        restarts = ~has_ahead & moved & (sweep < QP_SWEEPS - 1) & kept.any(axis=0)
        going = np.flatnonzero(has_ahead | restarts)
        at = np.where(has_ahead, ahead.argmax(axis=0), kept.argmax(axis=0))[going]
        block = ids[going]
        levels_u8[at, block] = new_l[at, going] & 0xFF
        sumlx[block] = slx[at, going]
        suml2[block] = sl2[at, going]
        ids = block
        sweep = sweep[going] + restarts[going]
        resume = at + 1
        moved = np.ones(going.size, dtype=bool)
