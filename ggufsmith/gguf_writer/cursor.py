"""A bounds-checked cursor over the bytes of a GGUF file (the reader's half of the encoding).

Every read checks the bytes left before touching them, and every count is checked against the
bytes left (times the smallest size one element can have) before anything is allocated for it.
So a hostile count or length fails at once with the byte offset, instead of allocating or looping.
"""

from __future__ import annotations

import mmap
import struct

import numpy as np

from ggufsmith.errors import GGUFError


class ByteCursor:
    """Reads little- or big-endian values from `buffer` (a uint8 numpy array, e.g. a memory map).

    `size_width` is 8 for GGUF v2/v3 and 4 for v1, whose counts and lengths were uint32.
    """

    __slots__ = ("buffer", "view", "source", "order", "size_width", "pos", "end")

    def __init__(self, buffer: np.ndarray, source: str, byteorder: str = "<", size_width: int = 8) -> None:
        self.buffer = buffer
        # Slicing the underlying object (an mmap or bytes) yields bytes directly: the fast path for
        # the hundreds of thousands of strings of a vocabulary.
        self.view = buffer.base if isinstance(buffer.base, (bytes, mmap.mmap)) else memoryview(buffer)
        self.source = source
        self.order = byteorder
        self.size_width = size_width
        self.pos = 0
        self.end = len(buffer)

    def at(self, pos: int) -> ByteCursor:
        """A cursor over the same bytes, in the same byte order, at `pos`."""
        other = ByteCursor.__new__(ByteCursor)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.pos = pos
        return other

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        """The error to raise for a problem at byte `at` (default: the current position)."""
        return GGUFError(f"{self.source}: at byte {self.pos if at is None else at}: {what}")

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.remaining:
            raise self.fail(f"{what} needs {nbytes} bytes but the file has only {self.remaining} left (truncated?)")

    def _unpack(self, fmt: str, nbytes: int, what: str):
        self.need(nbytes, what)
        (value,) = struct.unpack_from(self.order + fmt, self.view, self.pos)
        self.pos += nbytes
        return value

    def u32(self, what: str) -> int:
        return self._unpack("I", 4, what)

    def i32(self, what: str) -> int:
        return self._unpack("i", 4, what)

    def u64(self, what: str) -> int:
        return self._unpack("Q", 8, what)

    def size(self, what: str) -> int:
        """A count or length: uint64 in GGUF v2/v3, uint32 in v1."""
        return self._unpack("Q" if self.size_width == 8 else "I", self.size_width, what)

    def scalar(self, fmt: str, nbytes: int, what: str):
        return self._unpack(fmt, nbytes, what)

    def count(self, what: str, min_element_bytes: int) -> int:
        """Read a count of items that each take at least `min_element_bytes`, and check it fits."""
        at = self.pos
        n = self.size(f"the count of {what}")
        if n * min_element_bytes > self.remaining:
            raise self.fail(
                f"{n} {what} need at least {n * min_element_bytes} bytes but only {self.remaining} are left", at
            )
        return n

    def raw(self, nbytes: int, what: str) -> memoryview:
        self.need(nbytes, what)
        out = self.view[self.pos : self.pos + nbytes]
        self.pos += nbytes
        return out

    def string(self, what: str) -> str | bytes:
        """A GGUF string: UTF-8 when it decodes, otherwise the raw bytes (llama.cpp stores bytes)."""
        at = self.pos
        length = self.size(f"the length of {what}")
        if length > self.remaining:
            raise self.fail(f"{what} is {length} bytes long but only {self.remaining} are left", at)
        raw = bytes(self.view[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw

    def skip_strings(self, n: int, what: str) -> None:
        """Check that `n` GGUF strings follow, and step over them without decoding any (the caller
        has checked `n` against the bytes left). Decoding is left to whoever asks for a string."""
        view, pos, end, width = self.view, self.pos, self.end, self.size_width
        unpack = struct.Struct(self.order + ("Q" if width == 8 else "I")).unpack_from
        for j in range(n):
            if pos + width > end:
                self.pos = pos
                self.need(width, f"the length of string {j} of {what}")
            (length,) = unpack(view, pos)
            pos += width
            if length > end - pos:
                raise self.fail(f"string {j} of {what} is {length} bytes long but only {end - pos} are left", pos - width)
            pos += length
        self.pos = pos

    def array(self, dtype: str, n: int, what: str) -> np.ndarray:
        """`n` fixed-size values as a read-only numpy view in the file's byte order (zero copy)."""
        dt = np.dtype(self.order + dtype)
        self.need(n * dt.itemsize, what)
        out = self.buffer[self.pos : self.pos + n * dt.itemsize].view(dt)
        self.pos += n * dt.itemsize
        return out
