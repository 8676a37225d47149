"""Metadata values of a memory-mapped GGUF file, checked once and decoded only when asked for.

A hostile file can spend every byte on structure that costs a reader far more memory than it takes
on disk: a two-byte string is 10 bytes in the file and ~60 as a Python str in a tuple, an empty
nested array 12 bytes and ~300 as objects. So the reader keeps positions instead of objects:

- `skip_value` checks a value (types, counts and lengths against the bytes left, bools, nesting
  depth) and steps over it, building nothing;
- `value_at` decodes the value at a position when someone asks for it: scalars and strings as they
  are, numeric arrays as zero-copy numpy views, arrays of strings or of arrays as a `LazyArray`,
  a read-only sequence that decodes its elements one at a time;
- `FileMetadata` is the reader's `Metadata`: the position of each key-value pair and a hash index
  of the keys. It decodes a value per lookup and holds nothing else per key.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ggufsmith.constants import GGUF_MAX_ARRAY_DEPTH, GGUF_VALUE_STRUCT, GGUFValueType
from ggufsmith.gguf_writer.cursor import ByteCursor
from ggufsmith.gguf_writer.encoding import NUMPY_DTYPE_OF_VALUE
from ggufsmith.gguf_writer.file_index import NameIndex
from ggufsmith.gguf_writer.metadata import Metadata, MetadataValue

_SEQUENCE_ELEMENTS = (GGUFValueType.STRING, GGUFValueType.ARRAY)


def value_type(cur: ByteCursor, what: str) -> GGUFValueType:
    at = cur.pos
    raw = cur.u32(what)
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what} is {raw}, not a known GGUF value type", at) from None


# -- checking ---------------------------------------------------------------------------------------
def skip_value(cur: ByteCursor, key: str, vtype: GGUFValueType) -> None:
    """Check the value of `key` at the cursor and step over it."""
    if vtype == GGUFValueType.ARRAY:
        _skip_array(cur, key, depth=1)
    elif vtype == GGUFValueType.STRING:
        at = cur.pos
        length = cur.size(f"the length of the value of {key}")
        if length > cur.remaining:
            raise cur.fail(f"the value of {key} is {length} bytes long but only {cur.remaining} are left", at)
        cur.pos += length
    else:
        _read_scalar(cur, key, vtype)


def _skip_array(cur: ByteCursor, key: str, depth: int) -> None:
    if depth > GGUF_MAX_ARRAY_DEPTH:
        raise cur.fail(f"{key}: arrays nested deeper than {GGUF_MAX_ARRAY_DEPTH} levels")
    etype = value_type(cur, f"the element type of array {key}")
    if etype == GGUFValueType.STRING:
        n = cur.count(f"strings in {key}", cur.size_width)
        cur.skip_strings(n, key)
    elif etype == GGUFValueType.ARRAY:
        n = cur.count(f"arrays in {key}", 4 + cur.size_width)
        for _ in range(n):
            _skip_array(cur, key, depth + 1)
    else:
        at = cur.pos
        dtype = NUMPY_DTYPE_OF_VALUE[etype]
        n = cur.count(f"elements in {key}", np.dtype(dtype).itemsize)
        values = cur.array(dtype, n, f"the elements of {key}")  # a view: nothing is copied
        if etype == GGUFValueType.BOOL and n and int(values.max()) > 1:
            raise cur.fail(f"array {key} holds a bool that is neither 0 nor 1", at)


def _read_scalar(cur: ByteCursor, key: str, vtype: GGUFValueType):
    at = cur.pos
    if vtype == GGUFValueType.BOOL:
        raw = cur.scalar("B", 1, f"the value of {key}")
        if raw > 1:
            raise cur.fail(f"the bool value of {key} is {raw}; GGUF allows only 0 and 1", at)
        return bool(raw)
    fmt = GGUF_VALUE_STRUCT[vtype]
    return cur.scalar(fmt, struct.calcsize(fmt), f"the value of {key}")


# -- decoding (of values already checked) -----------------------------------------------------------
def value_at(cur: ByteCursor, key: str, vtype: GGUFValueType) -> MetadataValue:
    """The value of `key` at the cursor, which `skip_value` has checked."""
    if vtype == GGUFValueType.ARRAY:
        return _array_at(cur, key, depth=1)
    if vtype == GGUFValueType.STRING:
        return MetadataValue(cur.string(f"the value of {key}"), vtype)
    return MetadataValue(_read_scalar(cur, key, vtype), vtype)


def _array_at(cur: ByteCursor, key: str, depth: int) -> MetadataValue:
    etype = value_type(cur, f"the element type of array {key}")
    n = cur.size(f"the length of array {key}")
    if etype in _SEQUENCE_ELEMENTS:
        return MetadataValue(LazyArray(cur.at(cur.pos), n, etype, key, depth), GGUFValueType.ARRAY, etype)
    values = cur.array(NUMPY_DTYPE_OF_VALUE[etype], n, f"the elements of {key}")
    if etype == GGUFValueType.BOOL:
        values = values.view(np.bool_)
    elif cur.order == ">" and values.dtype.itemsize > 1:
        values = values.astype(values.dtype.newbyteorder("="))  # numbers in native order
    return MetadataValue(values, GGUFValueType.ARRAY, etype)


class LazyArray(Sequence):
    """The elements of a GGUF array of strings or of arrays, decoded from the file one at a time.

    Reads like the tuple it replaces (len, iteration, indexing, slices as tuples, == with tuples and
    lists); it holds a position, and after the first random access an index of element positions
    (8 bytes per element, never more than the elements take in the file)."""

    __slots__ = ("_cursor", "_n", "element_type", "_key", "_depth", "_positions")

    def __init__(self, cursor: ByteCursor, n: int, element_type: GGUFValueType, key: str, depth: int) -> None:
        self._cursor = cursor  # at the first element
        self._n = n
        self.element_type = element_type
        self._key = key
        self._depth = depth
        self._positions: np.ndarray | None = None

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Any]:
        return self._decode(self._cursor.pos, self._n)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step != 1:
                return tuple(self[i] for i in range(start, stop, step))
            return tuple(self._decode(self._position(start), stop - start)) if stop > start else ()
        i = index.__index__()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"{self._key}: index {index} out of range for {self._n} elements")
        return next(self._decode(self._position(i), 1))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (LazyArray, tuple, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by content, like a list

    def __repr__(self) -> str:
        return f"LazyArray({self._n} {self.element_type.name} elements of {self._key})"

    def _decode(self, pos: int, count: int) -> Iterator[Any]:
        cur = self._cursor.at(pos)
        for _ in range(count):
            if self.element_type == GGUFValueType.STRING:
                yield cur.string(self._key)
            else:
                start = cur.pos
                _skip_array(cur, self._key, self._depth + 1)
                yield _array_at(cur.at(start), self._key, self._depth + 1)

    def _position(self, i: int) -> int:
        """Where element `i` starts."""
        if i == 0:
            return self._cursor.pos
        if self._positions is None:
            positions = np.empty(self._n, dtype=np.int64)
            cur = self._cursor.at(self._cursor.pos)
            for j in range(self._n):
                positions[j] = cur.pos
                if self.element_type == GGUFValueType.STRING:
                    cur.skip_strings(1, self._key)
                else:
                    _skip_array(cur, self._key, self._depth + 1)
            self._positions = positions
        return int(self._positions[i])


# -- the metadata of a file -------------------------------------------------------------------------
class FileMetadata(Metadata):
    """Metadata read from a mapped file: reads decode from the file; the first change (add, replace,
    remove) decodes every pair into an ordinary in-memory Metadata."""

    def __init__(self, cursor: ByteCursor, positions: np.ndarray, key_hashes: np.ndarray) -> None:
        super().__init__()
        self._cursor = cursor
        self._positions = positions  # of each key-value pair, in file order
        self._index: NameIndex | None = NameIndex(key_hashes, self._key_of)

    def first_duplicate(self) -> int | None:
        """The position of the first key-value pair whose key an earlier pair has, if any."""
        i = self._index.first_duplicate()
        return None if i is None else int(self._positions[i])

    def _key_of(self, i: int) -> str:
        return self._cursor.at(int(self._positions[i])).string("a metadata key")

    def _pair_at(self, i: int) -> tuple[str, MetadataValue]:
        cur = self._cursor.at(int(self._positions[i]))
        key = cur.string("a metadata key")
        return key, value_at(cur, key, value_type(cur, f"the type of {key}"))

    def _find(self, key: object) -> int | None:
        return self._index.find(key) if isinstance(key, str) else None

    def _materialise(self) -> None:
        if self._index is not None:
            self._items = dict(self.items())
            self._index = None

    # reading
    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) if self._index is None else self._find(key) is not None

    def __getitem__(self, key: str) -> MetadataValue:
        if self._index is None:
            return super().__getitem__(key)
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        return self._pair_at(i)[1]

    def get(self, key: str, default: Any = None) -> Any:
        if self._index is None:
            return super().get(key, default)
        i = self._find(key)
        return default if i is None else self._pair_at(i)[1].plain()

    def __len__(self) -> int:
        return super().__len__() if self._index is None else len(self._positions)

    def __iter__(self) -> Iterator[str]:
        if self._index is None:
            return super().__iter__()
        return (self._key_of(i) for i in range(len(self._positions)))

    def items(self) -> Iterator[tuple[str, MetadataValue]]:
        if self._index is None:
            return super().items()
        return (self._pair_at(i) for i in range(len(self._positions)))

    # changing
    def add(self, key, value, vtype, element_type=None) -> None:
        self._materialise()
        super().add(key, value, vtype, element_type)

    def replace(self, key, value, vtype, element_type=None) -> None:
        self._materialise()
        super().replace(key, value, vtype, element_type)

    def add_read_value(self, key: str, value: MetadataValue) -> None:
        self._materialise()
        super().add_read_value(key, value)

    def remove(self, key: str) -> None:
        self._materialise()
        super().remove(key)

