"""Typed GGUF metadata: an ordered mapping of key to (value, value type).

Types are explicit because GGUF distinguishes uint32 from uint64 and llama.cpp checks the type of
what it reads. Every producer of metadata (plugins, tokenizer export, the pipeline) builds one of
these; the writer writes it and the reader returns one.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ggufsmith.constants import GGUF_MAX_ARRAY_DEPTH, GGUF_MAX_KEY_BYTES, GGUFValueType
from ggufsmith.errors import GGUFError

# lower_snake_case segments separated by dots; digits allowed after the first letter of a segment
# and as whole segments (general.base_model.0.name). A hyphen too: llama.cpp's architecture names
# (command-r, gpt-oss, jina-bert-v3) are the first segment of their keys.
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$")

_INT_RANGES = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_FLOAT_TYPES = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)


@dataclass(frozen=True)
class MetadataValue:
    """One value with its GGUF type. For arrays, `element_type` is the type of the elements and
    `value` a sequence; a nested array's elements are themselves MetadataValue arrays."""

    value: Any
    type: GGUFValueType
    element_type: GGUFValueType | None = None

    def plain(self) -> Any:
        """The value as plain Python (nested arrays as lists), for printing and comparisons."""
        if self.type != GGUFValueType.ARRAY:
            return self.value
        if self.element_type == GGUFValueType.ARRAY:
            return [v.plain() for v in self.value]
        if isinstance(self.value, np.ndarray):
            return self.value.tolist()
        return list(self.value)


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key.isascii() or not _KEY_RE.match(key):
        raise GGUFError(f"metadata key {key!r} is not lower_snake_case.dotted ASCII")
    if len(key) > GGUF_MAX_KEY_BYTES:
        raise GGUFError(f"metadata key {key[:40]!r}... is longer than {GGUF_MAX_KEY_BYTES} bytes")


def _check_scalar(key: str, value: Any, vtype: GGUFValueType) -> Any:
    if vtype in _INT_RANGES:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise GGUFError(f"metadata {key}: {vtype.name} needs an integer, got {value!r}")
        lo, hi = _INT_RANGES[vtype]
        if not lo <= int(value) <= hi:
            raise GGUFError(f"metadata {key}: {value} does not fit {vtype.name}")
        return int(value)
    if vtype in _FLOAT_TYPES:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise GGUFError(f"metadata {key}: {vtype.name} needs a number, got {value!r}")
        value = float(value)
        if vtype == GGUFValueType.FLOAT32:
            try:
                struct.pack("<f", value)
            except OverflowError:
                raise GGUFError(f"metadata {key}: {value} is too large for FLOAT32") from None
        return value
    if vtype == GGUFValueType.BOOL:
        if not isinstance(value, (bool, np.bool_)):
            raise GGUFError(f"metadata {key}: BOOL needs True or False, got {value!r}")
        return bool(value)
    if vtype == GGUFValueType.STRING:
        if isinstance(value, bytes):
            return value
        if not isinstance(value, str):
            raise GGUFError(f"metadata {key}: STRING needs str or bytes, got {type(value).__name__}")
        return value
    raise GGUFError(f"metadata {key}: {vtype!r} is not a scalar type")


