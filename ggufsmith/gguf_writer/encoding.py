"""Byte-level encoding of GGUF header fields and metadata values (the writer's half of the format)."""

from __future__ import annotations

import struct

import numpy as np

from ggufsmith.constants import GGUF_VALUE_STRUCT, GGUFValueType
from ggufsmith.gguf_writer.metadata import MetadataValue

# numpy dtypes of the fixed-size value types, without byte order.
NUMPY_DTYPE_OF_VALUE: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "u1",
    GGUFValueType.INT8: "i1",
    GGUFValueType.UINT16: "u2",
    GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4",
    GGUFValueType.INT32: "i4",
    GGUFValueType.FLOAT32: "f4",
    GGUFValueType.BOOL: "u1",
    GGUFValueType.UINT64: "u8",
    GGUFValueType.INT64: "i8",
    GGUFValueType.FLOAT64: "f8",
}


def align_offset(offset: int, alignment: int) -> int:
    return offset + (alignment - offset % alignment) % alignment


class Encoder:
    """Encodes GGUF primitives in one byte order ('<' little, '>' big)."""

    def __init__(self, byteorder: str) -> None:
        self.order = byteorder

    def scalar(self, vtype: GGUFValueType, value) -> bytes:
        return struct.pack(self.order + GGUF_VALUE_STRUCT[vtype], value)

    def u32(self, value: int) -> bytes:
        return struct.pack(self.order + "I", value)

    def u64(self, value: int) -> bytes:
        return struct.pack(self.order + "Q", value)

    def string(self, value: str | bytes) -> bytes:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return self.u64(len(raw)) + raw

    def value(self, item: MetadataValue) -> bytes:
        """The bytes of a value, without its type tag."""
        if item.type == GGUFValueType.STRING:
            return self.string(item.value)
        if item.type != GGUFValueType.ARRAY:
            return self.scalar(item.type, item.value)
        element_type = item.element_type
        head = self.u32(element_type) + self.u64(len(item.value))
        if element_type == GGUFValueType.STRING:
            return head + b"".join(self.string(v) for v in item.value)
        if element_type == GGUFValueType.ARRAY:
            # Each element of an array of arrays is itself (element type, length, values).
            return head + b"".join(self.value(v) for v in item.value)
        dtype = np.dtype(self.order + NUMPY_DTYPE_OF_VALUE[element_type])
        if isinstance(item.value, np.ndarray):
            return head + item.value.astype(dtype, copy=False).tobytes()
        # Straight from Python numbers to the target type: going through np.asarray first would
        # turn [0, 2**64 - 1] into float64 and lose the large values.
        return head + np.array(item.value, dtype=dtype).tobytes()

    def key_value(self, key: str, item: MetadataValue) -> bytes:
        return self.string(key) + self.u32(item.type) + self.value(item)
