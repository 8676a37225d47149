"""A GGUF file (or the parts of a split one) as the input of a plan: `ggufsmith quantize`.

Each tensor becomes a GGUFTensor, an EncodedTensor whose rows are dequantized on demand from
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

from ggufsmith.constants import GGUF_INTEGER_TYPES, GGMLType, GGUFValueType, Keys, arch_key
from ggufsmith.readers.file_rows import READABLE_DTYPES, FileRows
from ggufsmith.readers.lazy_tensor import EncodedTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.reader import GGUFReader, ReaderTensor
from ggufsmith.quantize import dequantize, get_format

_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# The keys `quantize` reads as integers; the {arch}.* ones may be per-layer arrays of integers.
_INTEGER_KEYS = (Keys.General.FILE_TYPE, Keys.Split.COUNT)
_ARCH_INTEGER_KEYS = (Keys.LLM.BLOCK_COUNT, Keys.LLM.EXPERT_COUNT, Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV)


@dataclass(frozen=True)
class GGUFTensor(EncodedTensor):
    split_index: int = 0  # the part of a split model it is in


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
        data = raw(start, stop)
        _valid(data, start, stop)
        return _finite(dequantize(data, t.ggml_type, (stop - start, row_length)), f"rows {start} to {stop - 1}")

    def _valid(data: np.ndarray, start: int, stop: int) -> None:
        # Blocks llama.cpp's loader rejects although they decode to finite values.
        invalid_rows = get_format(t.ggml_type).invalid_rows
        if invalid_rows is not None and stop > start and invalid_rows(data.reshape(stop - start, row_bytes)).any():
            raise ConversionError(f"{path}: tensor {t.name} has {t.ggml_type.name} blocks llama.cpp rejects as invalid "
                                  f"in rows {start} to {stop - 1}; the model is damaged")

    def whole() -> np.ndarray:
        return _finite(t.to_float32(), "its values")

    def file_rows(start: int, stop: int) -> FileRows:
        # F32/F16/BF16 rows a quantizer process reads and widens itself (readers/file_rows.py);
        # a NaN among them is refused there, by the quantizer's own check, naming the tensor
        return FileRows(str(path), t.offset + start * row_bytes, t.ggml_type.name, stop - start, row_length)

    def _finite(values: np.ndarray, where: str) -> np.ndarray:
        # A NaN or infinity would be quantized into a block llama.cpp's loader rejects (or that
        # computes NaN): refuse it here, naming the tensor, as llama-quantize refuses it.
        if not np.isfinite(values).all():
            raise ConversionError(f"{path}: tensor {t.name} has NaN or infinite values in {where}; the model is damaged")
        return values

    return GGUFTensor(
        shape=t.shape, dtype=t.ggml_type.name, loader=whole, source=f"{path}:{t.name}",
        rows_loader=rows, stored_type=t.ggml_type, raw_loader=raw, split_index=split_index,
        file_rows=file_rows if t.ggml_type.name in READABLE_DTYPES and len(t.shape) >= 2 else None,
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


def check_metadata_types(path: Path, metadata: Metadata) -> None:
    """The keys `quantize` reads have the types llama.cpp reads them as (it refuses other types)."""
    arch = metadata[Keys.General.ARCHITECTURE] if Keys.General.ARCHITECTURE in metadata else None
    if arch is not None and arch.type != GGUFValueType.STRING:
        raise ConversionError(f"{path}: metadata {Keys.General.ARCHITECTURE} is {_type_name(arch)}, not a STRING; the file is damaged")
    arch_keys = [arch_key(k, str(arch.value)) for k in _ARCH_INTEGER_KEYS] if arch is not None else []
    for key in [*_INTEGER_KEYS, *arch_keys]:
        if key not in metadata:
            continue
        item = metadata[key]
        per_layer = key in arch_keys and item.type == GGUFValueType.ARRAY and item.element_type in GGUF_INTEGER_TYPES
        if item.type not in GGUF_INTEGER_TYPES and not per_layer:
            raise ConversionError(f"{path}: metadata {key} is {_type_name(item)}, not an integer; the file is damaged")


_PART_KEYS = (Keys.Split.NO, Keys.Split.COUNT, Keys.Split.TENSORS_COUNT)


def _check_part(part: GGUFReader, index: int, first: GGUFReader) -> None:
    """Part `index` (0-based) of the split model whose first part is `first` says it is that part
    of that split: llama.cpp's loader refuses a part whose split.no is not its place."""
    def split_values(reader: GGUFReader) -> list:
        values = [reader.metadata.get(key) for key in _PART_KEYS]
        return [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]

    found = split_values(part)
    expected = [index, *split_values(first)[1:]]
    if found != expected:
        def described(values: list) -> str:
            return ", ".join(f"{key}={'absent' if v is None else v}" for key, v in zip(_PART_KEYS, values))
        raise ConversionError(f"{part.path}: not part {index + 1} of {first.path.name}'s split: it has {described(found)}, "
                              f"expected {described(expected)}; are the parts from two different splits, or renamed?")


def _type_name(item) -> str:
    return item.type.name if item.type != GGUFValueType.ARRAY else f"an ARRAY of {item.element_type.name}"


def open_gguf_model(path: str | os.PathLike) -> GGUFModel:
    path = Path(path)
    stack = ExitStack()
    try:
        first = stack.enter_context(GGUFReader(path))
        check_metadata_types(path, first.metadata)
        count = int(first.metadata.get(Keys.Split.COUNT, 1) or 1)
        readers = [first]
        if count > 1:
            for index, part in enumerate(split_paths(path, count)[1:], start=1):
                if not part.exists():
                    raise ConversionError(f"{part}: missing part of the split model {path.name}")
                readers.append(stack.enter_context(GGUFReader(part)))
                _check_part(readers[-1], index, first)
        tensors: dict[str, GGUFTensor] = {}
        for index, reader in enumerate(readers):
            for t in reader.tensors:
                if t.name in tensors:
                    raise ConversionError(f"{reader.path}: tensor {t.name} is also in an earlier part of {path.name}; "
                                          "are the parts from two different splits?")
                tensors[t.name] = gguf_tensor(t, reader.path, index)
        expected = first.metadata.get(Keys.Split.TENSORS_COUNT)
        if count > 1 and expected is not None and int(expected) != len(tensors):
            raise ConversionError(f"{path}: the split model should have {int(expected)} tensors (split.tensors.count) but "
                                  f"its {count} parts have {len(tensors)}; are the parts from two different splits?")
        return GGUFModel(path, first.metadata, tensors, first.alignment, count, stack)
    except BaseException:
        stack.close()
        raise
