"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups position-major (see numerics.py), all at once.

Speed: make_qx_quants tries 19 scales per group, ~8 passes over the data each, so it works on tiles
of TILE_GROUPS groups whose buffers are reused across candidates. Buffers
are cache-line aligned (numpy's AVX-512 loops run up to ~1.5x faster on them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    NEAREST_INT_EXACT,
    aligned_copy,
    aligned_empty,
    all_bits_where,
    clamp,
    nearest_int,
    scratch,
    select_bits,
    signed_max_abs,
    sum_from_zero,
    sum_of_products,
    sum_of_triple_products,
)

# Groups per tile in make_qx_quants: 16 x 16384 float32 = 1 MiB per buffer, five buffers; a whole
# K-quant chunk of Q6_K in one tile. Measured 5% faster for Q6_K than L2-sized tiles of 4096 groups
# on the 2-core AMD EPYC (see SEARCH_BATCH_ELEMENTS in search_affine.py).
TILE_GROUPS = 16384
# make_q3_quants computes its starting sums on tiles of this many groups (16 x 4096 float32 =
# 256 KiB per array, in L2).
Q3_TILE_GROUPS = 4096


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
    clamp(out, -nmax, nmax - 1)
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
            """C's sumlx += w*x*l and suml2 += w*l*l, i.e. (w*x)*l and (w*l)*l, from 0."""
            _clamped_levels(iscale, x, nmax, finite, out=levels)
            sum_lx, sum_l2 = np.empty((2, x.shape[1]), dtype=np.float32)
            sum_of_products(weighted_x, levels, sum_lx, terms)
            sum_of_triple_products(weights, levels, levels, sum_l2, terms)
            return sum_lx, sum_l2

        # iscale = numerator / max for ggml's candidates in its order: -nmax, then -(nmax + 0.1*is)
        # for is = -9 .. 9 but 0. Each group's winner so far is kept as its candidate's index.
        numerators = _qx_numerators(nmax)
        sum_lx, sum_l2 = sums(numerators[0] / signed_max)
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        winner = np.zeros(x.shape[1], dtype=np.int32)
        take = np.empty(x.shape[1], dtype=np.int32)
        for index in range(1, numerators.size):
            sum_lx, sum_l2 = sums(numerators[index] / signed_max)
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
        best_levels = _clamped_levels(best_iscale, x, nmax, finite, out=levels)
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (best_levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out


@functools.cache
def _qx_numerators(nmax: int) -> np.ndarray:
    """make_qx_quants' candidate iscale numerators, float32, in ggml's order: -nmax, then
    -(nmax + 0.1f*is) for is = -9 .. 9 but 0."""
    stretches = [-(np.float32(nmax) + np.float32(0.1) * np.float32(step)) for step in range(-9, 10) if step]
    numerators = np.array([np.float32(-nmax), *stretches], dtype=np.float32)
    numerators.setflags(write=False)  # shared by every call
    return numerators


def make_q3_quants(x: np.ndarray, by_group: np.ndarray, nmax: int) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """ggml's make_q3_quants with do_rmse: start from -nmax/max, then up to 5 sweeps that move one
    value at a time to the level that most improves the x*x-weighted fit, keeping running sums.

    x: float32[n, groups], position-major (for the sums in C order); by_group: the same values as
    [groups, n] (the rows as they are). Returns (scale float32[groups], levels_of): levels_of(groups)
    gives those groups' levels, uint8[len(groups), n] in 0 .. 2*nmax-1 (group-major like by_group).
    Q3_K needs the search's levels only for the rare groups whose stored scale rounds to 0, so
    they are made on request rather than for every group. All-zero groups get scale 0 and levels
    0, as in ggml.
    """
    n, n_groups = x.shape
    sum_lx, sum_l2 = np.empty((2, n_groups), dtype=np.float32)
    with np.errstate(all="ignore"):
        amax, signed_max = signed_max_abs(x, finite=True)  # the registry checked it
        iscale = np.float32(-nmax) / signed_max
        # The start's sums, tile by tile so that their arrays stay in cache.
        for start in range(0, n_groups, Q3_TILE_GROUPS):
            tile = slice(start, start + Q3_TILE_GROUPS)
            shape = (n, min(n_groups, start + Q3_TILE_GROUPS) - start)
            x_tile = x[:, tile]
            start_levels = _clamped_levels(iscale[tile], x_tile, nmax, finite=True, out=scratch("q3.start", shape))
            terms_lx, terms_l2 = _terms(x_tile, start_levels, scratch("q3.terms_lx", shape), scratch("q3.terms_l2", shape))
            sum_lx[tile] = sum_from_zero(terms_lx)
            sum_l2[tile] = sum_from_zero(terms_l2)
        # Only groups whose largest value is negative can move (see _Q3Moves).
        movers = np.flatnonzero(iscale > 0)
        moves = None
        if movers.size:
            moves = _Q3Moves(by_group, iscale, movers, sum_lx, sum_l2, nmax)
            moves.run()
            sum_lx[movers], sum_l2[movers] = moves.final_sums
        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, np.float32(0))
        all_zero = amax < GROUP_MAX_EPS
        scale[all_zero] = 0

    def levels_of(groups: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # all-zero groups: 0 * -inf, reset below
            levels = _clamped_levels(iscale[groups, None], by_group[groups], nmax, finite=True)
            if moves is not None:
                at = np.minimum(np.searchsorted(movers, groups), movers.size - 1)
                moved = movers[at] == groups
                levels[moved] = moves.final_levels[at[moved]]
            levels += np.float32(nmax)
            out = levels.astype(np.uint8)
        out[all_zero[groups]] = 0
        return out

    return scale, levels_of


def _terms(x: np.ndarray, levels: np.ndarray, out_lx: np.ndarray, out_l2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's terms w*x*L and w*L*L with w = x*x, in its order of operations ((w*x)*L and
    (w*L)*L), w computed once."""
    weight = np.multiply(x, x, out=out_l2)
    np.multiply(weight, x, out=out_lx)
    out_lx *= levels
    weight *= levels
    weight *= levels
    return out_lx, out_l2


def _indices(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero(mask) without its Python layers (~0.6 us a call; a round makes five)."""
    return mask.reshape(-1).nonzero()[0]


def _first_of_runs(keys: np.ndarray) -> np.ndarray:
    """For sorted keys, True where a run of equal keys starts."""
    first = np.empty(keys.size, dtype=bool)
    first[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return first


class _Q3Moves:
    """make_q3_quants' sweeps, for the groups that can move.

    In ggml, position i of a sweep computes slx = sumlx - w*x*L and, only if slx > 0, proposes a
    new level and accepts it if it improves the fit. The terms w*x*L of a group all have the sign
    of its iscale = -nmax/max (L rounds iscale * x), so for a group whose largest value is positive
    every term is <= 0, their float sum is <= each of them, and slx = sumlx - w*x*L is never > 0:
    nothing moves, its first sweep ends it. Only groups with a negative largest value get here.

    A group's state (levels, the two running sums) only changes when a move is accepted, which is
    rare. So rather than stepping through the 16 positions of a sweep with ~25 small numpy calls
    each, each round computes, for every group still here, the move ggml would propose and whether
    it would accept it at every position from the current state, and applies each group's first
    accepted move in ggml's order: the positions before it in the sweep were computed from the same
    state, so they are what ggml computed there too. A group with no accepted move ahead ends its
    sweep; if the sweep moved something (and sweeps remain) the next sweep starts from the same
    state at position 0, so its first move is the group's first accepted move anywhere; otherwise
    the group is settled and leaves. A group that does not move in the first round leaves then, so
    every group in a later round has moved in its current sweep.

    The per-position state is four group-major fields, [4, groups, n]: x, L, and the terms w*x*L
    and w*L*L as ggml adds and removes them (kept as computed, so that they are removed bit for
    bit); the per-group state is the running sums [2, groups] and the group's index among the
    movers, its sweep and where its sweep continues [3, groups]. Each accepted move is also
    written through to final_levels and final_sums (every mover, in mover order), so that a group
    leaving needs nothing but to be dropped: the rounds after the first are mostly per-call
    overhead, and dropping is three takes into the other of two buffers.
    """

    SWEEPS = 5
    X, LEVELS, TERMS_LX, TERMS_L2 = range(4)
    MOVER, SWEEP, RESUME = range(3)

    def __init__(self, by_group, iscale, movers, sum_lx, sum_l2, nmax):
        n_movers, n = movers.size, by_group.shape[1]
        self.n, self.nmax, self.parity, self.first_round = n, nmax, 0, True
        self.state = scratch("q3.state.0", (4, n_movers, n))
        x, start_levels, terms_lx, terms_l2 = self.state
        np.take(by_group, movers, axis=0, out=x, mode="clip")  # mode="raise" would copy through a buffer
        _clamped_levels(iscale[movers, None], x, nmax, finite=True, out=start_levels)
        _terms(x, start_levels, terms_lx, terms_l2)
        self.sums = scratch("q3.sums.0", (2, n_movers))
        np.take(sum_lx, movers, out=self.sums[0])
        np.take(sum_l2, movers, out=self.sums[1])
        # Every mover's levels and sums as they end, written through as it moves.
        # (kept buffers: levels_of reads final_levels before the next chunk's search)
        self.final_levels = scratch("q3.final_levels", start_levels.shape)
        self.final_levels[...] = start_levels
        self.final_sums = scratch("q3.final_sums", self.sums.shape)
        self.final_sums[...] = self.sums
        self.group = scratch("q3.group.0", (3, n_movers), np.intp)
        self.group[self.MOVER] = np.arange(n_movers)
        self.group[self.SWEEP :] = 0

    def run(self) -> None:
        """Rounds until every group is settled."""
        while self.sums.shape[1]:
            moving = self._round()
            self.first_round = False
            self.parity ^= 1
            for name, array in (("state", self.state), ("sums", self.sums), ("group", self.group)):
                kept = scratch(f"q3.{name}.{self.parity}", _kept_shape(array, moving.size), array.dtype)
                setattr(self, name, np.take(array, moving, axis=1, out=kept, mode="clip"))

    def _round(self) -> np.ndarray:
        """Apply each group's next move; returns the groups (rows) that moved."""
        state, n = self.state, self.n
        (sum_lx, sum_l2), (mover, sweep, resume) = self.sums, self.group
        n_groups = sum_lx.size
        shape = (n_groups, n)
        slx = np.subtract(sum_lx[:, None], state[self.TERMS_LX], out=scratch("q3.slx", shape))
        sl2 = np.subtract(sum_l2[:, None], state[self.TERMS_L2], out=scratch("q3.sl2", shape))
        # ggml: if slx > 0, new = clamp(nearest_int(x * sl2 / slx)); considered if new != L
        proposal = np.multiply(state[self.X], sl2, out=scratch("q3.proposal", shape))
        proposal /= slx
        round_clamped(proposal, self.nmax)
        changed = np.not_equal(proposal, state[self.LEVELS], out=scratch("q3.changed", shape, bool))
        flat = _indices(changed)  # ordered by group, then position
        flat = flat[slx.reshape(-1)[flat] > 0]  # ggml tests slx first; cheaper on these few
        row, position = np.divmod(flat, n)
        # ggml: slx += w*x*new; sl2 += w*new*new; accept if sl2 > 0 && slx^2 * suml2 > sumlx^2 * sl2
        x = state[self.X].reshape(-1)[flat]
        weight = x * x
        level = proposal.reshape(-1)[flat]
        term_lx = weight * x
        term_lx *= level
        term_l2 = weight * level
        term_l2 *= level
        new_lx = slx.reshape(-1)[flat] + term_lx
        new_l2 = sl2.reshape(-1)[flat] + term_l2
        run_lx, run_l2 = sum_lx[row], sum_l2[row]
        accepted = _indices((new_l2 > 0) & (new_lx * new_lx * run_l2 > run_lx * run_lx * new_l2))
        a_row = row[accepted]

        choice = np.full(n_groups, -1, dtype=np.intp)  # index into `accepted` of each group's move
        first = _indices(_first_of_runs(a_row))  # each group's first accepted move
        if self.first_round:  # every sweep starts at position 0
            choice[a_row[first]] = first
        else:
            ahead = _indices(position[accepted] >= resume[a_row])
            first_ahead = ahead[_first_of_runs(a_row[ahead])]
            choice[a_row[first_ahead]] = first_ahead
            # every group here has moved in its sweep: with nothing ahead, a next sweep if any remain
            next_sweep = (choice < 0) & (sweep < self.SWEEPS - 1)
            starts_sweep = next_sweep[a_row[first]]
            choice[a_row[first[starts_sweep]]] = first[starts_sweep]
            sweep += next_sweep  # a group that does not move now leaves: its sweep no longer matters

        moving = _indices(choice >= 0)
        chosen = accepted[choice[moving]]
        at = flat[chosen]
        new_level = level[chosen]
        state[self.LEVELS].reshape(-1)[at] = new_level
        state[self.TERMS_LX].reshape(-1)[at] = term_lx[chosen]
        state[self.TERMS_L2].reshape(-1)[at] = term_l2[chosen]
        moving_movers = mover[moving]
        sum_lx[moving] = self.final_sums[0, moving_movers] = new_lx[chosen]
        sum_l2[moving] = self.final_sums[1, moving_movers] = new_l2[chosen]
        at_position = position[chosen]
        resume[moving] = at_position + 1
        self.final_levels[moving_movers, at_position] = new_level
        return moving


def _kept_shape(array: np.ndarray, n_kept: int) -> tuple[int, ...]:
    return array.shape[:1] + (n_kept,) + array.shape[2:]


def round_clamped(values: np.ndarray, nmax: int) -> None:
    """values = clamp(nearest_int(values), -nmax, nmax - 1) in place, as float32. np.rint is
    nearest_int when every value is within its exact range; otherwise (slx near 0 gives huge
    values, NaN or Inf) the bit-level emulation, which wraps as C does."""
    # the ufuncs' own reduce: np.max/np.min add ~1.5 us of Python each, per round (NaN wins either way)
    top = np.maximum(np.maximum.reduce(values, axis=None), -np.minimum.reduce(values, axis=None)) if values.size else 0
    if top <= NEAREST_INT_EXACT:  # False for NaN
        np.rint(values, out=values)
    else:
        values[...] = nearest_int(values)
    clamp(values, -nmax, nmax - 1)
