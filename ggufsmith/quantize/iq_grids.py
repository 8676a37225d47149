"""The lattice grids of ggml's IQ2/IQ3/IQ1 types, and the look-up tables ggml builds from them at
init (iq3xs_init_impl and friends), built here the same way, once, on first use.

A grid is a set of points with small non-negative integer coordinates (levels) that a group of
values may take, the point's index being what a block stores. ggml publishes each grid as its
points' packed coordinates in increasing order; since a point with 4 coordinates of 3 bits is a
12-bit number, the 256 and 512 points of the IQ3 grids are kept here as bitmaps of 4096 bits
(bit u set: the point with packed coordinates u is on the grid; its index is its rank).

For a point u off the grid, the quantizers need the grid points nearest to it: ggml keeps those at
the `nwant` smallest distinct squared distances, ordered by (distance, index).
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numpy as np

# IQ3_XXS: 256 points with 4 coordinates of 3 bits (ggml's kgrid_256 of iq3xs_init_impl).
_IQ3_GRID_256 = (
    "158a0502040000280a052205021000011502058a00820020820520000000000100080080108000288200000400040000"
    "000000200000100000510000080002000a050a158001000005020500000000000a050201000000040500010240004000"
    "2200000000010000000011004000000220000000000000000000040001000000050a4502040000002a05020100008801"
    "058205800120000002110000000000110000002000080000080080000200001000000000000000000a40000020000000"
    "02050a000001200405000102500000000a01200000040004000200080000000000000001800000044100040000200000"
    "00100040000008000000000800000100108000a000880000000000000000001000000180010041008000000020000000"
    "100000000002100000002000080000010000000000000000200500010000000000040000020000014100400000200000"
    "001000040000000404000000000800000001880000000004040000020000000000000000000100000000100004000000"
    "000010005000100000000200000002000080000000001000000000410000000000000000100000002000000000040000"
    "00000008000000000800020000000000a801000400040000000040000100000000040000200400000120000800000100"
    "0000020002000000050010000000000000000001000000000000000000000000"
)
# IQ3_S: 512 points (kgrid_512).
_IQ3_GRID_512 = (
    "a7572308a50a05921723892210002204a3492211a40a00090822054a10058022018812040902000114004508a2004008"
    "400a000200040002150045080011000017ab0552005002044b1102090205004101a41104092001049209821102000401"
    "2814000a44110000020902050002000000009100500000000a05022002000401ab558a052a0580290589241204020000"
    "92000a81028800122502140a040140008200092402000024100204800108000185000200002002002002400108010000"
    "04aa042a940208022a100a0001000144010401140001000002118a018a20000808420402000411000205200410400008"
    "00400000020000000a000520000000001104910402010001840a0421082200000a21020801800401100a052200000000"
    "0500108001000002a0000200000004000008001000000100002100010802000004110400910440102a04020400000004"
    "01020841000800008401800010022008120001044000000000044000000a000000000000040000001400040000000000"
    "002a000a0000010001008100000010000004001004200401011002000100000000002000080004000900001000000100"
    "2000000001000000000a0000000000009100054001100400040210002800000012410201000200000400002400080000"
    "2208010000010000000004000400000004000002000000000100000000000000"
)


class GridTables(NamedTuple):
    levels: np.ndarray  # uint8[points, dims]: each point's coordinates
    values_by_coordinate: np.ndarray  # float32[dims, points]: 2 * level + 1, what the quantizers fit
    index_of: np.ndarray  # int32[2**(bits*dims)]: the point's index, or -1 off the grid
    # The nearest points of an off-grid u, in ggml's order, are
    # neighbours[neighbour_starts[u] : neighbour_starts[u] + neighbour_counts[u]].
    neighbours: np.ndarray  # int32[total]
    neighbour_starts: np.ndarray  # int32[2**(bits*dims)]
    neighbour_counts: np.ndarray  # int32[2**(bits*dims)], 0 on the grid


def _bitmap_points(hex_bitmap: str) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(hex_bitmap), dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits)


def _coordinates(packed: np.ndarray, bits: int, dims: int) -> np.ndarray:
    shifts = np.arange(dims) * bits
    return ((packed[:, None] >> shifts) & ((1 << bits) - 1)).astype(np.uint8)


def _build(points: np.ndarray, bits: int, dims: int, nwant: int) -> GridTables:
    size = 1 << (bits * dims)
    levels = _coordinates(points, bits, dims)
    index_of = np.full(size, -1, dtype=np.int32)
    index_of[points] = np.arange(points.size, dtype=np.int32)
    off_grid = np.flatnonzero(index_of < 0)
    # ggml measures distances between 2*level + 1 values: 4 times the distance between levels,
    # which orders the same way.
    diff = _coordinates(off_grid, bits, dims).astype(np.int32)[:, None, :] - levels.astype(np.int32)[None, :, :]
    dist2 = (diff * diff).sum(axis=2)  # [off-grid points, grid points]
    order = np.argsort(dist2, axis=1, kind="stable")  # ties: lower index first, as ggml's compare
    sorted_d2 = np.take_along_axis(dist2, order, axis=1)
    # rank of each distance among the distinct distances of its row: keep ranks < nwant
    new_distance = np.ones(sorted_d2.shape, dtype=bool)
    new_distance[:, 1:] = sorted_d2[:, 1:] != sorted_d2[:, :-1]
    keep = np.cumsum(new_distance, axis=1) <= nwant
    counts = keep.sum(axis=1).astype(np.int32)
    neighbour_counts = np.zeros(size, dtype=np.int32)
    neighbour_counts[off_grid] = counts
    neighbour_starts = (np.cumsum(neighbour_counts) - neighbour_counts).astype(np.int32)
    neighbours = order[keep].astype(np.int32)  # row by row: u ascending, each in (distance, index) order
    return GridTables(levels, np.ascontiguousarray((2 * levels.T + 1).astype(np.float32)), index_of, neighbours, neighbour_starts, neighbour_counts)


@cache
def iq3_grid(grid_size: int) -> GridTables:
    """ggml's iq3xs_init_impl tables for the IQ3_XXS (256) or IQ3_S (512) grid: 4 levels of 3 bits
    (values 2*level + 1), the 2 (256) or 3 (512) nearest distances as neighbours."""
    hex_bitmap = {256: _IQ3_GRID_256, 512: _IQ3_GRID_512}[grid_size]
    return _build(_bitmap_points("".join(hex_bitmap)), bits=3, dims=4, nwant=2 if grid_size == 256 else 3)
