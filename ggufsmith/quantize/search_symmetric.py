"""The scale searches of ggml's symmetric quantizers, run on many groups at once.

ggml quantizes one group of 16 or 32 values at a time, in C, with float32 sums accumulated in
order. Here every function takes the groups position-major (see numerics.py), all at once.

Speed: make_qx_quants tries 19 scales per group, ~8 passes over the data each, so it works on tiles
of TILE_GROUPS groups whose buffers are reused across candidates. Buffers
are cache-line aligned (numpy's AVX-512 loops run up to ~1.5x faster on them).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ggufsmith.quantize.numerics import (
    GROUP_MAX_EPS,
    NEAREST_INT_EXACT,
    aligned_copy,
    aligned_empty,
    nearest_int,
    scratch,
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
            """C's sumlx += w*x*l and suml2 += w*l*l, i.e. (w*x)*l and (w*l)*l, from 0."""
            _clamped_levels(iscale, x, nmax, finite, out=levels)
            sum_lx, sum_l2 = np.empty((2, x.shape[1]), dtype=np.float32)
            sum_of_products(weighted_x, levels, sum_lx, terms)
            sum_of_triple_products(weights, levels, levels, sum_l2, terms)
            return sum_lx, sum_l2

        best_iscale = np.float32(-nmax) / signed_max
        sum_lx, sum_l2 = sums(best_iscale)
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx
        stretches = [-(np.float32(nmax) + np.float32(0.1) * np.float32(step)) for step in range(-9, 10) if step]
        for stretch in stretches:
            iscale = stretch / signed_max
            sum_lx, sum_l2 = sums(iscale)
            better = sum_l2 > 0
            better &= sum_lx * sum_lx > best * sum_l2
            if not better.any():
                continue
            # ggml recomputes the levels from the winning iscale; so do we, once, at the end.
            # (np.putmask: the same as np.copyto(where=), measured 1.6x faster on these vectors)
            np.putmask(best_iscale, better, iscale)
            np.putmask(scale, better, sum_lx / sum_l2)
            np.putmask(best, better, scale * sum_lx)

        best_levels = _clamped_levels(best_iscale, x, nmax, finite, out=levels)
        all_zero = amax < GROUP_MAX_EPS  # their levels are NaN here (0 * -inf): cast, then reset
        scale[all_zero] = 0
        out = (best_levels + np.float32(nmax)).astype(np.uint8)
    out[:, all_zero] = 0
    return scale, out


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
        # Only groups whose largest value is negative can move (see _Q3Moves): _Q3Moves makes
        # their start itself, on their gathered columns. The others only need the start's sums,
        # made here on tiles of their gathered columns so that the arrays stay in cache.
        can_move = iscale > 0
        movers, settled = np.flatnonzero(can_move), np.flatnonzero(~can_move)
        for start in range(0, settled.size, Q3_TILE_GROUPS):
            tile = settled[start : start + Q3_TILE_GROUPS]
            shape = (n, tile.size)
            x_tile = np.take(x, tile, axis=1, out=scratch("q3.start_x", shape), mode="clip")
            start_levels = _clamped_levels(iscale[tile], x_tile, nmax, finite=True, out=scratch("q3.start", shape))
            terms_lx, terms_l2 = _terms(x_tile, start_levels, scratch("q3.terms_lx", shape), scratch("q3.terms_l2", shape))
            sum_lx[tile] = sum_from_zero(terms_lx)
            sum_l2[tile] = sum_from_zero(terms_l2)
        moves = None
        if movers.size:
            moves = _Q3Moves(x, iscale, movers, nmax)
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
                levels[moved] = moves.final_levels[:, at[moved]].T
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
    """np.flatnonzero(mask) without its Python layers (~0.6 us a call; a round makes several)."""
    return mask.reshape(-1).nonzero()[0]


# ggml's nearest_int adds 1.5 * 2**23 and keeps the low 23 bits of the sum's bit pattern.
_ROUNDING_MAGIC = np.float32(12582912.0)
# nearest_int's result is those bits minus 2**22: _Q3Moves keeps levels with that bias.
_LEVEL_BIAS = np.int32(0x400000)