def make_value(
    key: str, value: Any, vtype: GGUFValueType, element_type: GGUFValueType | None = None
) -> MetadataValue:
    """Check `value` against its declared type and wrap it."""
    vtype = GGUFValueType(vtype)
    if vtype != GGUFValueType.ARRAY:
        if element_type is not None:
            raise GGUFError(f"metadata {key}: element_type is only for arrays")
        return MetadataValue(_check_scalar(key, value, vtype), vtype)
    if element_type is None:
        raise GGUFError(f"metadata {key}: an array needs an element_type")
    element_type = GGUFValueType(element_type)
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise GGUFError(f"metadata {key}: an array needs a sequence, got {type(value).__name__}")
    if element_type == GGUFValueType.ARRAY:
        items = []
        for item in value:
            if not isinstance(item, MetadataValue) or item.type != GGUFValueType.ARRAY:
                raise GGUFError(f"metadata {key}: elements of a nested array must be array MetadataValues")
            items.append(item)
        if 1 + max((_array_depth(item) for item in items), default=0) > GGUF_MAX_ARRAY_DEPTH:
            raise GGUFError(f"metadata {key}: arrays nested deeper than {GGUF_MAX_ARRAY_DEPTH} levels")
        return MetadataValue(tuple(items), vtype, element_type)
    if isinstance(value, np.ndarray) and element_type not in (GGUFValueType.STRING, GGUFValueType.BOOL):
        # Large numeric arrays (token scores, types) stay numpy; check the range once.
        arr = np.asarray(value).reshape(-1)
        if element_type in _INT_RANGES:
            if arr.size and not np.issubdtype(arr.dtype, np.integer):
                raise GGUFError(f"metadata {key}: {element_type.name} array needs integers, got {arr.dtype}")
            lo, hi = _INT_RANGES[element_type]
            if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
                raise GGUFError(f"metadata {key}: array values do not fit {element_type.name}")
        elif element_type == GGUFValueType.FLOAT32 and arr.size:
            with np.errstate(over="ignore"):
                overflowed = np.isfinite(arr) & ~np.isfinite(arr.astype(np.float32))
            if overflowed.any():
                raise GGUFError(f"metadata {key}: array values are too large for FLOAT32")
        return MetadataValue(arr, vtype, element_type)
    return MetadataValue(tuple(_check_scalar(key, v, element_type) for v in value), vtype, element_type)


def _array_depth(item: MetadataValue) -> int:
    if item.element_type != GGUFValueType.ARRAY:
        return 1
    return 1 + max((_array_depth(v) for v in item.value), default=0)


class Metadata:
    """Ordered key -> MetadataValue. Adding a key twice is an error; use `replace` to overwrite."""

    def __init__(self) -> None:
        self._items: dict[str, MetadataValue] = {}
        # Where a value came from ("config.json hidden_size"), for error messages; not written.
        self.origins: dict[str, str] = {}

    def add(self, key: str, value: Any, vtype: GGUFValueType, element_type: GGUFValueType | None = None) -> None:
        check_key(key)
        if key in self._items:
            raise GGUFError(f"metadata key {key!r} is set twice")
        self._items[key] = make_value(key, value, vtype, element_type)

    def replace(self, key: str, value: Any, vtype: GGUFValueType, element_type: GGUFValueType | None = None) -> None:
        check_key(key)
        self._items[key] = make_value(key, value, vtype, element_type)

    def add_value(self, key: str, value: MetadataValue) -> None:
        """Add an already-typed value (e.g. one read from another GGUF file)."""
        self.add(key, value.value, value.type, value.element_type)

    def add_read_value(self, key: str, value: MetadataValue) -> None:
        """For readers: store a value parsed from a file as it is. Keys that break the naming rule
        are kept (real files have them; `inspect` reports them), duplicates are still an error."""
        if key in self._items:
            raise GGUFError(f"metadata key {key!r} is set twice")
        self._items[key] = value

    def update(self, other: Metadata) -> None:
        """Add every key of `other`; a key present in both is an error."""
        for key, value in other.items():
            self.add_value(key, value)
        self.origins.update(other.origins)

    # Shorthands for the common types, so call sites read as the spec does.
    def add_string(self, key: str, value: str) -> None:
        self.add(key, value, GGUFValueType.STRING)

    def add_uint32(self, key: str, value: int) -> None:
        self.add(key, value, GGUFValueType.UINT32)

    def add_uint64(self, key: str, value: int) -> None:
        self.add(key, value, GGUFValueType.UINT64)

    def add_int32(self, key: str, value: int) -> None:
        self.add(key, value, GGUFValueType.INT32)

    def add_float32(self, key: str, value: float) -> None:
        self.add(key, value, GGUFValueType.FLOAT32)

    def add_bool(self, key: str, value: bool) -> None:
        self.add(key, value, GGUFValueType.BOOL)

    def add_array(self, key: str, values: Sequence | np.ndarray, element_type: GGUFValueType) -> None:
        self.add(key, values, GGUFValueType.ARRAY, element_type)

    def remove(self, key: str) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __getitem__(self, key: str) -> MetadataValue:
        return self._items[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The plain value of `key`, or `default`."""
        item = self._items.get(key)
        return default if item is None else item.plain()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def items(self) -> Iterator[tuple[str, MetadataValue]]:
        return iter(self._items.items())

    def __repr__(self) -> str:
        return f"Metadata({len(self)} keys)"
