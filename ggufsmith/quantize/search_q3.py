"""ggml's make_q3_quants with do_rmse (Q3_K without an importance vector), on many groups at once.

ggml, per group of 16: levels L = clamp(nearest_int(-nmax/max * x)), with max the value of
largest magnitude; then up to five sweeps over the positions, each of which proposes moving one
value to the level that best fits the rest (new = nearest_int(x * sl2 / slx), with slx and sl2
the running sums w*x*L and w*L*L without that value, w = x*x) and accepts it if the x*x-weighted
fit improves. The running sums change only when a move is accepted, which is rare.

So rather than stepping through the 16 positions of a sweep, each *round* computes, for every
group still searching and every position at once, the move ggml would propose there and whether
it would accept it, all from the group's current state, and applies each group's first accepted
move in ggml's order: the positions before it in the sweep were computed from the same state,
so they are what ggml computed there too. A group with no accepted move ahead of where its sweep
stands ends that sweep; if the sweep moved something (and sweeps remain) the next sweep starts
from the same state at position 0, so its move is the group's first accepted one anywhere;
otherwise the group is settled and leaves. A group that does not move in the first round leaves
then, so every group in a later round has moved in its current sweep.

Which groups can move: the terms w*x*L of a group all have the sign of its iscale = -nmax/max
(L rounds iscale*x), so when max > 0 every term is <= 0, their float sum is <= each of them, and
slx = sumlx - w*x*L is never > 0, which ggml requires. Groups whose max is negative can.

Cost: everything is position-major ([16, groups], rows the positions), so that a per-group value
broadcasts along rows and the sums run in C order. A proposal differs from the current level at
~3% of the positions, so a round finds those *candidates* with whole-array passes that need no
rounding and no division (_candidates_by_products: a superset of ggml's `new != L`, proved in its
docstring; _candidates_by_division for magnitudes outside its range) and decides the rest on the
candidates alone: the exact proposal and nearest_int, the test, and each group's first accepted
move (a minimum over keys per group). The start and the first round go tile by tile
(Q3_TILE_GROUPS groups, transposed in cache, all groups: the first round reuses the start's
terms, which is cheaper than gathering the movers); the groups that moved are gathered afresh
from the rows and run their later rounds together, carrying x and L only (w and the terms
recomputed: a pass costs ~0.25 ns a value here, carrying an array through the compaction ~1 ns).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    F32,
    NonFiniteInput,
    clamped_levels,
    nearest_int_clipped,
    scratch,
    signed_max_abs,
    sum_from_zero,
    sum_of_triple_products,
)

# Groups per tile for the start and first round: 16 x 16384 float32 = 1 MiB per array. Measured
# against 8192 (the start's ~70 numpy calls paid half as often): 2-7% faster; 32768 and up slower.
Q3_TILE_GROUPS = 16384
# A group whose largest magnitude is at most this has finite terms and sums (at most 64 * 2**120)
_BOUNDED = F32(2.0**40)
# The candidates' test by products (_candidates_by_products) needs every product normal and
# finite: groups of largest magnitude within this range (or all-zero), and its margin
_PRODUCT_TEST_RANGE = (F32(2.0**-30), F32(2.0**36))
_PRODUCT_TEST_MARGIN = F32(2.0**-12)
SWEEPS = 5
# (1-D arrays' .nonzero()[0] rather than np.flatnonzero, a Python wrapper: 0.6 us a call against 3.3)
# A move's key for the minimum per group: (not ahead of the sweep, position, candidate index).
_AHEAD_BIT = np.int64(1) << np.int64(40)
_POSITION_SHIFT = np.int64(32)
_INDEX_MASK = np.int64(0xFFFFFFFF)
_NO_MOVE = np.iinfo(np.int64).max


def make_q3_quants(by_group: np.ndarray, nmax: int) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray], float]:
    """by_group: float32 [groups, n]; raises NonFiniteInput if a value is NaN or Inf. Returns (scale
    float32 [groups], levels_of, largest): levels_of(groups) gives those groups' final levels,
    uint8 [len(groups), n] in 0 .. 2*nmax-1, group-major (Q3_K needs them only for the rare groups
    whose stored scale rounds to 0); largest is the largest magnitude of all values. All-zero
    groups (largest magnitude below GROUP_MAX_EPS) get scale 0 and levels 0, as in ggml.
    """
    search = _Search(by_group, nmax)
    with np.errstate(all="ignore"):  # all-zero groups: -nmax/0 and 0*inf; overwritten below
        state = search.start()
        while state.group.size:
            state = search.later_round(state)
        sum_lx, sum_l2 = search.sums
        scale = sum_lx / sum_l2
    scale[(~(sum_l2 > 0)).nonzero()[0]] = 0  # rare: patched (np.where costs ~2 ns a group)
    scale[search.all_zero] = 0
    return scale, search.levels_of, search.largest


class _State:
    """The groups still moving: x and levels position-major [n, groups], then per group the
    running sums, the index among all groups of the call, the sweep, and the position the sweep
    resumes at."""

    def __init__(self, x, levels, sum_lx, sum_l2, group, sweep, resume):
        self.x, self.levels, self.sum_lx, self.sum_l2 = x, levels, sum_lx, sum_l2
        self.group, self.sweep, self.resume = group, sweep, resume


class _Moves:
    """Each group's first accepted move, found from whole-array candidates: `moving` (the groups,
    as column indices, that move), with their `position`, `level` and new running sums."""

    def __init__(self, moving, flat, position, level, sum_lx, sum_l2):
        self.moving, self.flat, self.position, self.level = moving, flat, position, level
        self.sum_lx, self.sum_l2 = sum_lx, sum_l2


class _Search:
    """The search over every group of a call. Its results: the final sums [2, groups] (sumlx,
    suml2), written as moves are accepted, and for levels_of each group's iscale (its start
    levels, recomputed on request) and every round's moves (group, position, level), in order.
    (Kept buffers, see numerics.scratch: levels_of reads them before the next call's search.)"""

    def __init__(self, by_group: np.ndarray, nmax: int):
        self.by_group, self.nmax = by_group, nmax
        n_groups, self.n = by_group.shape
        self.sums = scratch("q3.sums", (2, n_groups))
        self.iscale = scratch("q3.iscale", (n_groups,))
        self.amax = scratch("q3.amax", (n_groups,))
        self.all_zero = scratch("q3.all_zero", (n_groups,), bool)
        self.moves: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # the largest magnitude so far; whether every group so far has finite sums (_BOUNDED)
        # and is within the range of the candidates' test by products (_PRODUCT_TEST_RANGE)
        self.largest, self.bounded, self.by_products = 0.0, True, True

    def levels_of(self, groups: np.ndarray) -> np.ndarray:
        """The final levels of these groups, uint8 [len(groups), n] in 0 .. 2*nmax-1: the start
        levels, then the moves replayed round by round (a group moves at most once a round)."""
        nmax = self.nmax
        with np.errstate(all="ignore"):  # all-zero groups' NaN levels, reset below
            levels = clamped_levels(self.iscale[groups, None], self.by_group[groups], nmax, finite=True)
            row = np.full(self.sums.shape[1], -1, dtype=np.intp)
            row[groups] = np.arange(groups.size)
            for group, position, level in self.moves:
                at = row[group]
                mine = at >= 0
                levels[at[mine], position[mine]] = level[mine]
            out = (levels + F32(nmax)).astype(np.uint8)
        out[self.all_zero[groups]] = 0
        return out

    def start(self) -> _State:
        """ggml's start and first round, tile by tile; returns the groups that moved. Their
        values are gathered afresh from by_group (rows of 64 bytes) and transposed, their levels
        recomputed with the round's move applied: cheaper than gathering both arrays' columns
        from every tile (~1 ns a value each, with the tile's cache lines all touched)."""
        n_groups = self.by_group.shape[0]
        tiles = [self._start_tile(start, min(n_groups, start + Q3_TILE_GROUPS)) for start in range(0, n_groups, Q3_TILE_GROUPS)]
        group, position, level, sum_lx, sum_l2 = (np.concatenate(parts) for parts in zip(*tiles))
        rows = np.take(self.by_group, group, axis=0, mode="clip")
        x = _position_major_tile(rows, np.empty((self.n, group.size), dtype=F32))
        levels = clamped_levels(self.iscale[group], x, self.nmax, finite=True, out=np.empty_like(x))
        levels.reshape(-1)[position.astype(np.intp) * group.size + np.arange(group.size)] = level
        return _State(x, levels, sum_lx, sum_l2, group, np.zeros(group.size, dtype=np.uint8), (position + 1).astype(np.uint8))

    def _start_tile(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """The start and first round of groups start .. stop; returns the moves (group, position,
        level, sum_lx, sum_l2), recorded."""
        nmax, shape = self.nmax, (self.n, stop - start)
        x = _position_major_tile(self.by_group[start:stop], scratch("q3.tile_x", shape))
        amax, signed_max = signed_max_abs(x, finite=True)
        self.amax[start:stop] = amax
        all_zero = amax < GROUP_MAX_EPS
        self.all_zero[start:stop] = all_zero
        largest = float(np.maximum.reduce(amax))
        if not math.isfinite(largest):  # the maxima propagate NaN (and Inf is the largest)
            raise NonFiniteInput
        self.largest = max(self.largest, largest)
        bounded = largest <= _BOUNDED
        by_products = largest <= _PRODUCT_TEST_RANGE[1] and np.count_nonzero(amax < _PRODUCT_TEST_RANGE[0]) == np.count_nonzero(all_zero)
        self.bounded &= bounded
        self.by_products &= by_products
        iscale = np.divide(F32(-nmax), signed_max, out=self.iscale[start:stop])
        levels = clamped_levels(iscale, x, nmax, finite=True, out=scratch("q3.tile_levels", shape))
        weight, terms_lx = _weight_and_terms(x, levels)
        sum_lx = self.sums[0, start:stop]
        sum_lx[...] = sum_from_zero(terms_lx)
        sum_l2 = sum_of_triple_products(weight, levels, levels, self.sums[1, start:stop], scratch("q3.terms_l2", shape))
        # the first round, every group at once. Only groups whose max is negative can move (see
        # the module's docstring) and ggml never sweeps the all-zero ones: the test sees the
        # others' suml2 as NaN, so they have no candidates (NaN as 0/0: np.where on a random
        # mask is several times slower)
        movable = signed_max < 0
        movable &= ~all_zero
        unless_movable = np.divide(F32(0), movable, dtype=F32)
        if by_products:
            flat = _candidates_by_products(x, levels, weight, terms_lx, sum_lx, sum_l2 + unless_movable, amax)
        else:
            flat = _candidates_by_division(x, levels, weight, terms_lx, sum_lx, sum_l2 + unless_movable, bounded, movable)
        moves = self._first_moves(x, levels, terms_lx, flat, sum_lx, sum_l2, None, None)
        group = moves.moving + start
        self._record(moves, group)
        return group, moves.position, moves.level, moves.sum_lx, moves.sum_l2

    def later_round(self, state: _State) -> _State:
        """Apply each group's next move; returns the state of the groups that moved."""
        x, levels = state.x, state.levels
        weight, terms_lx = _weight_and_terms(x, levels)
        if self.by_products:
            flat = _candidates_by_products(x, levels, weight, terms_lx, state.sum_lx, state.sum_l2, self.amax[state.group])
        else:
            flat = _candidates_by_division(x, levels, weight, terms_lx, state.sum_lx, state.sum_l2, self.bounded, None)
        moves = self._first_moves(x, levels, terms_lx, flat, state.sum_lx, state.sum_l2, state.resume, state.sweep)
        group = state.group[moves.moving]
        self._record(moves, group)
        levels.reshape(-1)[moves.flat] = moves.level
        return _State(
            np.take(x, moves.moving, axis=1, mode="clip"),
            np.take(levels, moves.moving, axis=1, mode="clip"),
            moves.sum_lx,
            moves.sum_l2,
            group,
            state.sweep[moves.moving],
            (moves.position + 1).astype(np.uint8),
        )

    def _record(self, moves: _Moves, group: np.ndarray) -> None:
        """Keep the round's moves (for levels_of) and the moved groups' new sums."""
        self.moves.append((group, moves.position, moves.level))
        self.sums[0, group] = moves.sum_lx
        self.sums[1, group] = moves.sum_l2

    def _first_moves(self, x, levels, terms_lx, flat, sum_lx, sum_l2, resume, sweep) -> _Moves:
        """Each group's next move from its current state, decided on the candidates (flat
        indices into the [n, groups] arrays, in order). resume: where each group's sweep
        continues (None in the first round, where every sweep starts at 0); sweep: each group's
        sweep, advanced here for those that start the next one."""
        nmax, n_groups = self.nmax, x.shape[1]
        if n_groups & (n_groups - 1):
            position, column = np.divmod(flat, n_groups)
        else:  # a power of two (every full tile): a shift and a mask, ~3x faster than divmod
            position = flat >> (n_groups.bit_length() - 1)
            column = flat & (n_groups - 1)
        # ggml: slx = sumlx - w*x*L; sl2 = suml2 - w*L*L; new = clamp(nearest_int(x*sl2/slx));
        # if new != L: slx += w*x*new; sl2 += w*new*new; accepted if slx > 0 (checked first
        # in ggml), sl2 > 0 and slx*slx*suml2 > sumlx*sumlx*sl2. The same operations, on the
        # candidates only.
        x_at = x.reshape(-1)[flat]
        level_at = levels.reshape(-1)[flat]
        run_lx, run_l2 = sum_lx[column], sum_l2[column]
        slx_at = run_lx - terms_lx.reshape(-1)[flat]
        weight = x_at * x_at
        sl2_at = weight * level_at
        sl2_at *= level_at
        np.subtract(run_l2, sl2_at, out=sl2_at)
        new = nearest_int_clipped(x_at * sl2_at / slx_at, -nmax, nmax - 1)
        new_lx = weight * x_at
        new_lx *= new
        new_lx += slx_at
        new_l2 = weight * new
        new_l2 *= new
        new_l2 += sl2_at
        accepted = new != level_at
        accepted &= slx_at > 0
        accepted &= new_l2 > 0
        accepted &= new_lx * new_lx * run_l2 > run_lx * run_lx * new_l2
        chosen = accepted.nonzero()[0]
        # each group's first move: the least key (ahead of its sweep first, then by position)
        chosen_position, chosen_column = position[chosen], column[chosen]
        key = chosen_position << _POSITION_SHIFT
        key |= chosen
        if resume is not None:
            key |= (chosen_position < resume[chosen_column]) * _AHEAD_BIT
        first = scratch("q3.first", (n_groups,), np.int64)
        first.fill(_NO_MOVE)
        np.minimum.at(first, chosen_column, key)
        if resume is None:
            moving = (first != _NO_MOVE).nonzero()[0]
        else:
            # every group here has moved in its sweep: with nothing ahead, the next sweep if any remain
            next_sweep = (first >= _AHEAD_BIT) & (first != _NO_MOVE)
            sweep += next_sweep
            moving = ((first < _AHEAD_BIT) | (next_sweep & (sweep < SWEEPS))).nonzero()[0]
        at = first[moving] & _INDEX_MASK
        return _Moves(moving, flat[at], position[at], new[at], new_lx[at], new_l2[at])


def _weight_and_terms(x: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w = x*x and ggml's terms w*x*L (in its order, (w*x)*L), in scratch buffers [n, groups]."""
    weight = np.multiply(x, x, out=scratch("q3.w", x.shape))
    terms_lx = np.multiply(weight, x, out=scratch("q3.terms_lx", x.shape))
    terms_lx *= levels
    return weight, terms_lx


def _candidates_by_products(x, levels, weight, terms_lx, sum_lx, sum_l2, amax) -> np.ndarray:
    """The positions whose proposal may differ from L, as flat indices in order, for groups
    within _PRODUCT_TEST_RANGE (NaN sums: no candidates). weight is clobbered.

    In exact arithmetic on ggml's float terms t1 = w*x*L, t2 = w*L*L, with slx = S1 - t1:
    x*(S2 - t2)/slx - L = (x*S2 - L*S1 + E)/slx, E = L*t1 - x*t2 (zero but for the terms'
    rounding), so a changed level (|x*sl2/slx - L| >= 0.5) needs |2*x*S2 - 2*L*S1| >= slx
    within rounding: no division, and no sl2 for every position. The rounding (ggml's ~5 ulps
    on the proposal, ~6 on E, ~2 on each product here, all below 1000 ulps of S1 + amax*S2) is
    covered by lowering slx by 2**-12 of that: a superset, decided exactly by _first_moves."""
    distance = np.multiply(x, sum_l2 * F32(2), out=scratch("q3.distance", x.shape))
    np.subtract(distance, np.multiply(levels, sum_lx * F32(2), out=weight), out=distance)
    np.abs(distance, out=distance)
    lowered = sum_lx - _PRODUCT_TEST_MARGIN * (sum_lx + amax * sum_l2)
    np.subtract(lowered, terms_lx, out=weight)
    candidate = np.greater_equal(distance, weight, out=scratch("q3.candidate", x.shape, bool))
    return candidate.reshape(-1).nonzero()[0]  # ordered by position, then group


def _candidates_by_division(x, levels, weight, terms_lx, sum_lx, sum_l2, bounded, movable) -> np.ndarray:
    """The candidates as _candidates_by_products finds them, for any magnitudes: where
    x*sl2/slx is not within 0.5 of L (or is NaN when a sum is not finite); near 0.5 the
    difference of these small numbers is exact, so no changed level is missed. bounded: every
    group that can move has finite sums. movable: in the first round, the groups that can move."""
    slx = np.subtract(sum_lx, terms_lx, out=scratch("q3.slx", x.shape))
    sl2 = np.multiply(weight, levels, out=weight)
    sl2 *= levels
    np.subtract(sum_l2, sl2, out=sl2)
    distance = np.multiply(x, sl2, out=scratch("q3.distance", x.shape))
    distance /= slx
    distance -= levels
    np.abs(distance, out=distance)
    candidate = scratch("q3.candidate", x.shape, bool)
    finite = bounded or (np.isfinite(sum_lx).all() and np.isfinite(sum_l2).all())
    if finite:
        # then every term is finite (a group's terms share a sign), and where slx > 0 the
        # proposal is finite or +-Inf, never NaN: NaN marks a group that cannot move
        np.greater_equal(distance, F32(0.5), out=candidate)
    else:
        np.logical_not(np.less(distance, F32(0.5), out=candidate), out=candidate)
    flat = candidate.reshape(-1).nonzero()[0]  # ordered by position, then group
    if movable is not None and not finite:
        flat = flat[movable[flat % x.shape[1]]]
    return flat


def _position_major_tile(by_group: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[i, g] = by_group[g, i] (sums in C order need the positions as rows). Copied as four
    float32 at a time (16-byte elements), then spread: 20-25% faster than numpy's element-wise
    transpose of a tile."""
    n_groups, n = by_group.shape
    if n % 4 or not by_group.flags.c_contiguous:
        out[...] = by_group.T
        return out
    quads = scratch("q3.tile_quads", (n // 4, n_groups), np.complex128)
    quads[...] = by_group.view(np.complex128).T  # [quad of positions, group]
    spread = quads.view(np.float32).reshape(n // 4, n_groups, 4)
    rows = out.reshape(n // 4, 4, n_groups)
    for k in range(4):
        rows[:, k] = spread[:, :, k]
    return out