class _Q3Moves:
    """make_q3_quants' sweeps, for the groups that can move.

    In ggml, position i of a sweep computes slx = sumlx - w*x*L and, only if slx > 0, proposes a
    new level and accepts it if it improves the fit. The terms w*x*L of a group all have the sign
    of its iscale = -nmax/max (L rounds iscale * x), so for a group whose largest value is positive
    every term is <= 0, their float sum is <= each of them, and slx = sumlx - w*x*L is never > 0:
    nothing moves, its first sweep ends it. Only groups with a negative largest value get here.

    A group's state (levels, the two running sums) only changes when a move is accepted, which is
    rare. So rather than stepping through the 16 positions of a sweep with ~30 small numpy calls
    each, each round computes, for every group still here, the move ggml would propose and whether
    it would accept it at every position from the current state, and applies each group's first
    accepted move in ggml's order: the positions before it in the sweep were computed from the same
    state, so they are what ggml computed there too. A group with no accepted move ahead ends its
    sweep; if the sweep moved something (and sweeps remain) the next sweep starts from the same
    state at position 0, so its first move is the group's first accepted move anywhere; otherwise
    the group is settled and leaves. A group that does not move in the first round leaves then, so
    every group in a later round has moved in its current sweep.

    Everything is position-major, [n, groups], so that every dense pass is a contiguous vector
    over the groups with the per-group sums broadcast along the outer axis (numpy's fast form; the
    group-major [groups, n] - [groups, 1] form ran ~4x slower). The dense passes go as far as the
    rounded, clamped proposal compared with the level; only the few positions where it differs
    (~1 in 30 in the first round) go on to ggml's acceptance test.

    The per-position state is four fields, [4, n, groups]: x, the levels as nearest_int's biased
    bits (level + 2**22 as int32, viewed in the float32 field: compared with the rounded
    proposal's bits as they are), and the terms w*x*L and w*L*L as ggml adds and removes them
    (kept as computed, so that they are removed bit for bit); the per-group state is the running
    sums [2, groups] and the group's index among the movers, its sweep and where its sweep
    continues [3, groups]. Each accepted move is also written through to final_levels
    ([n, movers], float32 levels) and final_sums ([2, movers]), so that a group leaving needs
    nothing but to be dropped: dropping is three takes into the other of two buffers.
    """

    SWEEPS = 5

    def __init__(self, x, iscale, movers, nmax):
        n, n_movers = x.shape[0], movers.size
        self.n, self.nmax, self.parity, self.first_round = n, nmax, 0, True
        # Flat buffers at the first round's size, shaped to each round's (a scratch() call costs
        # ~4 us, a dozen a round): the round's dense passes and the state's two halves.
        self.buffers = {
            name: scratch(f"q3.{name}", (size,), dtype)
            for name, size, dtype in (
                ("slx", n * n_movers, np.float32),
                ("sl2", n * n_movers, np.float32),
                ("proposal", n * n_movers, np.float32),
                ("changes", n * n_movers, bool),
                *((f"state.{half}", 4 * n * n_movers, np.float32) for half in (0, 1)),
                *((f"sums.{half}", 2 * n_movers, np.float32) for half in (0, 1)),
                *((f"group.{half}", 3 * n_movers, np.intp) for half in (0, 1)),
            )
        }
        self.state = self._shaped("state.0", (4, n, n_movers))
        moving_x, level_bits, terms_lx, terms_l2 = self.state
        np.take(x, movers, axis=1, out=moving_x, mode="clip")  # mode="raise" would copy through a buffer
        # The start's levels, clamp(nearest_int(iscale * x)), as biased bits the way the rounds
        # compare them (see _round).
        np.multiply(moving_x, iscale[movers], out=level_bits)
        level_bits += _ROUNDING_MAGIC
        bits = level_bits.view(np.int32)
        bits &= 0x7FFFFF
        np.maximum(bits, _LEVEL_BIAS - nmax, out=bits)
        np.minimum(bits, _LEVEL_BIAS + nmax - 1, out=bits)
        # Every mover's levels and sums as they end, written through as it moves.
        # (kept buffers: levels_of reads final_levels before the next chunk's search)
        self.final_levels = scratch("q3.final_levels", (n, n_movers))
        start_levels = np.subtract(bits, _LEVEL_BIAS, out=self.final_levels, casting="unsafe")
        _terms(moving_x, start_levels, terms_lx, terms_l2)
        self.sums = self._shaped("sums.0", (2, n_movers))
        self.sums[0] = sum_from_zero(terms_lx)
        self.sums[1] = sum_from_zero(terms_l2)
        self.final_sums = scratch("q3.final_sums", self.sums.shape)
        self.final_sums[...] = self.sums
        self.group = self._shaped("group.0", (3, n_movers))
        mover, sweep_and_resume = self.group[0], self.group[1:]
        mover[...] = np.arange(n_movers)
        sweep_and_resume[...] = 0

    def _shaped(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.buffers[name][: math.prod(shape)].reshape(shape)

    def run(self) -> None:
        """Rounds until every group is settled."""
        while self.sums.shape[1]:
            moving = self._round()
            self.first_round = False
            self.parity ^= 1
            for name, array in (("state", self.state), ("sums", self.sums), ("group", self.group)):
                kept = self._shaped(f"{name}.{self.parity}", array.shape[:-1] + (moving.size,))
                setattr(self, name, np.take(array, moving, axis=-1, out=kept, mode="clip"))

    def _round(self) -> np.ndarray:
        """Apply each group's next move; returns the groups (columns) that moved."""
        x, level_bits, terms_lx, terms_l2 = self.state
        level_bits = level_bits.view(np.int32)
        (sum_lx, sum_l2), (mover, sweep, resume) = self.sums, self.group
        n, n_groups = x.shape
        shape = (n, n_groups)
        slx = np.subtract(sum_lx, terms_lx, out=self._shaped("slx", shape))
        sl2 = np.subtract(sum_l2, terms_l2, out=self._shaped("sl2", shape))
        # ggml: if slx > 0, new = clamp(nearest_int(x * sl2 / slx)); considered if new != L
        proposal = np.multiply(x, sl2, out=self._shaped("proposal", shape))
        proposal /= slx
        # nearest_int as C computes it (the float sum's low 23 bits, which wrap for huge or NaN
        # proposals), clamped while still biased by 2**22: compared with the biased levels as is.
        bits = np.add(proposal, _ROUNDING_MAGIC, out=proposal).view(np.int32)
        bits &= 0x7FFFFF
        np.maximum(bits, _LEVEL_BIAS - self.nmax, out=bits)  # not np.clip: ~10 us of Python a call
        np.minimum(bits, _LEVEL_BIAS + self.nmax - 1, out=bits)
        changes = np.not_equal(bits, level_bits, out=self._shaped("changes", shape))
        flat = _indices(changes)  # ordered by position, then group
        flat = flat[slx.reshape(-1)[flat] > 0]  # ggml tests slx first; cheaper on these few
        position, column = np.divmod(flat, n_groups)
        new_bits = bits.reshape(-1)[flat]
        level = np.subtract(new_bits, _LEVEL_BIAS, out=np.empty(flat.size, np.float32), casting="unsafe")
        # ggml: slx += w*x*new; sl2 += w*new*new; accept if sl2 > 0 && slx^2 * suml2 > sumlx^2 * sl2
        moved_x = x.reshape(-1)[flat]
        weight = moved_x * moved_x
        term_lx = weight * moved_x
        term_lx *= level
        term_l2 = weight * level
        term_l2 *= level
        new_lx = slx.reshape(-1)[flat] + term_lx
        new_l2 = sl2.reshape(-1)[flat] + term_l2
        run_lx, run_l2 = sum_lx[column], sum_l2[column]
        changes = new_l2 > 0
        changes &= new_lx * new_lx * run_l2 > run_lx * run_lx * new_l2
        accepted = _indices(changes)
        a_column = column[accepted]

        # Each group's first accepted move in sweep order: the candidates are ordered by position,
        # so the smallest index among a group's moves ahead of where its sweep resumes; with none
        # ahead, the smallest among those behind, i.e. the next sweep's first move. Keys put the
        # moves behind after all those ahead.
        n_accepted = accepted.size
        key = np.arange(n_accepted)
        choice = np.full(n_groups, 2 * n_accepted, dtype=np.intp)
        if self.first_round:  # every sweep starts at position 0: every move is ahead
            np.minimum.at(choice, a_column, key)
        else:
            key[position[accepted] < resume[a_column]] += n_accepted
            np.minimum.at(choice, a_column, key)
            # a move behind starts the next sweep: only if one remains (a group that does not
            # move leaves, so its sweep no longer matters)
            next_sweep = (choice >= n_accepted) & (choice < 2 * n_accepted) & (sweep < self.SWEEPS - 1)
            sweep += next_sweep
            choice[next_sweep] -= n_accepted
        moving = _indices(choice < n_accepted)
        chosen = accepted[choice[moving]]
        at = flat[chosen]
        new_level = level[chosen]
        level_bits.reshape(-1)[at] = new_bits[chosen]
        terms_lx.reshape(-1)[at] = term_lx[chosen]
        terms_l2.reshape(-1)[at] = term_l2[chosen]
        moving_movers = mover[moving]
        sum_lx[moving] = self.final_sums[0, moving_movers] = new_lx[chosen]
        sum_l2[moving] = self.final_sums[1, moving_movers] = new_l2[chosen]
        at_position = position[chosen]
        resume[moving] = at_position + 1
        self.final_levels.reshape(-1)[at_position * self.final_levels.shape[1] + moving_movers] = new_level
        return moving


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
    np.clip(values, -nmax, nmax - 1, out=values)
