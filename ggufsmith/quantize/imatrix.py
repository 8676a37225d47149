"""llama.cpp's importance matrix files: reading both formats, writing the GGUF one.

An importance matrix gives, for every weight matrix of a model, one non-negative weight per input
column (per expert for 3-D MoE tensors): the mean square of the activations that multiply that
column. The quantizers use it to spend precision where the activations are large.

Two file formats exist, both written by llama.cpp's `llama-imatrix`:
- GGUF (current): `general.type = "imatrix"`, keys imatrix.datasets / chunk_count / chunk_size,
  and for each matrix two F32 tensors, `<name>.in_sum2` (ne0 x nmat: sums of squared activations)
  and `<name>.counts` (1 x nmat: how many activations were summed, per expert).
- legacy `.dat`: int32 entry count, then per entry int32 name length, name, int32 ncall, int32 nval,
  nval float32 values; optionally int32 chunk count and an int32-length-prefixed dataset name.

`llama-quantize` turns both into one vector per matrix: sums / count per expert (1 where an expert
was never used) for GGUF, values / ncall for the legacy format. `read_imatrix` does the same.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGUF_INTEGER_TYPES, GGMLType, GGUFValueType, Keys
from ggufsmith.errors import GGUFError, QuantizationError

IMATRIX_GENERAL_TYPE = "imatrix"
_SUMS_SUFFIX = ".in_sum2"
_COUNTS_SUFFIX = ".counts"


@dataclass
class ImportanceMatrix:
    """Normalized importance vectors, by weight name (e.g. "blk.0.attn_q.weight")."""

    entries: dict[str, np.ndarray]  # float32, nmat * row_length values
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False
    path: str | None = None  # as given, for the quantize.imatrix.file key

    def for_tensor(self, name: str, shape: Sequence[int]) -> np.ndarray | None:
        """The importance of tensor `name` (numpy shape, rows last) as (n_matrices, row_length),
        None when the file has none for it. A size mismatch is an error, as in llama-quantize,
        except for token_embd, which imatrix files often carry with another size."""
        values = self.entries.get(name)
        if values is None:
            return None
        row_length = int(shape[-1])
        n_matrices = int(shape[0]) if len(shape) == 3 else 1
        if values.size != row_length * n_matrices:
            if name == "token_embd.weight":
                return None
            raise QuantizationError(
                f"{name}: the importance matrix{f' {self.path}' if self.path else ''} has {values.size} values, "
                f"the tensor needs {row_length * n_matrices} ({n_matrices} x {row_length}); it was computed for another model"
            )
        return values.reshape(n_matrices, row_length)

    def select(self, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> ImportanceMatrix:
        """Keep the entries whose name contains one of `include` (all if none given), then drop those
        containing one of `exclude`, as llama-quantize's --include-weights / --exclude-weights."""
        include, exclude = list(include), list(exclude)
        if include and exclude:
            raise QuantizationError("--include-weights and --exclude-weights cannot be used together")
        kept = {
            name: values
            for name, values in self.entries.items()
            if (not include or any(part in name for part in include)) and not any(part in name for part in exclude)
        }
        return ImportanceMatrix(kept, self.datasets, self.chunk_count, self.chunk_size, self.is_legacy, self.path)


def read_imatrix(path: str | os.PathLike) -> ImportanceMatrix:
    """Read a GGUF or legacy .dat imatrix file, normalized as llama-quantize normalizes it."""
    with open(path, "rb") as f:
        magic = f.read(4)
    matrix = _read_gguf(Path(path)) if magic == b"GGUF" else _read_legacy(Path(path))
    matrix.path = os.fspath(path)
    return matrix


def _read_gguf(path: Path) -> ImportanceMatrix:
    from ggufsmith.gguf_writer.reader import GGUFReader

    with GGUFReader(path) as reader:
        md = reader.metadata
        if not all(k in md for k in (Keys.Imatrix.DATASETS, Keys.Imatrix.CHUNK_COUNT, Keys.Imatrix.CHUNK_SIZE)):
            raise QuantizationError(
                f"{path}: a GGUF file without imatrix.datasets/chunk_count/chunk_size is not an importance matrix "
                "(llama-quantize refuses it too)"
            )
        datasets = md[Keys.Imatrix.DATASETS]
        if datasets.type != GGUFValueType.ARRAY or datasets.element_type != GGUFValueType.STRING:
            raise QuantizationError(f"{path}: {Keys.Imatrix.DATASETS} must be an array of strings, not {datasets.type.name}")
        chunk_count, chunk_size = (_integer(path, md, key) for key in (Keys.Imatrix.CHUNK_COUNT, Keys.Imatrix.CHUNK_SIZE))
        pairs: dict[str, dict[str, np.ndarray]] = {}
        for t in reader.tensors:
            for suffix, part in ((_SUMS_SUFFIX, "sums"), (_COUNTS_SUFFIX, "counts")):
                if t.name.endswith(suffix):
                    if t.ggml_type != GGMLType.F32:
                        raise QuantizationError(f"{path}: tensor {t.name} is {t.ggml_type.name}; imatrix tensors must be F32")
                    pairs.setdefault(t.name[: -len(suffix)], {})[part] = np.array(t.values(), dtype=np.float32).reshape(-1)
        if not pairs:
            raise QuantizationError(f"{path}: the importance matrix has no entries")
        entries = {}
        for name, pair in sorted(pairs.items()):
            if len(pair) != 2:
                raise QuantizationError(f"{path}: {name} has {'sums' if 'sums' in pair else 'counts'} but not the other")
            entries[name] = _normalize_gguf(path, name, pair["sums"], pair["counts"])
        return ImportanceMatrix(
            entries, [_text(d) for d in datasets.value], chunk_count, chunk_size, is_legacy=False,
        )


