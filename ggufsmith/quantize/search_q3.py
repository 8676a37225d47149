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

Only groups whose largest value is negative can move: the terms w*x*L of a group all have the
sign of its iscale = -nmax/max (L rounds iscale*x), so when max > 0 every term is <= 0, their
float sum is <= each of them, and slx = sumlx - w*x*L is never > 0, which ggml requires.

Layout and cost: everything is position-major ([16, groups], rows the positions), so that a
per-group value broadcasts along rows and the sums run in C order, and a round is ~30 whole-array
passes with no per-candidate indexing (a pass costs ~0.2-0.3 ns a value here; gathering an array
~1 ns, so the state carried from round to round is x and L only, w and the terms recomputed).
The start and the first round go tile by tile (Q3_TILE_GROUPS groups, transposed in cache); the
groups that moved in the first round of every tile (about a fifth of all) are pooled and run their
later rounds together, so the rounds' fixed cost (~45 numpy calls each, ~10 rounds on ever fewer
groups) is paid once per call rather than once per tile.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    F32,
    clamp,
    round_clamped,
    scratch,
    signed_max_abs,
    sum_of_products,
    sum_of_triple_products,
)



# Groups per tile for the start: 16 x 8192 float32 = 512 KiB per array.
Q3_TILE_GROUPS = 8192
SWEEPS = 5


