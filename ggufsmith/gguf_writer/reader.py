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

The whole file is checked on construction, but nothing is decoded for keeping: `metadata` (a
FileMetadata) and `tensors` (a read-only list) decode each value or tensor from the mapped file when
asked for, and arrays of strings or arrays are LazyArrays that decode element by element. So the
reader's memory stays a small multiple of the file's size (about 1x at worst, measured in
tests/test_gguf_reader_memory.py) whatever the file holds.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufsmith.constants import (
    GGML_ELEMENT_DTYPE,
    GGML_TYPE_LAYOUT,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_DIMS,
    GGMLType,
    GGUFValueType,
    Keys,
)
from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer.cursor import ByteCursor
from ggufsmith.gguf_writer.encoding import align_offset
from ggufsmith.gguf_writer.file_index import LazyTable, NameIndex
from ggufsmith.gguf_writer.file_values import FileMetadata, skip_value, value_type

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
        self._parse(ByteCursor(self._map, source))

    # -- public helpers ------------------------------------------------------------------------
    def tensor(self, name: str) -> ReaderTensor:
        i = self._tensor_names.find(name)
        if i is None:
            raise KeyError(name)
        return self.tensors[i]

    def close(self) -> None:
        """Drop this reader's reference to the mapping; it is unmapped once no tensor view, tensor
        or metadata read from this reader uses it."""
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
        self.metadata = self._read_metadata(cur)
        self.alignment = self._alignment(cur)
        info_positions, offsets, sizes = self._read_tensor_infos(cur)
        self.tensor_info_end = cur.pos
        # The data section starts at the next multiple of the alignment. A file without tensors may
        # end right after its metadata, without that padding (llama.cpp writes vocab files so).
        self.data_offset = align_offset(cur.pos, self.alignment)
        if self.n_tensors and self.data_offset > self.file_size:
            raise cur.fail(
                f"the tensor data section would start at byte {self.data_offset}, past the end of the "
                f"{self.file_size}-byte file (truncated?)"
            )
        self.tensors: Sequence[ReaderTensor] = LazyTable(
            self.n_tensors, lambda i: self._tensor_at(cur, int(info_positions[i]), i)
        )
        self._check_tensor_placement(cur, offsets, sizes)

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

    def _read_metadata(self, cur: ByteCursor) -> FileMetadata:
        positions = np.empty(self.n_kv, dtype=np.int64)
        key_hashes = np.empty(self.n_kv, dtype=np.int64)
        for i in range(self.n_kv):
            at = cur.pos
            key = cur.string(f"the key of metadata pair {i}")
            if isinstance(key, bytes) or not key:
                raise cur.fail(f"metadata pair {i} has an empty or non-UTF-8 key {key!r}", at)
            skip_value(cur, key, value_type(cur, f"the type of {key}"))
            positions[i], key_hashes[i] = at, hash(key)
        metadata = FileMetadata(cur.at(0), positions, key_hashes)
        twice = metadata.first_duplicate()
        if twice is not None:
            raise cur.fail(f"metadata key {cur.at(twice).string('a key')!r} appears twice", twice)
        return metadata

    def _alignment(self, cur: ByteCursor) -> int:
        if Keys.General.ALIGNMENT not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        item = self.metadata[Keys.General.ALIGNMENT]
        if item.type != GGUFValueType.UINT32:
            raise cur.fail(f"{Keys.General.ALIGNMENT} must be a UINT32, not {item.type.name}")
        if item.value == 0 or item.value & (item.value - 1):
            raise cur.fail(f"{Keys.General.ALIGNMENT} is {item.value}, not a power of two")
        return item.value

    def _read_tensor_infos(self, cur: ByteCursor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Check every tensor info; returns where each starts, and each tensor's data offset and
        size, capped at the file size + 1 (larger ones cannot fit anyway) so that int64 holds them."""
        n, cap = self.n_tensors, self.file_size + 1
        positions = np.empty(n, dtype=np.int64)
        name_hashes = np.empty(n, dtype=np.int64)
        offsets = np.empty(n, dtype=np.int64)
        sizes = np.empty(n, dtype=np.int64)
        for i in range(n):
            positions[i] = cur.pos
            name, _, _, offset, nbytes, _ = self._read_tensor_info(cur, i)
            name_hashes[i], offsets[i], sizes[i] = hash(name), min(offset, cap), min(nbytes, cap)
        self._tensor_names = NameIndex(name_hashes, lambda i: cur.at(int(positions[i])).string("a tensor name"))
        twice = self._tensor_names.first_duplicate()
        if twice is not None:
            at = int(positions[twice])
            raise cur.fail(f"tensor {cur.at(at).string('a tensor name')!r} appears twice", at)
        return positions, offsets, sizes

    def _read_tensor_info(self, cur: ByteCursor, i: int) -> tuple:
        """(name, shape in numpy order, type, data offset, size in bytes, element count)."""
        at = cur.pos
        name = cur.string(f"the name of tensor {i}")
        if isinstance(name, bytes):
            raise cur.fail(f"the name of tensor {i} is not UTF-8: {name!r}", at)
        if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES_READ:
            raise cur.fail(f"tensor name {name[:70]!r}... is longer than {MAX_TENSOR_NAME_BYTES_READ} bytes", at)
        dims_at = cur.pos
        n_dims = cur.u32(f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= GGUF_MAX_DIMS:
            raise cur.fail(f"tensor {name} has {n_dims} dimensions; GGUF allows 1 to {GGUF_MAX_DIMS}", dims_at)
        ne = [cur.size(f"dimension {j} of tensor {name}") for j in range(n_dims)]
        n_elements = nonzero_product = 1
        for d in ne:
            if d > INT64_MAX:  # ggml reads dimensions as int64
                raise cur.fail(f"tensor {name} has a negative dimension in {ne}", dims_at)
            n_elements *= d
            nonzero_product *= max(d, 1)
        if n_elements > INT64_MAX:
            raise cur.fail(f"tensor {name}: {ne} has more elements than fit in int64", dims_at)
        if nonzero_product * 8 > INT64_MAX:
            # An empty tensor whose other dimensions multiply past what numpy can shape (ggml
            # accepts [0, 2**62, 4]; no real file has one, and no array could view it).
            raise cur.fail(f"tensor {name}: {ne} is empty, but its other dimensions multiply past int64", dims_at)
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
        return name, tuple(reversed(ne)), ggml_type, offset, nbytes, n_elements

    def _tensor_at(self, cur: ByteCursor, at: int, i: int) -> ReaderTensor:
        name, shape, ggml_type, offset, nbytes, n_elements = self._read_tensor_info(cur.at(at), i)
        start = self.data_offset + offset
        return ReaderTensor(name, shape, ggml_type, start, offset, nbytes, n_elements, self.byteorder, at, cur.buffer)

    def _check_tensor_placement(self, cur: ByteCursor, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Every tensor's bytes lie inside the file, and no two tensors share a byte."""
        starts = self.data_offset + offsets
        ends = starts + sizes
        past_end = np.flatnonzero(ends > self.file_size)
        if past_end.size:
            t = self.tensors[int(past_end[0])]
            raise cur.fail(
                f"tensor {t.name}: its {t.nbytes} bytes at file offset {t.offset} run past the end of the "
                f"{self.file_size}-byte file (truncated?)",
                t.info_offset,
            )
        # Tensors may be stored in any order, but no two may share a byte.
        with_data = np.flatnonzero(sizes)
        by_start = with_data[np.argsort(starts[with_data], kind="stable")]
        clash = np.flatnonzero(starts[by_start][1:] < ends[by_start][:-1])
        if clash.size:
            previous, t = self.tensors[int(by_start[clash[0]])], self.tensors[int(by_start[clash[0] + 1])]
            raise cur.fail(
                f"tensor {t.name} (bytes {t.offset}..{t.offset + t.nbytes}) overlaps tensor "
                f"{previous.name} (bytes {previous.offset}..{previous.offset + previous.nbytes})",
                t.info_offset,
            )
