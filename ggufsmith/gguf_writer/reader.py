"""A validating GGUF reader: memory-maps the file and checks every field before trusting it.

    reader = GGUFReader("model.gguf")
    reader.metadata["general.architecture"].value     # typed MetadataValue
    for t in reader.tensors:
        t.name, t.shape, t.ggml_type, t.data            # data: zero-copy uint8 view of the file
        t.to_float32()                                  # dequantized through ggufsmith.quantize

Reads GGUF v1, v2 and v3 in either byte order. A big-endian file is recognised as llama.cpp and
gguf-py do: its version, read little-endian, has its low 16 bits zero.

Any malformed or hostile content raises GGUFError naming the byte offset and the problem. Counts
and lengths are checked against the bytes left in the file before anything is allocated for them,
so a count of 2**63 fails at once instead of allocating.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufsmith.constants import (
    GGML_ELEMENT_DTYPE,
    GGML_TYPE_LAYOUT,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_ARRAY_DEPTH,
    GGUF_MAX_DIMS,
    GGUF_VALUE_STRUCT,
    GGMLType,
    GGUFValueType,
    Keys,
)
from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer.cursor import ByteCursor
from ggufsmith.gguf_writer.encoding import NUMPY_DTYPE_OF_VALUE, align_offset
from ggufsmith.gguf_writer.metadata import Metadata, MetadataValue

SUPPORTED_VERSIONS = (1, 2, 3)
# The spec says names are at most 64 bytes (ggml itself only loads 63; `inspect` warns about 64).
MAX_TENSOR_NAME_BYTES_READ = 64
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class ReaderTensor:
    """One tensor of a GGUF file. `shape` is in numpy order (rows last), the reverse of ggml's ne."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute, from the start of the file
    relative_offset: int  # as stored: from the start of the tensor data section
    nbytes: int
    n_elements: int
    byteorder: str  # "little" or "big": the byte order of the file
    info_offset: int  # where this tensor's info starts in the file (for error messages)
    _buffer: np.ndarray = field(repr=False, compare=False)

    @property
    def ne(self) -> tuple[int, ...]:
        """The shape in ggml order (ne[0] = row length), as stored in the file."""
        return tuple(reversed(self.shape))

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapped file, no copy."""
        return self._buffer[self.offset : self.offset + self.nbytes]

    def values(self) -> np.ndarray:
        """For element types (F32, F16, F64, I8..I64; BF16 as raw uint16 bits): the data as a numpy
        array of `shape` with the file's byte order in its dtype, still a view of the file."""
        element = GGML_ELEMENT_DTYPE.get(self.ggml_type)
        if element is None:
            raise GGUFError(f"tensor {self.name}: {self.ggml_type.name} data are blocks, not elements; use to_float32()")
        order = "<" if self.byteorder == "little" else ">"
        return self.data.view(order + element).reshape(self.shape)

    def to_float32(self) -> np.ndarray:
        """The tensor dequantized to float32 in native byte order (a new array)."""
        from ggufsmith.quantize import dequantize  # the quantizer imports the writer's package

        data = self.data
        if self.byteorder == "big":
            element = GGML_ELEMENT_DTYPE.get(self.ggml_type)
            if element is None:
                raise GGUFError(
                    f"tensor {self.name}: cannot decode {self.ggml_type.name} blocks of a big-endian file"
                )
            data = data.view(">" + element).astype("<" + element).view(np.uint8)
        return dequantize(data, self.ggml_type, self.shape)


