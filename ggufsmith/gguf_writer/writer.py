"""A streaming GGUF v3 writer that checks its own state.

Usage:

    with GGUFWriter("out.gguf", metadata) as w:          # metadata: a Metadata
        w.add_tensor("token_embd.weight", (32000, 4096), GGMLType.Q8_0)
        ...                                              # declare every tensor first
        for name, data in ...:                           # then hand the bytes, in declared order
            w.write_tensor(name, data)
    # on success the temporary file is renamed to out.gguf; on any exception it is deleted

Only the tensor being written is ever held. Shapes are given in numpy order (rows last); the file
stores them in ggml order (ne[0] = row length), reversed.

Any error once the file is open (wrong order, wrong byte count, an exception or KeyboardInterrupt
while writing) deletes the temporary file, so a failed write never leaves a .gguf or a temp file.
The target is checked first (not an input, not a directory or device unless `force`) and the
temporary file is locked while written, so that a later run can delete it if this process is
killed: see output.py.

Nested arrays (arrays of arrays) are written as the spec allows and gguf-py reads them, but ggml's
loader rejects them ("invalid GGUF type 9"), so llama.cpp will not load such a file; `inspect` warns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufsmith.constants import (
    GGML_ELEMENT_DTYPE,
    GGML_TYPE_LAYOUT,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_DIMS,
    GGUF_MAX_TENSOR_NAME_BYTES,
    GGUF_VERSION,
    GGMLType,
    GGUFValueType,
    Keys,
)
from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer.encoding import Encoder, align_offset
from ggufsmith.gguf_writer.metadata import Metadata, make_value
from ggufsmith.gguf_writer.output import OutputFile, check_target, open_output

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order, rows last
    ggml_type: GGMLType
    offset: int  # relative to the start of the tensor data section
    nbytes: int


def tensor_data_size(name: str, shape: tuple[int, ...], ggml_type: GGMLType) -> int:
    """Bytes of a tensor's data; raises GGUFError when the shape does not fit the type."""
    layout = GGML_TYPE_LAYOUT[ggml_type]
    row_length = shape[-1]
    if row_length % layout.block_size:
        raise GGUFError(
            f"tensor {name}: {ggml_type.name} needs a row length that is a multiple of "
            f"{layout.block_size}, got {row_length}"
        )
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if n_elements > INT64_MAX:
        raise GGUFError(f"tensor {name}: shape {shape} has more elements than ggml can count (int64)")
    return n_elements // layout.block_size * layout.type_size


