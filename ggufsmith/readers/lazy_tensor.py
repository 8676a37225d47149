"""A tensor whose shape is known now and whose data is read only when asked for.

Checkpoint readers hand out LazyTensors backed by memory maps; plugins describe their layout
changes (rotary permutation, expert stacking, qkv regrouping) as operations on LazyTensors; the
pipeline plans the whole file from the shapes and loads one tensor at a time while writing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.errors import ConversionError


@dataclass(frozen=True)
class LazyTensor:
    shape: tuple[int, ...]
    dtype: str  # storage type in the checkpoint: "F32", "F16", "BF16", "F64", "I64", ...
    loader: Callable[[], np.ndarray]
    source: str = ""  # where it comes from, for error messages: "model.safetensors:lm_head.weight"

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def load(self) -> np.ndarray:
        """The data as a numpy array (float16 or float32 for floating types; bf16 arrives as float32)."""
        array = self.loader()
        if tuple(array.shape) != self.shape:
            raise ConversionError(f"{self.source}: expected shape {self.shape}, the data has {tuple(array.shape)}")
        return array

    def map(
        self, fn: Callable[[np.ndarray], np.ndarray], shape: Sequence[int] | None = None, dtype: str | None = None
    ) -> LazyTensor:
        """A LazyTensor of fn(data). Give `shape` when fn changes it."""
        return LazyTensor(
            tuple(self.shape if shape is None else shape),
            self.dtype if dtype is None else dtype,
            lambda: fn(self.load()),
            self.source,
        )

    def reshape(self, *shape: int) -> LazyTensor:
        target = tuple(int(s) for s in shape)
        if int(np.prod(target, dtype=np.int64)) != self.n_elements:
            raise ConversionError(f"{self.source}: cannot reshape {self.shape} to {target}")
        return self.map(lambda a: a.reshape(target), shape=target)

    @staticmethod
    def stack(tensors: Sequence[LazyTensor], source: str = "") -> LazyTensor:
        """Stack along a new first axis (e.g. the experts of a MoE layer)."""
        first = tensors[0]
        for t in tensors[1:]:
            if t.shape != first.shape:
                raise ConversionError(f"cannot stack {t.source} of shape {t.shape} with {first.source} of shape {first.shape}")
        dtype = first.dtype if all(t.dtype == first.dtype for t in tensors) else "F32"
        shape = (len(tensors), *first.shape)
        source = source or f"{first.source} (+{len(tensors) - 1} stacked)"
        load = lambda: np.stack([t.load() for t in tensors])  # noqa: E731
        if first.shape and all(isinstance(t, RowSlicedTensor) for t in tensors):
            # The stack's rows are the parts' rows one after the other: it can be sliced too.
            same_storage = all(t.dtype == first.dtype and t.stored_rows_loader for t in tensors)
            return RowSlicedTensor(
                shape, dtype, load, source,
                lambda start, stop: _rows_across(tensors, start, stop, stored=False),
                (lambda start, stop: _rows_across(tensors, start, stop, stored=True)) if same_storage else None,
            )
        return LazyTensor(shape, dtype, load, source)

    @staticmethod
    def concatenate(tensors: Sequence[LazyTensor], axis: int = 0, source: str = "") -> LazyTensor:
        """Join along an existing axis (e.g. separate q, k, v into one fused qkv)."""
        first = tensors[0]
        axis = axis % len(first.shape)
        shape = list(first.shape)
        shape[axis] = sum(t.shape[axis] for t in tensors)
        dtype = first.dtype if all(t.dtype == first.dtype for t in tensors) else "F32"
        return LazyTensor(
            tuple(shape),
            dtype,
            lambda: np.concatenate([t.load() for t in tensors], axis=axis),
            source or f"{first.source} (+{len(tensors) - 1} joined)",
        )

    def split(self, parts: int, axis: int = -2, *, interleaved: bool = False) -> list[LazyTensor]:
        """`parts` equal pieces along `axis` (e.g. a fused gate_up of stacked experts, (E, 2F, D),
        into gate (E, F, D) and up (E, F, D)): consecutive ranges, or with `interleaved` every
        parts-th index (gpt-oss alternates gate and up rows: piece i takes indices i, i + parts, ...).
        Along any axis but the last, a piece of a row-sliceable tensor is row-sliceable too, so a
        stack of several GB still streams, and a piece of an EncodedTensor keeps its stored bytes."""
        axis = axis % len(self.shape)
        if self.shape[axis] % parts:
            raise ConversionError(f"{self.source}: {self.shape[axis]} along axis {axis} do not split into {parts} equal parts")
        width = self.shape[axis] // parts
        shape = (*self.shape[:axis], width, *self.shape[axis + 1:])
        pieces = []
        for index in range(parts):
            first, step = (index, parts) if interleaved else (index * width, 1)
            cut = (slice(None),) * axis + (slice(first, first + step * width, step),)
            load = lambda cut=cut: np.ascontiguousarray(self.load()[cut])  # noqa: E731
            source = f"{self.source} (part {index + 1} of {parts})"
            if isinstance(self, RowSlicedTensor) and axis < len(self.shape) - 1:
                rows = _RowBlocks(self, axis, first, width, step)
                stored = rows.load_stored if self.stored_rows_loader else None
                if isinstance(self, EncodedTensor):
                    pieces.append(EncodedTensor(shape, self.dtype, load, source, rows.load, stored,
                                                stored_type=self.stored_type, raw_loader=rows.load_raw))
                else:
                    pieces.append(RowSlicedTensor(shape, self.dtype, load, source, rows.load, stored))
            else:
                pieces.append(LazyTensor(shape, self.dtype, load, source))
        return pieces

    def swap_last_axes(self) -> LazyTensor:
        """The matrices of a stack transposed: (..., m, n) -> (..., n, m), e.g. expert stacks saved
        for x @ W (Llama 4's (E, D, F)) into the (E, F, D) rows llama.cpp multiplies by. A
        row-sliceable stack stays row-sliceable: a slice of rows reads the whole matrices it
        touches (one expert's at a time), never the stack."""
        *outer, m, n = self.shape
        shape = (*outer, n, m)
        source = f"{self.source} (transposed)"
        load = lambda: np.ascontiguousarray(np.swapaxes(self.load(), -1, -2))  # noqa: E731
        if not isinstance(self, RowSlicedTensor) or not outer:
            return LazyTensor(shape, self.dtype, load, source)
        matrices = _TransposedMatrices(self, m, n)
        return RowSlicedTensor(shape, self.dtype, load, source, matrices.load,
                               matrices.load_stored if self.stored_rows_loader else None)

    @staticmethod
    def from_array(array: np.ndarray, dtype: str = "F32", source: str = "") -> LazyTensor:
        """Wrap data that is already in memory (made by a plugin, e.g. whisper's mel filters)."""
        return LazyTensor(tuple(array.shape), dtype, lambda: array, source)


@dataclass(frozen=True)
class RowSlicedTensor(LazyTensor):
    """A LazyTensor that can also load a range of its rows (rows along the last axis, as ggml).

    The pipeline streams large tensors through the quantizer in slices of rows so that no more
    than a slice is ever in memory. Any transform (`map`, `reshape`...) gives a plain LazyTensor,
    which is loaded whole.
    """

    rows_loader: object = None  # Callable[[int, int], np.ndarray] returning rows [start, stop)
    # The same rows as stored, without widening: bf16 as uint16 bit patterns. Lets the pipeline
    # turn bf16 into f16 with integer operations instead of a float32 detour.
    stored_rows_loader: object = None
    # Where rows [start, stop) lie in their file (Callable[[int, int], file_rows.FileRows]), when
    # they lie there contiguously in a type another process can widen itself: a quantizer process
    # then reads them instead of receiving them through a pipe (converters/processes.py).
    file_rows: object = None

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[-1] if self.shape and self.shape[-1] else 0

    def load_rows(self, start: int, stop: int) -> np.ndarray:
        return self.rows_loader(start, stop)

    def load_stored_rows(self, start: int, stop: int) -> np.ndarray:
        return self.stored_rows_loader(start, stop)


@dataclass(frozen=True)
class EncodedTensor(RowSlicedTensor):
    """A tensor whose data is stored already in a GGML type (a GGUF file's tensors, a checkpoint's
    MXFP4 experts): `raw_rows` gives the GGUF bytes of a range of rows as they are, so that a tensor
    written in the type it is stored in is copied, not decoded and encoded again. load() and
    load_rows() give the values, decoded (for a tensor whose type changes)."""

    stored_type: GGMLType = GGMLType.F32
    raw_loader: object = None  # Callable[[int, int], np.ndarray]: the stored bytes of rows [start, stop)

    def raw_rows(self, start: int, stop: int) -> np.ndarray:
        return self.raw_loader(start, stop)


def _rows_across(parts: Sequence[RowSlicedTensor], start: int, stop: int, stored: bool) -> np.ndarray:
    """Rows [start, stop) of the parts stacked (each part has the same number of rows)."""
    per_part = parts[0].n_rows
    pieces = []
    for index in range(start // per_part, (stop - 1) // per_part + 1) if stop > start else ():
        first, last = max(start, index * per_part) - index * per_part, min(stop, (index + 1) * per_part) - index * per_part
        part = parts[index]
        pieces.append(part.load_stored_rows(first, last) if stored else part.load_rows(first, last))
    if not pieces:
        return (parts[0].load_stored_rows(0, 0) if stored else parts[0].load_rows(0, 0))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


@dataclass(frozen=True)
class _RowBlocks:
    """The rows of a piece of a row-sliceable tensor along `axis`: indices first, first + step, ...
    (`count` of them) of that axis, in the source's rows.

    With outer = the product of the axes before `axis` and inner = of those between it and the
    last, index i of the piece for outer index o is the block of `inner` source rows starting at
    (o * size + first + i * step) * inner; consecutive indices are contiguous when step is 1."""

    source: RowSlicedTensor
    axis: int
    first: int
    count: int
    step: int = 1

    def load(self, start: int, stop: int) -> np.ndarray:
        return self._gather(start, stop, self.source.load_rows)

    def load_stored(self, start: int, stop: int) -> np.ndarray:
        return self._gather(start, stop, self.source.load_stored_rows)

    def load_raw(self, start: int, stop: int) -> np.ndarray:
        return self._gather(start, stop, self.source.raw_rows)

    def _gather(self, start: int, stop: int, rows: Callable[[int, int], np.ndarray]) -> np.ndarray:
        shape = self.source.shape
        inner = int(np.prod(shape[self.axis + 1:-1], dtype=np.int64))
        block = self.count * inner  # piece rows per outer index
        pieces = []
        position = start
        while position < stop:
            outer, offset = divmod(position, block)
            take = min(stop - position, block - offset)
            base = (outer * shape[self.axis] + self.first) * inner
            if self.step == 1:
                pieces.append(rows(base + offset, base + offset + take))
            else:
                # one read of the source rows spanning the indices wanted, every step-th index kept
                # (one call, not one per index: a transposed source reads a whole matrix per call)
                first, last = offset // inner, (offset + take - 1) // inner
                n_read = (last - first) * self.step + 1  # indices read
                span = rows(base + first * self.step * inner, base + (first * self.step + n_read) * inner)
                span = span.reshape(n_read * inner, -1)  # a row per line (raw bytes come flat)
                kept = span.reshape(n_read, inner, -1)[::self.step].reshape(-1, span.shape[1])
                skip = offset - first * inner
                pieces.append(kept[skip:skip + take])
            position += take
        if not pieces:
            return rows(0, 0)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


@dataclass(frozen=True)
class _TransposedMatrices:
    """Rows of a stack of (m, n) matrices transposed: output rows [start, stop) of one matrix are
    columns of its m source rows, read in blocks of about _BLOCK_ELEMENTS so that memory holds a
    block and the band of columns asked for, never the matrix."""

    source: RowSlicedTensor
    m: int
    n: int

    def load(self, start: int, stop: int) -> np.ndarray:
        return self._gather(start, stop, self.source.load_rows)

    def load_stored(self, start: int, stop: int) -> np.ndarray:
        return self._gather(start, stop, self.source.load_stored_rows)

    def _gather(self, start: int, stop: int, rows: Callable[[int, int], np.ndarray]) -> np.ndarray:
        step = max(1, _BLOCK_ELEMENTS // max(1, self.n))
        pieces = []
        position = start
        while position < stop:
            matrix, offset = divmod(position, self.n)
            take = min(stop - position, self.n - offset)
            first, end = matrix * self.m, (matrix + 1) * self.m
            band = [rows(r, min(r + step, end))[:, offset:offset + take] for r in range(first, end, step)]
            pieces.append(np.ascontiguousarray(np.concatenate(band).T))
            position += take
        if not pieces:
            return rows(0, 0).reshape(0, self.m)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


_BLOCK_ELEMENTS = 1 << 22  # source elements read at once by _TransposedMatrices (16 MiB as float32)
