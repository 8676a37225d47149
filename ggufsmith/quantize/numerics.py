"""Float32 building blocks for reproducing ggml-quants.c's arithmetic bit for bit in numpy.

Shared by every quantizer family. Groups (blocks, sub-blocks) are handled *position-major*:
`x[k]` is the k-th value of every group, a contiguous vector over all groups. A sum over a group
is then a reduction over axis 0, which numpy performs as an outer loop over positions with a
vector accumulator: ggml's sequential summation order (np.sum over the last axis would sum
pairwise and round differently).

ggml-quants.c is compiled into libggml-base for the baseline x86-64 target (no -march=native, no
FMA, no -ffast-math), so every `a*b + c` there rounds twice, as numpy does; nothing here emulates
a fused multiply-add. All arithmetic stays float32: Python floats become np.float32 before they
meet arrays, to avoid float64 promotion.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

F32 = np.float32
# ggml treats a group whose largest magnitude is below this as all zero.
GROUP_MAX_EPS = F32(1e-15)
# 1.5 * 2**23: adding it to a float32 leaves round-half-even(x) in the low mantissa bits.
ROUNDING_MAGIC = F32(12582912.0)
# nearest_int's trick is exact rounding for |v| <= 4194303; beyond it C wraps, which np.rint doesn't.
NEAREST_INT_EXACT = F32(4194303)
_ZERO = F32(0)
_TRANSPOSE_SLICE = 256


class NonFiniteInput(ValueError):
    """Raised by a quantizer that finds NaN or Inf in its input on its own way (QuantFormat's
    finds_non_finite), so that the registry need not scan every value first."""


def float_warnings_off(function):
    """Run `function` with numpy's float warnings off: for degenerate inputs (huge, subnormal, all
    zero) ggml's float32 math overflows to Inf and makes NaN on the way to a well-defined result,
    and we reproduce that rather than warn about it."""

    @functools.wraps(function)
    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"):
            return function(*args, **kwargs)

    return quiet


# ---------------------------------------------------------------- rounding


def nearest_int(values: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit, as int32: round half to even through the float32
    magic-number add. Equal to np.rint for |values| <= 2**22; beyond that (and for NaN/Inf) it
    wraps as the C code does."""
    bits = (np.asarray(values, dtype=F32) + ROUNDING_MAGIC).view(np.int32)
    bits &= 0x007FFFFF
    bits -= 0x00400000
    return bits


# np.clip's ufunc itself: np.clip is a Python wrapper that costs ~5 us a call on top of it, which
# the searches pay once per candidate scale (20 candidates a chunk, per type and search).
_CLIP = (np._core if hasattr(np, "_core") else np.core).umath.clip


def clamp(values: np.ndarray, low, high) -> np.ndarray:
    """values = MAX(low, MIN(high, values)) in place, as np.clip(values, low, high, out=values),
    with the bounds in the array's own type (no casting, no Python layer)."""
    kind = values.dtype.type
    return _CLIP(values, kind(low), kind(high), out=values)


def clamped_levels(
    iscale: np.ndarray, x: np.ndarray, nmax: int, finite: bool, out: np.ndarray | None = None, within: bool = False
) -> np.ndarray:
    """clamp(nearest_int(iscale * x), -nmax, nmax - 1) as float32 (exact small integers).

    For finite x, |iscale * x| <= nmax + 1 and np.rint is nearest_int. Group scales searched in
    turn (Q3_K) can be NaN or Inf after float32 overflow: then only the bit-level emulation is right.
    within: the caller knows |iscale * x| < nmax - 1/2 (finite x, iscale = c/max with |c| well
    below it): then the clamp changes nothing and is skipped.
    """
    if finite:
        out = np.multiply(x, iscale, out=out)
        np.rint(out, out=out)
        if within:
            return out
    else:
        rounded = nearest_int(x * iscale)
        if out is None:
            out = np.empty(rounded.shape, dtype=np.float32)
        out[...] = rounded
    clamp(out, -nmax, nmax - 1)
    return out