class GGUFWriter:
    """States: declaring (metadata and tensor infos) -> writing (tensor data) -> closed."""

    def __init__(
        self,
        path: str | os.PathLike,
        metadata: Metadata | None = None,
        *,
        alignment: int = GGUF_DEFAULT_ALIGNMENT,
        byteorder: str = "little",
        fsync: bool = True,
        inputs: Iterable[str | os.PathLike] = (),
        force: bool = False,
    ) -> None:
        """`fsync=False` skips forcing the data to disk before the rename: the file still appears
        only complete, but a power loss right after may leave it empty on some file systems. For
        multi-GB files on a slow disk the fsync can take as long as producing the data.

        `inputs`: the files the data comes from, which the target must not be. `force`: write into
        an existing device node or FIFO at `path` instead of refusing it (see output.check_target)."""
        if byteorder not in ("little", "big"):
            raise GGUFError(f"byteorder must be 'little' or 'big', got {byteorder!r}")
        if not isinstance(alignment, int) or alignment < 8 or alignment & (alignment - 1):
            raise GGUFError(f"alignment must be a power of two of at least 8, got {alignment!r}")
        self.path = Path(path)
        self.metadata = metadata if metadata is not None else Metadata()
        self.alignment = alignment
        self.byteorder = byteorder
        self.fsync = fsync
        self.inputs = tuple(inputs)
        self.force = force
        self._enc = Encoder("<" if byteorder == "little" else ">")
        self._tensors: list[TensorInfo] = []
        self._names: set[str] = set()
        self._data_size = 0
        self._next = 0  # index of the next tensor whose data is expected
        self._state = "declaring"
        self._out: OutputFile | None = None

    # -- declaring ---------------------------------------------------------------------------
    def add_tensor(self, name: str, shape: tuple[int, ...] | list[int], ggml_type: GGMLType | int) -> TensorInfo:
        """Declare a tensor. Its data must later be written in declaration order."""
        self._expect("declaring", f"declare tensor {name!r}")
        if not isinstance(name, str) or not name or "\0" in name:
            raise GGUFError(f"tensor name must be a non-empty string without NUL, got {name!r}")
        if len(name.encode("utf-8")) > GGUF_MAX_TENSOR_NAME_BYTES:
            raise GGUFError(
                f"tensor name {name!r} is {len(name.encode('utf-8'))} bytes; ggml allows at most "
                f"{GGUF_MAX_TENSOR_NAME_BYTES}"
            )
        if name in self._names:
            raise GGUFError(f"tensor {name!r} is declared twice")
        try:
            ggml_type = GGMLType(ggml_type)
        except ValueError:
            raise GGUFError(f"tensor {name}: unknown tensor type {ggml_type!r}") from None
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= GGUF_MAX_DIMS:
            raise GGUFError(f"tensor {name}: {len(shape)} dimensions; GGUF allows 1 to {GGUF_MAX_DIMS}")
        if any(d < 0 for d in shape):
            raise GGUFError(f"tensor {name}: negative dimension in shape {shape}")
        nbytes = tensor_data_size(name, shape, ggml_type)
        if self.byteorder == "big" and ggml_type not in GGML_ELEMENT_DTYPE:
            raise GGUFError(f"tensor {name}: big-endian files of {ggml_type.name} data are not supported")
        info = TensorInfo(name, shape, ggml_type, self._data_size, nbytes)
        self._tensors.append(info)
        self._names.add(name)
        self._data_size = align_offset(self._data_size + nbytes, self.alignment)
        return info

    @property
    def tensors(self) -> list[TensorInfo]:
        return list(self._tensors)

    # -- writing -----------------------------------------------------------------------------
    def write_tensor(self, name: str, data: np.ndarray | bytes | bytearray | memoryview) -> None:
        """Write the data of the next declared tensor: exactly its size in bytes, native layout.

        For big-endian files the data is given in native (little-endian) byte order and swapped here.
        """
        info = self._next_tensor(name)
        try:
            raw = _as_bytes_view(data)
            if raw.nbytes != info.nbytes:
                raise self._fail(
                    f"tensor {name}: expected {info.nbytes} bytes for {info.ggml_type.name} {info.shape}, got {raw.nbytes}"
                )
            self._out.write(self._in_file_order(raw, info).data)
            end = info.offset + info.nbytes
            self._out.write(b"\0" * (align_offset(end, self.alignment) - end))
        except BaseException:
            self.abort()
            raise
        self._next += 1

    def write_tensor_pieces(self, name: str, pieces: Iterable[np.ndarray | bytes | bytearray | memoryview]) -> None:
        """Like write_tensor, with the data given as consecutive pieces (a large tensor converted
        in slices of rows), so that the whole tensor never has to be in memory at once."""
        info = self._next_tensor(name)
        try:
            written = 0
            for piece in pieces:
                raw = _as_bytes_view(piece)
                if written + raw.nbytes > info.nbytes:
                    raise self._fail(f"tensor {name}: more than the expected {info.nbytes} bytes")
                self._out.write(self._in_file_order(raw, info).data)
                written += raw.nbytes
            if written != info.nbytes:
                raise self._fail(
                    f"tensor {name}: expected {info.nbytes} bytes for {info.ggml_type.name} {info.shape}, got {written}"
                )
            end = info.offset + info.nbytes
            self._out.write(b"\0" * (align_offset(end, self.alignment) - end))
        except BaseException:
            self.abort()
            raise
        self._next += 1

    def _next_tensor(self, name: str) -> TensorInfo:
        """The declared tensor whose data comes next, checked to be `name` (writes the header first)."""
        if self._state == "declaring":
            self._write_header()
        self._expect("writing", f"write tensor {name!r}")
        if self._next >= len(self._tensors):
            raise self._fail(f"tensor {name!r} was not declared (all declared tensors are written)")
        info = self._tensors[self._next]
        if name != info.name:
            known = "declared" if name in self._names else "not declared"
            raise self._fail(f"expected data of tensor {info.name!r} next, got {name!r} ({known})")
        return info

    def finish(self, commit: bool = True) -> Path:
        """Check every tensor was written, then move the file into place. Returns the path.

        `commit=False` stops short of the rename: the file is complete but stays temporary until
        commit() (or is deleted by abort()), so that several files can appear together."""
        if self._state == "declaring":
            self._write_header()
        self._expect("writing", "finish")
        if self._next != len(self._tensors):
            missing = self._tensors[self._next].name
            raise self._fail(
                f"{len(self._tensors) - self._next} declared tensor(s) have no data yet, starting with {missing!r}"
            )
        self._state = "complete"
        if commit:
            self.commit()
        return self.path

    def commit(self) -> None:
        """Rename the complete file (finish(commit=False)) onto its target."""
        self._expect("complete", "commit")
        try:
            self._out.commit(self.fsync)
        except BaseException:
            self.abort()
            raise
        self._state = "closed"

    def abort(self) -> None:
        """Give up: delete the temporary file. Safe to call in any state."""
        if self._out is not None and self._state != "closed":
            self._out.discard()
        self._state = "closed"

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()

    def __del__(self) -> None:
        # A writer dropped without finish() (a caller that forgot, or an exception outside a with
        # block) must not leave its temporary file behind.
        if getattr(self, "_state", "closed") != "closed":
            self.abort()

    # -- internals ---------------------------------------------------------------------------
    def _expect(self, state: str, action: str) -> None:
        if self._state != state:
            raise self._fail(f"cannot {action}: the writer is {self._state}, not {state}")

    def _in_file_order(self, raw: np.ndarray, info: TensorInfo) -> np.ndarray:
        """Bytes of native (little-endian) numbers as the file stores them: swapped in a big-endian file."""
        if self.byteorder == "little":
            return raw
        element = np.dtype("<" + GGML_ELEMENT_DTYPE[info.ggml_type])
        if raw.nbytes % element.itemsize:
            raise self._fail(f"tensor {info.name}: a piece of {raw.nbytes} bytes splits a {info.ggml_type.name} value")
        return raw.view(element).astype(element.newbyteorder(">")).view(np.uint8)

    def _fail(self, message: str) -> GGUFError:
        """A usage error once the file is open ends the write: the temporary file is deleted."""
        if self._state == "writing":
            self.abort()
        return GGUFError(f"{self.path}: {message}")

    def _header_bytes(self) -> bytes:
        metadata = self.metadata
        declared = metadata.get(Keys.General.ALIGNMENT)
        if declared is not None and metadata[Keys.General.ALIGNMENT].type != GGUFValueType.UINT32:
            raise GGUFError(f"metadata {Keys.General.ALIGNMENT} must be a UINT32 (llama.cpp rejects other types)")
        if declared is not None and declared != self.alignment:
            raise GGUFError(f"metadata says general.alignment={declared} but the writer aligns to {self.alignment}")
        enc = self._enc
        parts = [GGUF_MAGIC, enc.u32(GGUF_VERSION), enc.u64(len(self._tensors))]
        items = list(metadata.items())
        if declared is None and self.alignment != GGUF_DEFAULT_ALIGNMENT:
            items.append((Keys.General.ALIGNMENT, make_value(Keys.General.ALIGNMENT, self.alignment, GGUFValueType.UINT32)))
        parts.append(enc.u64(len(items)))
        parts.extend(enc.key_value(key, value) for key, value in items)
        for info in self._tensors:
            parts.append(enc.string(info.name))
            parts.append(enc.u32(len(info.shape)))
            parts.extend(enc.u64(d) for d in reversed(info.shape))
            parts.append(enc.u32(info.ggml_type))
            parts.append(enc.u64(info.offset))
        header = b"".join(parts)
        # A file without tensors (--vocab-only) ends right after its metadata, as gguf-py writes it; a
        # part of a split model without tensors (--no-tensor-first-split) is padded, as both gguf-py
        # and ggml (llama-gguf-split) write one.
        if self._tensors or Keys.Split.COUNT in metadata:
            header += b"\0" * (align_offset(len(header), self.alignment) - len(header))
        return header

    def _write_header(self) -> None:
        header = self._header_bytes()
        self._out = open_output(check_target(self.path, self.inputs, force=self.force))
        self._state = "writing"
        try:
            self._out.write(header)
        except BaseException:
            self.abort()
            raise


def _as_bytes_view(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)
