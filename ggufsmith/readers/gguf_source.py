"""A GGUF file (or the parts of a split one) as the input of a plan: `ggufsmith quantize`.

Each tensor becomes a GGUFTensor, a RowSlicedTensor whose rows are dequantized on demand from
the memory-mapped file, and whose stored bytes can be copied as they are when its type does not
change. A model split by llama.cpp's gguf-split (NAME-00001-of-00003.gguf ...) is read whole, as
llama.cpp's loader reads it.
"""

from __future__ import annotations

import os
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGMLType, Keys
from ggufsmith.readers.safetensors import RowSlicedTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.reader import GGUFReader, ReaderTensor
from ggufsmith.quantize import dequantize

_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class GGUFTensor(RowSlicedTensor):
    stored_type: GGMLType = GGMLType.F32
    raw_loader: object = None  # Callable[[int, int], np.ndarray]: the stored bytes of rows [start, stop)
    split_index: int = 0

    def raw_rows(self, start: int, stop: int) -> np.ndarray:
        return self.raw_loader(start, stop)


def gguf_tensor(t: ReaderTensor, path: Path, split_index: int = 0) -> GGUFTensor:
    if t.byteorder != "little":
        raise ConversionError(f"{path}: a big-endian GGUF file; llama.cpp's quantizer does not read these either, "
                              "convert it to little-endian first")
    row_length = t.shape[-1] if len(t.shape) >= 2 else max(1, t.n_elements)
    n_rows = t.n_elements // row_length if row_length else 0
    row_bytes = t.nbytes // n_rows if n_rows else 0

    def raw(start: int, stop: int) -> np.ndarray:
        return t.data[start * row_bytes : stop * row_bytes]

    def rows(start: int, stop: int) -> np.ndarray:
        return dequantize(raw(start, stop), t.ggml_type, (stop - start, row_length))

    return GGUFTensor(
        shape=t.shape, dtype=t.ggml_type.name, loader=t.to_float32, source=f"{path.name}:{t.name}",
        rows_loader=rows, stored_type=t.ggml_type, raw_loader=raw, split_index=split_index,
    )


@dataclass
class GGUFModel:
    """The metadata of a GGUF model (its first file, for a split one) and all its tensors."""

    path: Path
    metadata: Metadata
    tensors: dict[str, GGUFTensor]
    alignment: int
    n_splits: int
    _stack: ExitStack

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def split_paths(path: Path, count: int) -> list[Path]:
    """The files of a split model, from the path of its first one (llama.cpp's naming)."""
    m = _SPLIT_NAME.match(path.name)
    if not m or int(m.group("no")) != 1 or int(m.group("count")) != count:
        raise ConversionError(
            f"{path} is part 1 of a model split in {count} files, but its name is not NAME-00001-of-{count:05d}.gguf; "
            "give the first file of the split, named as gguf-split names them"
        )
    return [path.with_name(f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def open_gguf_model(path: str | os.PathLike) -> GGUFModel:
    path = Path(path)
    stack = ExitStack()
    try:
        first = stack.enter_context(GGUFReader(path))
        count = int(first.metadata.get(Keys.Split.COUNT, 1) or 1)
        readers = [first]
        if count > 1:
            for part in split_paths(path, count)[1:]:
                if not part.exists():
                    raise ConversionError(f"{part}: missing part of the split model {path.name}")
                readers.append(stack.enter_context(GGUFReader(part)))
        tensors: dict[str, GGUFTensor] = {}
        for index, reader in enumerate(readers):
            for t in reader.tensors:
                if t.name in tensors:
                    raise ConversionError(f"{reader.path}: tensor {t.name} appears twice in the model")
                tensors[t.name] = gguf_tensor(t, reader.path, index)
        return GGUFModel(path, first.metadata, tensors, first.alignment, count, stack)
    except BaseException:
        stack.close()
        raise