def round_clamped(values: np.ndarray, nmax: int) -> None:
    """values = clamp(nearest_int(values), -nmax, nmax - 1) in place, as float32. np.rint is
    nearest_int for every value within its exact range; the others (a search dividing by a sum
    near 0 gives huge values, NaN or Inf) are rare and get the bit-level emulation, which wraps
    as C does."""
    # the ufuncs' own reduce: np.max/np.min add ~1.5 us of Python each (NaN wins either way)
    top = np.maximum(np.maximum.reduce(values, axis=None), -np.minimum.reduce(values, axis=None)) if values.size else 0
    if top <= NEAREST_INT_EXACT:  # False for NaN
        np.rint(values, out=values)
    elif not values.flags.c_contiguous:
        values[...] = nearest_int(values)
    else:
        flat = values.reshape(-1)
        outside = np.flatnonzero(~(np.abs(flat) <= NEAREST_INT_EXACT))
        emulated = nearest_int(flat[outside]).astype(F32)
        np.rint(values, out=values)
        flat[outside] = emulated
    clamp(values, -nmax, nmax - 1)


def nearest_int_clipped(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """MAX(low, MIN(high, nearest_int(values))) as float32 (exact small integers)."""
    bits = (np.asarray(values, dtype=F32) + ROUNDING_MAGIC).view(np.int32)
    bits &= 0x007FFFFF
    clamp(bits, 0x00400000 + low, 0x00400000 + high)
    bits -= 0x00400000
    return bits.astype(F32)


def all_bits_where(mask: np.ndarray, out: np.ndarray) -> np.ndarray:
    """int32 `out` = all bits set where the bool `mask` is True, else 0: the `take` of select_bits."""
    return np.negative(mask.view(np.int8), out=out, casting="unsafe")


def select_bits(out: np.ndarray, candidate: np.ndarray, take: np.ndarray, flip: np.ndarray | None = None) -> None:
    """out = candidate where take (int32, all bits set) else out, float32 bit for bit (NaN too),
    in place and without branches: out ^= (out ^ candidate) & take. A masked store (np.putmask,
    np.copyto(where=), fancy indexing) branches on every element: 20-90 us on 16K values with
    random masks, against ~3 us for each of these three passes. `take` may broadcast (one flag
    per column of several rows); `flip`, an int32 buffer of out's shape, saves an allocation."""
    bits = out.view(np.int32)
    flip = np.bitwise_xor(bits, candidate.view(np.int32), out=flip)
    flip &= take
    bits ^= flip


def fp16_bits(values: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 as uint16 bits: round to nearest even, overflow to inf (as numpy does)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=F32).astype(np.float16).view(np.uint16)


def fp16_value(bits: np.ndarray) -> np.ndarray:
    """GGML_FP16_TO_FP32 of uint16 bits (exact)."""
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(F32)


def fp16_round_trip(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 bytes as uint8[..., 2], the float32 value they decode to)."""
    half = fp16_bits(values)
    return half.view(np.uint8).reshape(*half.shape, 2), half.view(np.float16).astype(F32)


# ---------------------------------------------------------------- sums in C order


def sum_from_zero(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in index order starting from +0.0, as a C loop `s = 0; s += t[i]`.

    For a C-contiguous [n, groups >= 2] array numpy's reduce adds whole rows in order. With one
    group the array is effectively 1-D and numpy sums it pairwise, which rounds differently: then
    (and for any other layout) add the rows one by one.
    """
    if terms.ndim == 2 and terms.shape[1] >= 2 and terms.flags.c_contiguous:
        return np.add.reduce(terms, axis=0, initial=_ZERO)
    total = np.zeros(terms.shape[1:], dtype=F32)
    for row in terms:
        total += row
    return total


def sum_of_squares_by_row(values: np.ndarray) -> np.ndarray:
    """C's `s = 0; for (j...) s += v[j]*v[j]` for each row of float32 [rows, n], in order: a
    reduce down the transposed squares (np.cumsum along the rows, the other in-order way, was 6x
    slower on a K-quant chunk); one row, which that reduce would add row by row, by np.cumsum."""
    if values.shape[0] < 2:
        return np.cumsum(values * values, axis=1, dtype=F32)[:, -1]
    squares = transposed(values)
    squares *= squares
    return sum_from_zero(squares)


def sum_from_first(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in C order starting from the first term: ((t0 + t1) + t2) + ..., as
    ggml's `s = t[0]; for (i = 1; ...) s += t[i]`. Differs from sum_from_zero only in the sign of
    a zero total (0 + -0 is +0)."""
    terms = np.ascontiguousarray(terms)
    if terms.ndim == 1 or terms.shape[1] < 8:
        total = terms[0].copy()
        for row in terms[1:]:
            total += row
        return total
    return np.add.reduce(terms, axis=0)


# ---------------------------------------------------------------- sums of products in C order
#
# The searches' hottest sums are sums of products, Σ a[i]*b[i] over a group. As a multiply and
# then a reduce they are two passes over the data; np.einsum("ij,ij->j") does both in one pass and
# adds the products row after row into the output, as C does. That depends on how numpy was built:
# its einsum kernels use numpy's SIMD multiply-add, which is a fused multiply-add (one rounding,
# not ggml's two) on ARM64 and on x86 builds whose baseline has FMA. So einsum is used only where a
# probe on this numpy finds it computes exactly the two-rounding sums in C's order; elsewhere the
# same sums take the multiply-and-reduce path.

_EINSUM_MIN_GROUPS = 8  # below this numpy may sum a narrow axis pairwise (see sum_from_first)


@functools.cache
def einsum_sums_are_exact() -> bool:
    """Whether np.einsum's "ij,ij->j" and "ij,ij,ij->j" equal C's `s = 0; s += a*b` and
    `s += (a*b)*c` loops bit for bit on this numpy, checked once per process on data where a fused
    multiply-add, another product order or another summation order would show: products of
    1 + 2**-12 with itself against -(1 + 2**-11) (which only a fused multiply-add leaves nonzero),
    and random values over twelve binary orders of magnitude, for the group counts the SIMD loops
    split into bodies and tails."""
    rng = np.random.default_rng(20261125)
    witness = F32(1 + 2.0**-12)
    for n in (16, 32):
        for groups in (8, 9, 15, 16, 17, 31, 33, 64, 67, 1031):
            a, b, c = (
                (rng.standard_normal((n, groups)) * np.exp2(rng.integers(-6, 6, (n, groups)))).astype(F32)
                for _ in range(3)
            )
            a[0], b[0], c[0] = -(1 + 2.0**-11), 1, 1
            a[1], b[1], c[1] = witness, witness, 1
            two = np.zeros(groups, dtype=F32)
            three = np.zeros(groups, dtype=F32)
            for i in range(n):
                two += a[i] * b[i]
                three += (a[i] * b[i]) * c[i]
            out = np.full(groups, np.nan, dtype=F32)  # einsum must overwrite, not add to, out
            if not np.array_equal(np.einsum("ij,ij->j", a, b, out=out).view(np.int32), two.view(np.int32)):
                return False
            out[...] = np.nan
            if not np.array_equal(np.einsum("ij,ij,ij->j", a, b, c, out=out).view(np.int32), three.view(np.int32)):
                return False
    return True


def _einsum_applies(*operands: np.ndarray) -> bool:
    """einsum for these operands: wide enough, laid out as the probe checked, and exact here."""
    return (
        operands[0].shape[1] >= _EINSUM_MIN_GROUPS
        and all(operand.flags.c_contiguous for operand in operands)
        and einsum_sums_are_exact()
    )


def sum_of_products(a: np.ndarray, b: np.ndarray, out: np.ndarray, scratch_terms: np.ndarray) -> np.ndarray:
    """out = Σ_i a[i]*b[i] over axis 0 from +0.0 in C order, for float32 [n, groups] arrays;
    `scratch_terms` (same shape) is used when einsum cannot be (einsum_sums_are_exact)."""
    if _einsum_applies(a, b):
        return np.einsum("ij,ij->j", a, b, out=out)
    out[...] = sum_from_zero(np.multiply(a, b, out=scratch_terms))
    return out


def sum_of_triple_products(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray, scratch_terms: np.ndarray
) -> np.ndarray:
    """out = Σ_i (a[i]*b[i])*c[i] over axis 0 from +0.0 in C order (see sum_of_products)."""
    if _einsum_applies(a, b, c):
        return np.einsum("ij,ij,ij->j", a, b, c, out=out)
    terms = np.multiply(a, b, out=scratch_terms)
    terms *= c
    out[...] = sum_from_zero(terms)
    return out


# ---------------------------------------------------------------- extremes with C's tie rules


def largest_magnitudes(top_signed: np.ndarray, top_unsigned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group, (largest |x| among its non-negative values, among its negative values) as int32
    float32 bit patterns, -1 where the group has no such value, from the group's maxima over the
    int32 view (`top_signed`) and over the uint32 view (`top_unsigned`) of finite float32 values.

    A float's bits order as its magnitude within each sign: as int32 the non-negative values are
    the non-negative ints, as uint32 the negative values are those >= 2**31. Two integer max
    reductions need no elementwise pass over the data and are several times faster than
    float ones. (NaN would win them: finite data only.)"""
    positive = np.maximum(top_signed, -1)
    # a group without negative values has its largest as uint32 below 2**31: non-negative as int32.
    # Branch-free (np.where on a random mask mispredicts, ~2 ns a value): the magnitude bits,
    # or'ed with all ones (-1) where the sign bit is clear
    negative = top_unsigned.view(np.int32)
    absent = np.right_shift(negative, 31)  # -1 where negative values occur, else 0
    np.invert(absent, out=absent)
    magnitude = negative & 0x7FFFFFFF
    magnitude |= absent
    return positive, magnitude


def signed_max_of_finite(positive: np.ndarray, negative: np.ndarray, lanes_of) -> np.ndarray:
    """The value of largest magnitude per group, from largest_magnitudes: the first one if +amax and
    -amax both occur, +0.0 for a group of zeros (ggml's `if (amax < fabsf(v)) {...}` from 0).
    `lanes_of(groups)` gives those groups' values as [position, group], to find which came first."""
    amax = np.maximum(positive, negative)
    # a group of zeros (any signs) gives +0.0: -0.0 never passes `amax < fabsf(v)`
    # the sign bit set where the negative side wins, without branches (see largest_magnitudes)
    negative_wins = (negative > np.maximum(positive, 0)).astype(np.uint32)
    negative_wins <<= np.uint32(31)
    signed = (amax.view(np.uint32) | negative_wins).view(F32)
    ties = np.flatnonzero((positive == negative) & (amax > 0))
    if ties.size:
        tied = lanes_of(ties)
        first = np.argmax(np.abs(tied) == amax[ties].view(F32), axis=0)
        signed[ties] = tied[first, np.arange(ties.size)]
    return signed


def signed_max_of_extremes(x: np.ndarray, high: np.ndarray, low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """signed_max_abs(x, finite=True) from each group's largest and least value (float
    reductions along axis 0 of finite x): the one of larger magnitude, the first of the two if
    they tie (found in x), +0.0 for a group of zeros. Fewer per-group operations than
    largest_magnitudes' integer way (which the legacy types' reduceat needs)."""
    low_magnitude = np.negative(low)
    amax = np.maximum(high, low_magnitude)
    np.abs(amax, out=amax)  # +0.0 for a group of zeros
    # the sign bit where the negative side is larger, without branches (np.where mispredicts)
    negative_wins = np.greater(low_magnitude, high).astype(np.uint32)
    negative_wins <<= np.uint32(31)
    signed = (amax.view(np.uint32) | negative_wins).view(F32)
    ties = np.flatnonzero(high == low_magnitude)
    ties = ties[amax[ties] > 0]
    if ties.size:
        tied = x[:, ties]
        first = np.argmax(np.abs(tied) == amax[ties], axis=0)
        signed[ties] = tied[first, np.arange(ties.size)]
    return amax, signed


def signed_max_abs(x: np.ndarray, finite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(largest |x|, the x that has it) per group along axis 0; the first of equal magnitudes wins,
    a group of zeros gives +0.0, and NaN never wins (a scale can be NaN after float32 overflow), as
    ggml's `if (ax > amax) { amax = ax; max = x; }` starting from 0. `finite=True` promises no
    NaN or Inf in x, which allows a faster way."""
    if finite:
        return signed_max_of_extremes(x, np.maximum.reduce(x, axis=0), np.minimum.reduce(x, axis=0))
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


def first_min(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Minimum along `axis` as C's `if (v < min) min = v` loop finds it: for a zero minimum the
    sign is that of the first zero, since -0.0 < 0.0 is false."""
    low = np.minimum.reduce(x, axis=axis)
    _first_zero_sign(x, low, axis)
    return low


def first_max(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Maximum along `axis` with `if (v > max) max = v`: a zero maximum keeps the first zero's sign."""
    high = np.maximum.reduce(x, axis=axis)
    _first_zero_sign(x, high, axis)
    return high


def _first_zero_sign(x: np.ndarray, extreme: np.ndarray, axis: int) -> None:
    zero = np.flatnonzero(extreme == 0)
    if zero.size:
        lanes = np.moveaxis(x, axis, 0)[:, zero]
        first = np.argmax(lanes == 0, axis=0)
        extreme[zero] = lanes[first, np.arange(zero.size)]


# ---------------------------------------------------------------- memory layout


def aligned_empty(shape: tuple[int, ...], dtype=F32) -> np.ndarray:
    """An uninitialized array starting on a 64-byte boundary. numpy only guarantees 16 bytes, and
    its AVX-512 loops run about twice as fast when their output is cache-line aligned."""
    dtype = np.dtype(dtype)
    n_bytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n_bytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + n_bytes].view(dtype).reshape(shape)


_scratch = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype=F32) -> np.ndarray:
    """An uninitialized, cache-line aligned array kept for this thread under `name` and handed out
    again (grown if needed) on the next call with that name.

    For the temporaries of a search that are rebuilt for every chunk: glibc returns freed blocks of
    a few hundred KiB to the kernel, so a fresh numpy array of that size costs a page fault per
    4 KiB on first touch (measured: ~1000 faults per 1M-value Q3_K chunk, which halved its speed). The caller must be done with the array
    before anything asks for the same name again; names are per call site. Kept flat and typed, so
    that a call costs a slice and a reshape (~1 us; Q3_K makes ~150 calls a chunk).
    """
    arrays = _scratch.__dict__
    size = math.prod(shape)
    kept = arrays.get(name)
    if kept is None or kept[1] < size or kept[2] is not dtype:
        kept = arrays[name] = (aligned_empty((size,), dtype), size, dtype)
    return kept[0][:size].reshape(shape)


def aligned_copy(a: np.ndarray, dtype=F32) -> np.ndarray:
    out = aligned_empty(a.shape, dtype)
    out[...] = a
    return out


def transposed(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, cache-line aligned copy of a 2-D array's transpose.

    numpy copies a transposed view element by element in source order, writing a whole cache
    line per element; going in slices of _TRANSPOSE_SLICE along the long axis keeps both sides in
    cache and is several times faster.
    """
    n_rows, n_cols = a.shape
    out = aligned_empty((n_cols, n_rows), a.dtype)
    if n_rows >= n_cols:
        for start in range(0, n_rows, _TRANSPOSE_SLICE):
            out[:, start : start + _TRANSPOSE_SLICE] = a[start : start + _TRANSPOSE_SLICE].T
    else:
        for start in range(0, n_cols, _TRANSPOSE_SLICE):
            out[start : start + _TRANSPOSE_SLICE] = a[:, start : start + _TRANSPOSE_SLICE].T
    return out


def position_major(rows: np.ndarray, group: int) -> np.ndarray:
    """float32[n_rows, row_length] -> [group, n_groups]: x[i, g] is element i of group g, groups
    numbered in memory order over all rows."""
    return transposed(rows.reshape(-1, group))


def importance_by_position(importance: np.ndarray, group: int, n_rows: int) -> np.ndarray:
    """The imatrix weight (one per column) of every value, laid out as position_major(rows, group)
    lays out the rows: group g of row r uses importance[(g % groups_per_row) * group + i]."""
    return np.tile(transposed(importance.reshape(-1, group)), (1, n_rows))