def _integer(path: Path, md, key: str) -> int:
    item = md[key]
    if item.type not in GGUF_INTEGER_TYPES:
        raise QuantizationError(f"{path}: {key} must be an integer, not {item.type.name}")
    return int(item.value)


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _check_values(path: Path, name: str, values: np.ndarray, what: str) -> None:
    """Sums of squared activations (and their counts) are finite and never negative; anything else
    would turn into NaN or negative weights inside the quantizer's searches."""
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise QuantizationError(
            f"{path}: entry {name}: {what} {first} is {values[first]}; an importance matrix holds finite, "
            "non-negative values (the file is damaged)"
        )


def _normalize_gguf(path: Path, name: str, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    if counts.size == 0 or sums.size % counts.size:
        raise QuantizationError(f"{path}: entry {name}: {sums.size} sums cannot be split into {counts.size} matrices")
    _check_values(path, name, sums, "sum")
    _check_values(path, name, counts, "count")
    # llama.cpp rounds the stored float counts to integers, then divides in float32.
    counts = np.rint(counts.astype(np.float64)).astype(np.float32)
    per_matrix = sums.reshape(counts.size, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(counts[:, None] > 0, per_matrix / np.where(counts > 0, counts, 1)[:, None], np.float32(1))
    return values.astype(np.float32).reshape(-1)


def _read_legacy(path: Path) -> ImportanceMatrix:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise QuantizationError(f"{path}: truncated legacy imatrix file while reading {what} at byte {pos}")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values

    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise QuantizationError(f"{path}: not an importance matrix (neither GGUF nor a legacy .dat with entries)")
    entries: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        (length,) = take("<i", f"entry {i}'s name length")
        if length < 0:
            raise QuantizationError(f"{path}: entry {i} has a negative name length; not an imatrix file")
        name = take(f"<{length}s", f"entry {i}'s name")[0].split(b"\0")[0].decode("utf-8", "replace")
        ncall, nval = take("<ii", f"entry {i}'s counts")
        if nval < 1:
            raise QuantizationError(f"{path}: entry {name} has {nval} values")
        values = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32) if pos + 4 * nval <= len(data) else None
        if values is None:
            raise QuantizationError(f"{path}: truncated legacy imatrix file in entry {name}")
        pos += 4 * nval
        _check_values(path, name, values, "value")
        entries[name] = (values / np.float32(ncall)).astype(np.float32) if ncall > 0 else values
    chunk_count, datasets = 0, []
    if pos < len(data):
        if pos + 4 <= len(data):
            (chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(data):
            (length,) = take("<i", "the dataset name length")
            if length > 0 and pos + length <= len(data):
                datasets.append(take(f"<{length}s", "the dataset name")[0].split(b"\0")[0].decode("utf-8", "replace"))
    return ImportanceMatrix(entries, datasets, chunk_count, 0, is_legacy=True)


def write_imatrix(
    path: str | os.PathLike,
    entries: Mapping[str, tuple[np.ndarray, np.ndarray]],
    datasets: Sequence[str],
    chunk_count: int,
    chunk_size: int,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    force: bool = False,
) -> Path:
    """Write an importance matrix in llama.cpp's GGUF format, as `llama-imatrix` writes it.

    `entries` maps a weight name to (sums, counts): sums are the accumulated squared activations,
    float32 of nmat * row_length values (one row per expert for MoE tensors, else nmat = 1), counts
    float32 of nmat values (activations accumulated per matrix). Entries are written sorted by name.
    `inputs` and `force` are GGUFWriter's: the files `path` must not be, and whether an existing
    device or FIFO at `path` is written into.
    """
    from ggufsmith.gguf_writer import GGUFWriter, Metadata

    md = Metadata()
    md.add_string(Keys.General.TYPE, IMATRIX_GENERAL_TYPE)
    md.add_array(Keys.Imatrix.DATASETS, [str(d) for d in datasets], GGUFValueType.STRING)
    md.add_uint32(Keys.Imatrix.CHUNK_COUNT, int(chunk_count))
    md.add_uint32(Keys.Imatrix.CHUNK_SIZE, int(chunk_size))
    arrays = []
    for name in sorted(entries):
        sums, counts = entries[name]
        sums = np.ascontiguousarray(sums, dtype=np.float32).reshape(-1)
        counts = np.ascontiguousarray(counts, dtype=np.float32).reshape(-1)
        if counts.size == 0 or sums.size == 0 or sums.size % counts.size:
            raise GGUFError(f"imatrix entry {name}: {sums.size} sums do not split into {counts.size} matrices")
        arrays.append((name + _SUMS_SUFFIX, sums.reshape(counts.size, -1)))
        arrays.append((name + _COUNTS_SUFFIX, counts.reshape(counts.size, 1)))
    path = Path(path)
    with GGUFWriter(path, md, inputs=inputs, force=force) as writer:
        for tensor_name, array in arrays:
            writer.add_tensor(tensor_name, array.shape, GGMLType.F32)
        for tensor_name, array in arrays:
            writer.write_tensor(tensor_name, array)
    return path