def make_q3_quants(by_group: np.ndarray, nmax: int) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """by_group: float32 [groups, n], finite (the registry checked it). Returns (scale
    float32 [groups], levels_of): levels_of(groups) gives those groups' final levels, uint8
    [len(groups), n] in 0 .. 2*nmax-1, group-major (Q3_K needs them only for the rare groups whose
    stored scale rounds to 0). All-zero groups (largest magnitude below GROUP_MAX_EPS) get scale 0
    and levels 0, as in ggml.
    """
    search = _Search(by_group, nmax)
    with np.errstate(all="ignore"):  # all-zero groups: -nmax/0 and 0*inf; overwritten below
        state = search.start()
        while state.group.size:
            state = search.round(state)
        sum_lx, sum_l2 = search.sums
        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, F32(0))
    scale[search.all_zero] = 0

    def levels_of(groups: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # all-zero groups' NaN levels, reset below
            out = (search.levels[:, groups].T + F32(nmax)).astype(np.uint8)
        out[search.all_zero[groups]] = 0
        return out

    return scale, levels_of


class _Search:
    """The search's results for every group (`levels` position-major float32 [n, groups], `sums`
    [2, groups]: the final sumlx and suml2), written as moves are accepted. Kept buffers (see
    numerics.scratch): levels_of reads them before the next call's search."""

    def __init__(self, by_group: np.ndarray, nmax: int):
        self.by_group, self.nmax = by_group, nmax
        n_groups, self.n = by_group.shape
        self.levels = scratch("q3.levels", (self.n, n_groups))
        self.sums = scratch("q3.sums", (2, n_groups))
        self.all_zero = scratch("q3.all_zero", (n_groups,), bool)

    def start(self) -> "_State":
        """ggml's start and first round, tile by tile (their arrays in cache); returns the state
        of the groups that moved, from every tile, for the later rounds."""
        n_groups = self.by_group.shape[0]
        moved = []
        for start in range(0, n_groups, Q3_TILE_GROUPS):
            state = self.round(self._start_tile(start, min(n_groups, start + Q3_TILE_GROUPS)))
            state.x, state.levels = state.x.copy(), state.levels.copy()  # out of the scratch buffers
            moved.append(state)
        return _State.concatenate(moved)

    def _start_tile(self, start: int, stop: int) -> "_State":
        """The start for groups start .. stop-1; returns the state of those that can move."""
        nmax, shape = self.nmax, (self.n, stop - start)
        x = scratch("q3.tile_x", shape)
        x[...] = self.by_group[start:stop].T  # position-major, for sums in C order
        amax, signed_max = signed_max_abs(x, finite=True)
        all_zero = self.all_zero[start:stop] = amax < GROUP_MAX_EPS
        iscale = F32(-nmax) / signed_max
        levels = np.multiply(x, iscale, out=scratch("q3.tile_levels", shape))
        np.rint(levels, out=levels)
        clamp(levels, -nmax, nmax - 1)
        self.levels[:, start:stop] = levels
        weight = np.multiply(x, x, out=scratch("q3.tile_w", shape))
        weighted_x = np.multiply(weight, x, out=scratch("q3.tile_wx", shape))
        terms = scratch("q3.tile_terms", shape)
        sum_lx = sum_of_products(weighted_x, levels, self.sums[0, start:stop], terms)
        sum_l2 = sum_of_triple_products(weight, levels, levels, self.sums[1, start:stop], terms)
        movers = np.flatnonzero((iscale > 0) & ~all_zero)
        mover_shape = (self.n, movers.size)
        return _State(
            np.take(x, movers, axis=1, out=scratch("q3.x.0", mover_shape), mode="clip"),
            np.take(levels, movers, axis=1, out=scratch("q3.levels.0", mover_shape), mode="clip"),
            sum_lx[movers],
            sum_l2[movers],
            movers + start,
            sweep=np.zeros(movers.size, dtype=np.uint8),
            resume=None,
        )

    def round(self, state: "_State") -> "_State":
        """Apply each group's next move; returns the state of the groups that moved."""
        n, nmax = self.n, self.nmax
        x, levels, sum_lx, sum_l2 = state.x, state.levels, state.sum_lx, state.sum_l2
        n_groups = sum_lx.size
        shape = (n, n_groups)
        # ggml: w = x*x; slx = sumlx - w*x*L; sl2 = suml2 - w*L*L
        weight = np.multiply(x, x, out=scratch("q3.w", shape))
        weighted_x = np.multiply(weight, x, out=scratch("q3.wx", shape))
        slx = np.multiply(weighted_x, levels, out=scratch("q3.slx", shape))
        np.subtract(sum_lx, slx, out=slx)
        sl2 = np.multiply(weight, levels, out=scratch("q3.sl2", shape))
        sl2 *= levels
        np.subtract(sum_l2, sl2, out=sl2)
        # new = clamp(nearest_int(x * sl2 / slx)), then slx += w*x*new; sl2 += w*new*new
        proposal = np.multiply(x, sl2, out=scratch("q3.proposal", shape))
        proposal /= slx
        round_clamped(proposal, nmax)
        new_lx = np.multiply(weighted_x, proposal, out=weighted_x)
        new_lx += slx
        new_l2 = np.multiply(weight, proposal, out=weight)
        new_l2 *= proposal
        new_l2 += sl2
        # ggml moves if slx > 0 (before the update), new != L, then sl2 > 0 and
        # slx*slx*suml2 > sumlx*sumlx*sl2 (after): the float tests as one, min(slx, sl2, lhs - rhs)
        # > 0 (a - b > 0 exactly when a > b, and a NaN anywhere fails it, as each test in C)
        lowest = np.minimum(slx, new_l2, out=sl2)
        lhs = np.multiply(new_lx, new_lx, out=slx)
        lhs *= sum_l2
        lhs -= np.multiply(new_l2, sum_lx * sum_lx, out=scratch("q3.rhs", shape))
        np.minimum(lowest, lhs, out=lowest)
        accept = np.greater(lowest, 0, out=scratch("q3.accept", shape, bool))
        accept &= np.not_equal(proposal, levels, out=scratch("q3.changed", shape, bool))

        # Each group's first accepted position, and its first at or after `resume`: positions
        # coded as p (accepted) or p + 16 (not), so that a minimum over the rows finds the first.
        coded = np.multiply(accept.view(np.uint8), np.uint8(16), out=scratch("q3.coded", shape, np.uint8))
        np.subtract(_CODES[:n], coded, out=coded)
        first = np.minimum.reduce(coded, axis=0)  # >= 16: none
        if state.resume is None:  # the first round: every sweep starts at position 0
            position = first
        else:
            # positions before `resume` wrap around to >= 240 (uint8), accepted ones ahead stay
            # below 16 - resume, and the others come to 16 - resume or more
            np.subtract(coded, state.resume, out=coded)
            ahead = np.minimum.reduce(coded, axis=0)
            room = np.uint8(16) - state.resume
            has_ahead = ahead < room
            position = np.where(has_ahead, ahead + state.resume, np.where(state.sweep < SWEEPS - 1, first, np.uint8(16)))
            state.sweep += ~has_ahead  # a group that does not move now leaves: its sweep no longer matters
        moving = np.flatnonzero(position < 16)
        at_position = position[moving].astype(np.intp)
        at = at_position * n_groups + moving
        new_level = proposal.reshape(-1)[at]
        new_sum_lx = new_lx.reshape(-1)[at]
        new_sum_l2 = new_l2.reshape(-1)[at]
        levels.reshape(-1)[at] = new_level
        group = state.group[moving]
        self.levels.reshape(-1)[at_position * self.levels.shape[1] + group] = new_level
        self.sums[0, group] = new_sum_lx
        self.sums[1, group] = new_sum_l2
        kept_shape = (n, moving.size)
        parity = state.parity ^ 1
        return _State(
            np.take(x, moving, axis=1, out=scratch(f"q3.x.{parity}", kept_shape), mode="clip"),
            np.take(levels, moving, axis=1, out=scratch(f"q3.levels.{parity}", kept_shape), mode="clip"),
            new_sum_lx,
            new_sum_l2,
            group,
            sweep=state.sweep[moving],
            resume=(at_position + 1).astype(np.uint8),
            parity=parity,
        )


# 16 + position, for each row of the codes above
_CODES = (np.arange(16, dtype=np.uint8) + np.uint8(16))[:, None]


class _State:
    """The groups still moving: x and levels position-major [n, groups] (in scratch buffers that
    alternate by `parity` from round to round), their running sums, their index among all groups
    of the call, their sweep, and the position their sweep resumes at (None in the first round)."""

    def __init__(self, x, levels, sum_lx, sum_l2, group, sweep, resume, parity=0):
        self.x, self.levels, self.sum_lx, self.sum_l2 = x, levels, sum_lx, sum_l2
        self.group, self.sweep, self.resume, self.parity = group, sweep, resume, parity

    @staticmethod
    def concatenate(states: list["_State"]) -> "_State":
        """One state of the groups of several (each in its own buffers or the same scratch ones)."""
        def joined(name: str, axis: int = 0) -> np.ndarray:
            return np.concatenate([getattr(state, name) for state in states], axis=axis)

        return _State(
            joined("x", 1), joined("levels", 1), joined("sum_lx"), joined("sum_l2"), joined("group"),
            joined("sweep"), joined("resume"),
        )
