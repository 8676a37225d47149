"""Rows of a tensor as they lie in a file, for a quantizer process to read itself.

A K-quant piece is quantized in a worker process (converters/processes.py). Shipping it there as
float32 through a pipe costs the caller a widening pass and a copy into the pipe, and the worker a
copy out of it into freshly allocated (page-faulting) memory: about 10 ms of CPU per 4M-element
piece, some 4-5% of the conversion's CPU. When the rows lie contiguously in a file in a type that
widens exactly to float32 (a safetensors tensor's rows), the caller sends their place instead and
the worker reads them with one pread into buffers it keeps from piece to piece.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ggufsmith.errors import ConversionError

# Stored types a worker widens itself: numpy dtype of the stored bytes. All widen exactly to float32.
READABLE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


@dataclass(frozen=True)
class FileRows:
    """n_rows rows of row_length values of `dtype` (a READABLE_DTYPES name), one after the other
    from byte `offset` of the file at `path`. Sliced like an array's rows: rows[a:b]."""

    path: str
    offset: int
    dtype: str
    n_rows: int
    row_length: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_rows, self.row_length

    @property
    def size(self) -> int:
        return self.n_rows * self.row_length

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, rows: slice) -> FileRows:
        start, stop, step = rows.indices(self.n_rows)
        if step != 1:
            raise ValueError("FileRows are sliced in consecutive rows")
        stop = max(start, stop)
        row_bytes = self.row_length * READABLE_DTYPES[self.dtype].itemsize
        return FileRows(self.path, self.offset + start * row_bytes, self.dtype, stop - start, self.row_length)

    def load(self) -> np.ndarray:
        """The rows as float32 (in a new array)."""
        reader = RowReader()
        try:
            return reader.read(self, reuse=False)
        finally:
            reader.close()


class RowReader:
    """Reads FileRows as float32, keeping a few files open and, with `reuse`, the same buffers."""

    MAX_OPEN_FILES = 4

    def __init__(self) -> None:
        self._files: OrderedDict[str, int] = OrderedDict()
        self._stored = np.empty(0, np.uint8)
        self._widened = np.empty(0, np.float32)

    def read(self, rows: FileRows, reuse: bool = True) -> np.ndarray:
        """The rows as float32[n_rows, row_length]: with `reuse`, a view of this reader's buffer,
        valid until the next read."""
        storage = READABLE_DTYPES[rows.dtype]
        nbytes = rows.size * storage.itemsize
        out = self._buffer("_widened", rows.size * 4, reuse).view(np.float32)
        # float32 rows are read straight into the output; the others next to it, then widened
        stored = out.view(np.uint8) if rows.dtype == "F32" else self._buffer("_stored", nbytes, reuse)
        self._pread(rows, memoryview(stored).cast("B")[:nbytes])
        if rows.dtype == "BF16":  # bfloat16 is the upper half of a float32
            np.left_shift(stored[:nbytes].view(storage), 16, out=out.view(np.uint32), dtype=np.uint32)
        elif rows.dtype == "F16":
            np.copyto(out, stored[:nbytes].view(storage))
        return out.reshape(rows.shape)

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _buffer(self, name: str, nbytes: int, reuse: bool) -> np.ndarray:
        if not reuse:
            return np.empty(nbytes, np.uint8)
        buffer = getattr(self, name)
        if buffer.nbytes < nbytes:
            buffer = np.empty(nbytes, np.uint8)
            setattr(self, name, buffer)
        return buffer.view(np.uint8)[:nbytes]

    def _pread(self, rows: FileRows, into: memoryview) -> None:
        fd = self._open(rows.path)
        done = 0
        try:
            while done < into.nbytes:
                n = os.preadv(fd, [into[done:]], rows.offset + done)
                if n == 0:
                    raise ConversionError(f"{rows.path} ended {into.nbytes - done} bytes early (truncated since it was "
                                          "opened?); check the file and convert again")
                done += n
        except OSError as e:
            raise ConversionError(f"{rows.path}: {e.strerror or e}") from None

    def _open(self, path: str) -> int:
        fd = self._files.pop(path, None)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ConversionError(f"{path}: {e.strerror or e}") from None
            if len(self._files) >= self.MAX_OPEN_FILES:
                os.close(self._files.popitem(last=False)[1])
        self._files[path] = fd  # most recently used last
        return fd