class GGUFReader:
    """Parses and validates a whole GGUF file on construction; raises GGUFError if anything is wrong."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.file_size = os.stat(self.path).st_size
        source = str(self.path)
        if self.file_size < 8:
            raise GGUFError(f"{source}: {self.file_size} bytes is too short for a GGUF file (truncated?)")
        with open(self.path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._map = np.frombuffer(mapping, dtype=np.uint8)
        self.metadata = Metadata()
        self.tensors: list[ReaderTensor] = []
        self._parse(ByteCursor(self._map, source))

    # -- public helpers ------------------------------------------------------------------------
    def tensor(self, name: str) -> ReaderTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def close(self) -> None:
        """Drop this reader's reference to the mapping; it is unmapped once no tensor view uses it."""
        self._map = None

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- parsing -------------------------------------------------------------------------------
    def _parse(self, cur: ByteCursor) -> None:
        magic = bytes(cur.raw(4, "the magic"))
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}", 0)
        self._read_version(cur)
        self._read_metadata(cur)
        self.alignment = self._alignment(cur)
        infos = self._read_tensor_infos(cur)
        self.tensor_info_end = cur.pos
        # The data section starts at the next multiple of the alignment. A file without tensors may
        # end right after its metadata, without that padding (llama.cpp writes vocab files so).
        self.data_offset = align_offset(cur.pos, self.alignment)
        if infos and self.data_offset > self.file_size:
            raise cur.fail(
                f"the tensor data section would start at byte {self.data_offset}, past the end of the "
                f"{self.file_size}-byte file (truncated?)"
            )
        self._place_tensors(cur, infos)

    def _read_version(self, cur: ByteCursor) -> None:
        at = cur.pos
        version = cur.u32("the version")
        if version & 0xFFFF == 0 and version != 0:
            version = struct.unpack("<I", struct.pack(">I", version))[0]
            cur.order = ">"
        if version not in SUPPORTED_VERSIONS:
            raise cur.fail(f"unsupported GGUF version {version} (ggufsmith reads versions 1 to 3)", at)
        self.version = version
        self.byteorder = "little" if cur.order == "<" else "big"
        cur.size_width = 4 if version == 1 else 8
        width = cur.size_width
        # Smallest possible encodings: a tensor info with a 1-byte name and one dimension, and a
        # key-value pair with a 1-byte key and a 1-byte value.
        self.n_tensors = cur.count("tensor infos", width + 1 + 4 + width + 4 + 8)
        self.n_kv = cur.count("metadata key-value pairs", width + 1 + 4 + 1)

    def _read_metadata(self, cur: ByteCursor) -> None:
        for i in range(self.n_kv):
            at = cur.pos
            key = cur.string(f"the key of metadata pair {i}")
            if isinstance(key, bytes) or not key:
                raise cur.fail(f"metadata pair {i} has an empty or non-UTF-8 key {key!r}", at)
            if key in self.metadata:
                raise cur.fail(f"metadata key {key!r} appears twice", at)
            vtype = self._value_type(cur, f"the type of {key}")
            value = self._read_value(cur, key, vtype)
            self.metadata.add_read_value(key, value)

    def _value_type(self, cur: ByteCursor, what: str) -> GGUFValueType:
        at = cur.pos
        raw = cur.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise cur.fail(f"{what} is {raw}, not a known GGUF value type", at) from None

    def _read_value(self, cur: ByteCursor, key: str, vtype: GGUFValueType) -> MetadataValue:
        if vtype == GGUFValueType.ARRAY:
            return self._read_array(cur, key, depth=1)
        if vtype == GGUFValueType.STRING:
            return MetadataValue(cur.string(f"the value of {key}"), vtype)
        return MetadataValue(self._read_scalar(cur, key, vtype), vtype)

    def _read_scalar(self, cur: ByteCursor, key: str, vtype: GGUFValueType):
        at = cur.pos
        if vtype == GGUFValueType.BOOL:
            raw = cur.scalar("B", 1, f"the value of {key}")
            if raw > 1:
                raise cur.fail(f"the bool value of {key} is {raw}; GGUF allows only 0 and 1", at)
            return bool(raw)
        fmt = GGUF_VALUE_STRUCT[vtype]
        return cur.scalar(fmt, struct.calcsize(fmt), f"the value of {key}")

    def _read_array(self, cur: ByteCursor, key: str, depth: int) -> MetadataValue:
        if depth > GGUF_MAX_ARRAY_DEPTH:
            raise cur.fail(f"{key}: arrays nested deeper than {GGUF_MAX_ARRAY_DEPTH} levels")
        etype = self._value_type(cur, f"the element type of array {key}")
        if etype == GGUFValueType.STRING:
            n = cur.count(f"strings in {key}", cur.size_width)
            return MetadataValue(cur.strings(n, key), GGUFValueType.ARRAY, etype)
        if etype == GGUFValueType.ARRAY:
            n = cur.count(f"arrays in {key}", 4 + cur.size_width)
            items = tuple(self._read_array(cur, key, depth + 1) for _ in range(n))
            return MetadataValue(items, GGUFValueType.ARRAY, etype)
        dtype = NUMPY_DTYPE_OF_VALUE[etype]
        at = cur.pos
        n = cur.count(f"elements in {key}", np.dtype(dtype).itemsize)
        values = cur.array(dtype, n, f"the elements of {key}")
        if etype == GGUFValueType.BOOL:
            if n and int(values.max()) > 1:
                raise cur.fail(f"array {key} holds a bool that is neither 0 nor 1", at)
            values = values.view(np.bool_)
        elif cur.order == ">" and values.dtype.itemsize > 1:
            values = values.astype(values.dtype.newbyteorder("="))  # numbers in native order
        return MetadataValue(values, GGUFValueType.ARRAY, etype)

    def _alignment(self, cur: ByteCursor) -> int:
        if Keys.General.ALIGNMENT not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        item = self.metadata[Keys.General.ALIGNMENT]
        if item.type != GGUFValueType.UINT32:
            raise cur.fail(f"{Keys.General.ALIGNMENT} must be a UINT32, not {item.type.name}")
        if item.value == 0 or item.value & (item.value - 1):
            raise cur.fail(f"{Keys.General.ALIGNMENT} is {item.value}, not a power of two")
        return item.value

    def _read_tensor_infos(self, cur: ByteCursor) -> list[tuple]:
        infos = []
        names: set[str] = set()
        for i in range(self.n_tensors):
            at = cur.pos
            name = cur.string(f"the name of tensor {i}")
            if isinstance(name, bytes):
                raise cur.fail(f"the name of tensor {i} is not UTF-8: {name!r}", at)
            if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES_READ:
                raise cur.fail(f"tensor name {name[:70]!r}... is longer than {MAX_TENSOR_NAME_BYTES_READ} bytes", at)
            if name in names:
                raise cur.fail(f"tensor {name!r} appears twice", at)
            names.add(name)
            dims_at = cur.pos
            n_dims = cur.u32(f"the dimension count of tensor {name}")
            if not 1 <= n_dims <= GGUF_MAX_DIMS:
                raise cur.fail(f"tensor {name} has {n_dims} dimensions; GGUF allows 1 to {GGUF_MAX_DIMS}", dims_at)
            ne = [cur.size(f"dimension {j} of tensor {name}") for j in range(n_dims)]
            n_elements = 1
            for d in ne:
                if d > INT64_MAX:  # ggml reads dimensions as int64
                    raise cur.fail(f"tensor {name} has a negative dimension in {ne}", dims_at)
                n_elements *= d
            if n_elements > INT64_MAX:
                raise cur.fail(f"tensor {name}: {ne} has more elements than fit in int64", dims_at)
            type_at = cur.pos
            raw_type = cur.u32(f"the type of tensor {name}")
            try:
                ggml_type = GGMLType(raw_type)
            except ValueError:
                raise cur.fail(f"tensor {name} has unknown tensor type {raw_type}", type_at) from None
            layout = GGML_TYPE_LAYOUT[ggml_type]
            if ne[0] % layout.block_size:
                raise cur.fail(
                    f"tensor {name}: {ggml_type.name} rows must be a multiple of {layout.block_size} "
                    f"elements, not {ne[0]}",
                    dims_at,
                )
            offset_at = cur.pos
            offset = cur.u64(f"the data offset of tensor {name}")
            if offset % self.alignment:
                raise cur.fail(f"tensor {name}: data offset {offset} is not a multiple of the alignment {self.alignment}", offset_at)
            nbytes = n_elements // layout.block_size * layout.type_size
            infos.append((name, tuple(reversed(ne)), ggml_type, offset, nbytes, n_elements, at))
        return infos

    def _place_tensors(self, cur: ByteCursor, infos: list[tuple]) -> None:
        for name, shape, ggml_type, offset, nbytes, n_elements, at in infos:
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise cur.fail(
                    f"tensor {name}: its {nbytes} bytes at file offset {start} run past the end of the "
                    f"{self.file_size}-byte file (truncated?)",
                    at,
                )
            self.tensors.append(
                ReaderTensor(name, shape, ggml_type, start, offset, nbytes, n_elements, self.byteorder, at, self._map)
            )
        # Tensors may be stored in any order, but no two may share a byte.
        previous = None
        for t in sorted((t for t in self.tensors if t.nbytes), key=lambda t: t.offset):
            if previous is not None and t.offset < previous.offset + previous.nbytes:
                raise cur.fail(
                    f"tensor {t.name} (bytes {t.offset}..{t.offset + t.nbytes}) overlaps tensor "
                    f"{previous.name} (bytes {previous.offset}..{previous.offset + previous.nbytes})",
                    t.info_offset,
                )
            previous = t
