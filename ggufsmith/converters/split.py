"""A model written as several GGUF files, NAME-00001-of-0000n.gguf ..., as llama.cpp splits them.

llama.cpp's loader, given the first file, reads the others by name. What every part holds, as
llama-gguf-split (tools/gguf-split) and gguf-py's split writer make them:

- the first part has all the model's metadata; every part, the first included, ends its metadata
  with split.no (UINT16, 0-based), split.count (UINT16) and split.tensors.count (INT32, the
  tensors of the whole model); the other parts have those three keys only. gguf-py (and so
  convert_hf_to_gguf.py, and llama-quantize --keep-split) write them in that order; llama-gguf-split
  writes split.count last (it sets it once it knows the number of parts), and `ggufsmith split`
  does the same, to write its bytes;
- tensors keep the model's order and are cut into consecutive runs: a new part starts when the
  current one already has `max_tensors` tensors, or when the next tensor's data, padded to the
  alignment, would take the part's tensor data beyond `max_size` bytes (metadata is not counted,
  as llama-gguf-split counts). A part always gets at least one tensor, so a tensor larger than
  `max_size` is alone in its part.

Sizes are given as llama.cpp's tools take them: a number of bytes, or N with K, M or G (powers of
1000, as convert_hf_to_gguf.py reads --split-max-size).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from ggufsmith.constants import GGUF_DEFAULT_ALIGNMENT, GGUFValueType, Keys
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.encoding import align_offset
from ggufsmith.gguf_writer.metadata import Metadata

SPLIT_KEYS = (Keys.Split.NO, Keys.Split.COUNT, Keys.Split.TENSORS_COUNT)
_SIZE = re.compile(r"^(\d+)([KMG]?)$")
_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3}
MAX_PARTS = 99999  # the name has five digits for the part count


def parse_split_size(text: str) -> int:
    """'4G' -> 4_000_000_000; raises ConversionError naming the option."""
    m = _SIZE.match(text.strip().upper())
    if not m or int(m.group(1)) <= 0:
        raise ConversionError(f"--split-max-size {text!r}: expected a positive number of bytes, optionally followed by "
                              "K, M or G (powers of 1000), e.g. 4G")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class SplitRule:
    """Where a model is cut into parts: at most `max_size` bytes of tensor data and `max_tensors`
    tensors per part (0: no limit)."""

    max_size: int = 0
    max_tensors: int = 0

    def __post_init__(self) -> None:
        if self.max_size < 0 or self.max_tensors < 0:
            raise ConversionError("--split-max-size and --split-max-tensors must be positive")

    @property
    def active(self) -> bool:
        return bool(self.max_size or self.max_tensors)

    def groups(self, sizes: list[int]) -> list[list[int]]:
        """The indices of the tensors of each part, from the tensors' padded data sizes."""
        parts: list[list[int]] = [[]]
        part_bytes = 0
        for index, size in enumerate(sizes):
            current = parts[-1]
            if current and ((self.max_tensors and len(current) >= self.max_tensors)
                            or (self.max_size and part_bytes + size > self.max_size)):
                parts.append([])
                part_bytes = 0
            parts[-1].append(index)
            part_bytes += size
        return parts


def part_paths(dst: str | Path, count: int) -> list[Path]:
    """DST-00001-of-0000n.gguf ... (DST without its .gguf), as llama_split_path names them."""
    text = str(dst)
    prefix = text[: -len(".gguf")] if text.endswith(".gguf") else text
    return [Path(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def without_split_keys(metadata: Metadata) -> Metadata:
    """A copy of `metadata` without split.*: the keys of the model, not of one of its files."""
    copy = Metadata()
    for key, value in metadata.items():
        if key not in SPLIT_KEYS:
            copy.add_read_value(key, value)
    return copy


def split_plan(plan: ConversionPlan, dst: str | Path, rule: SplitRule, *, like_llama_gguf_split: bool = False,
               metadata_only_first_part: bool = False) -> list[tuple[Path, ConversionPlan]]:
    """The files of `plan` cut by `rule`: [(path, plan of that part)]. A model that fits one part
    is written to `dst` as one file without split keys (as convert_hf_to_gguf.py does), unless
    `like_llama_gguf_split`: then always named parts (DST-00001-of-00001.gguf, with the keys), the
    keys in llama-gguf-split's order. `metadata_only_first_part` (llama-gguf-split
    --no-tensor-first-split): a first part with the metadata and no tensor, before the others
    (its metadata can then be edited without rewriting any tensor)."""
    alignment = int(plan.metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT))
    groups = rule.groups([align_offset(t.nbytes, alignment) for t in plan.tensors])
    if metadata_only_first_part:
        groups.insert(0, [])
    if len(groups) == 1 and not like_llama_gguf_split:
        return [(Path(dst), plan)]
    return part_plans(plan, dst, [[plan.tensors[i] for i in group] for group in groups],
                      count_last=like_llama_gguf_split)


def part_plans(plan: ConversionPlan, dst: str | Path, parts: list[list[PlannedTensor]], *,
               count_last: bool = False) -> list[tuple[Path, ConversionPlan]]:
    """One plan per part, with the split.* keys (see the module docstring), and its path.
    `count_last`: split.count after split.tensors.count, as llama-gguf-split orders them."""
    if len(parts) > MAX_PARTS:
        raise ConversionError(f"{dst}: the split would have {len(parts)} parts; llama.cpp names at most {MAX_PARTS}: "
                              "raise --split-max-size or --split-max-tensors")
    n_tensors = sum(len(tensors) for tensors in parts)
    model_keys = without_split_keys(plan.metadata)
    jobs = []
    for index, (path, tensors) in enumerate(zip(part_paths(dst, len(parts)), parts)):
        metadata = model_keys if index == 0 else Metadata()
        metadata.add(Keys.Split.NO, index, GGUFValueType.UINT16)
        if not count_last:
            metadata.add(Keys.Split.COUNT, len(parts), GGUFValueType.UINT16)
        metadata.add(Keys.Split.TENSORS_COUNT, n_tensors, GGUFValueType.INT32)
        if count_last:
            metadata.add(Keys.Split.COUNT, len(parts), GGUFValueType.UINT16)
        jobs.append((path, dataclasses.replace(plan, metadata=metadata, tensors=tensors)))
    return jobs
