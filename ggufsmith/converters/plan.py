"""Deciding, before anything is written, each output tensor's GGUF type and size.

The rules follow llama.cpp so that its loader and kernels get what they expect:
- 1-D tensors (norms, biases), "*_norm.weight", tensors whose name does not end in ".weight", and
  the tensors llama.cpp always keeps F32 (MoE routers, position embeddings, conv kernels of SSMs,
  RWKV mixing weights, ...) stay F32, as convert_hf_to_gguf.py keeps them;
- every other tensor gets the requested output type;
- when a tensor's rows are not a whole number of the type's blocks, it falls back the way
  llama.cpp does: a k-quant to the 32-block type llama-quantize picks for it (Q2_K/Q3_K -> Q4_0,
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) and, when even 32 does not divide the rows, F16, as
  convert_hf_to_gguf.py does for Q8_0;
- a tensor the checkpoint stores already in a GGML type (gpt-oss' MXFP4 experts: an EncodedTensor,
  see readers/quantized.py) keeps that type whatever the output type, its bytes copied as they are,
  as llama.cpp's converter does; a float output type then labels the file by that format
  (general.file_type MOSTLY_MXFP4_MOE for f32/f16/bf16, as llama.cpp's converter does), and a
  preset treats the tensor as llama-quantize treats a tensor of that type in its input file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ggufsmith.arch.base import Architecture
import numpy as np

from ggufsmith.constants import GGML_TYPE_LAYOUT, FileType, GGMLType, Keys
from ggufsmith.readers.lazy_tensor import EncodedTensor, LazyTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.writer import tensor_data_size

# --outtype -> (tensor type of the weights, general.file_type) for the plain output types: every
# weight gets that type. f32/f16/bf16/q8_0 are what convert_hf_to_gguf.py writes for them.
# Every other name of llama-quantize's presets (q4_0, q2_k, q4_k_m, ...) means the preset: the file
# llama-quantize would make from the F32 conversion (see quantize_plan.apply_preset).
OUTTYPES: dict[str, tuple[GGMLType, FileType]] = {
    "f32": (GGMLType.F32, FileType.ALL_F32),
    "f16": (GGMLType.F16, FileType.MOSTLY_F16),
    "bf16": (GGMLType.BF16, FileType.MOSTLY_BF16),
    "q8_0": (GGMLType.Q8_0, FileType.MOSTLY_Q8_0),
    # llama.cpp has no file type for "all Q3_K/Q4_K/Q5_K" (q3_k..q5_k are no preset names); its _S
    # mixes are the closest (mostly that type), and the file type is only a label.
    "q3_k": (GGMLType.Q3_K, FileType.MOSTLY_Q3_K_S),
    "q4_k": (GGMLType.Q4_K, FileType.MOSTLY_Q4_K_S),
    "q5_k": (GGMLType.Q5_K, FileType.MOSTLY_Q5_K_S),
}


def preset_outtypes() -> list[str]:
    """The --outtype names that mean a llama-quantize preset."""
    from ggufsmith.quantize.presets import PRESETS

    return [name.lower() for name in PRESETS if name.lower() not in OUTTYPES]


def all_outtypes() -> list[str]:
    return list(OUTTYPES) + [AUTO_OUTTYPE] + preset_outtypes()


# --outtype auto: the 16-bit type the checkpoint's weights are stored in, decided as llama.cpp's
# converter decides it (its "auto" type): the first tensor of 2 or more dimensions, in reading
# order, stored as bfloat16 or float16 gives bf16 or f16; float32 tensors are passed over; a
# checkpoint with neither gives f16. config.json's torch_dtype is not used: finetunes misstate it.
AUTO_OUTTYPE = "auto"


def guess_outtype(tensors: dict[str, LazyTensor]) -> str:
    for tensor in tensors.values():
        if len(tensor.shape) < 2:
            continue
        if tensor.dtype == "BF16":
            return "bf16"
        if tensor.dtype == "F16":
            return "f16"
    return "f16"


# llama-quantize's replacement for a 256-block type whose blocks do not fit a tensor's rows.
_KQUANT_FALLBACK = {
    GGMLType.Q2_K: GGMLType.Q4_0,
    GGMLType.Q3_K: GGMLType.Q4_0,
    GGMLType.Q4_K: GGMLType.Q5_0,
    GGMLType.Q5_K: GGMLType.Q5_1,
    GGMLType.Q6_K: GGMLType.Q8_0,
}

# GGUF tensors llama.cpp's converter keeps F32 whatever the output type (its list of tensor kinds
# that "are always in float32"), as name patterns; plugins may add more with `f32_tensors`.
ALWAYS_F32 = tuple(
    re.compile(p)
    for p in (
        r"blk\.\d+\.ffn_gate_inp(_shexp)?\.weight",
        r"(v\.|a\.)?position_embd\.weight",
        r"token_types\.weight",
        r"blk\.\d+\.ssm_conv1d(_[qkv])?\.weight",
        r"blk\.\d+\.shortconv\.conv\.weight",
        r"blk\.\d+\.time_mix_(first|w1|w2|decay_w1|decay_w2|lerp_fused)\.weight",
        r"posnet\.\d+\.norm[12]\.weight",
        r"blk\.\d+\.altup_(correct|predict)_coef\.weight",
        r"blk\.\d+\.indexer\.proj\.weight",
    )
)


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # GGUF name
    sources: tuple[str, ...]  # HF tensor names it is made from
    shape: tuple[int, ...]  # numpy order (rows last), as in the checkpoint
    source_dtype: str
    ggml_type: GGMLType
    nbytes: int
    note: str  # why the type differs from the output type ("" when it does not)
    tensor: LazyTensor
    # llama.cpp's imatrix rows for this tensor, (n_matrices, row_length): one per expert of a 3-D tensor
    importance: np.ndarray | None = None


@dataclass
class ConversionPlan:
    architecture: Architecture | None  # None when requantizing a GGUF file
    outtype: str
    file_type: FileType
    metadata: Metadata
    tensors: list[PlannedTensor]
    output: Path | None = None  # the file written, once decided (a folder target is given a name)
    byteorder: str = "little"  # "big" for convert --bigendian (gguf_writer/writer.py swaps the numbers)
    # GGUF adapter files written beside `output` (a multi-task model's task LoRA adapters)
    adapter_files: list[Path] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def arch_name(self) -> str:
        return self.architecture.name if self.architecture is not None else str(self.metadata.get(Keys.General.ARCHITECTURE, "?"))

    @property
    def n_weights(self) -> int:
        return sum(int(np.prod(t.shape, dtype=np.int64)) for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.total_bytes / max(1, self.n_weights)

    def type_summary(self) -> str:
        """A table of the tensor types chosen (count, weights, bytes) and the file's bits per weight."""
        by_type: dict[GGMLType, list[int]] = {}
        for t in self.tensors:
            row = by_type.setdefault(t.ggml_type, [0, 0, 0])
            row[0] += 1
            row[1] += int(np.prod(t.shape, dtype=np.int64))
            row[2] += t.nbytes
        rows = [("type", "tensors", "weights", "MiB", "bpw")]
        for ggml_type, (count, weights, nbytes) in sorted(by_type.items(), key=lambda kv: -kv[1][2]):
            rows.append((ggml_type.name, str(count), str(weights), f"{nbytes / 2**20:.2f}", f"{8 * nbytes / max(1, weights):.2f}"))
        rows.append(("total", str(len(self.tensors)), str(self.n_weights), f"{self.total_bytes / 2**20:.2f}",
                     f"{self.bits_per_weight:.2f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows)

    @property
    def fallbacks(self) -> list[PlannedTensor]:
        return [t for t in self.tensors if t.note.startswith("fallback")]

    def describe(self) -> str:
        """The plan as a table: source name(s), GGUF name, shape, type, bytes, note."""
        rows = [("source", "gguf name", "shape", "type", "bytes", "note")]
        for t in self.tensors:
            if not t.sources:
                source = "(computed from config)"
            else:
                source = t.sources[0] if len(t.sources) == 1 else f"{t.sources[0]} (+{len(t.sources) - 1})"
            rows.append((source, t.name, "x".join(map(str, t.shape)), t.ggml_type.name, str(t.nbytes), t.note))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [
            "  ".join(cell.ljust(w) if i != 4 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r[:5], widths))) + (f"  {r[5]}" if r[5] else "")
            for r in rows
        ]
        lines.append(
            f"{len(self.tensors)} tensors, {self.total_bytes} bytes of tensor data, "
            f"architecture {self.arch_name}, outtype {self.outtype}, {len(self.metadata)} metadata keys"
            + (f", {len(self.fallbacks)} fallback(s)" if self.fallbacks else "")
        )
        return "\n".join(line.rstrip() for line in lines)


def outtype_of(name: str) -> tuple[GGMLType, FileType]:
    """The weight type and file type of a plain --outtype (a preset's are decided per tensor)."""
    try:
        return OUTTYPES[name.lower()]
    except KeyError:
        raise ConversionError(f"unknown output type {name!r}; choose one of: {', '.join(all_outtypes())}") from None


def is_preset_outtype(name: str) -> bool:
    return name.lower() in preset_outtypes()


def choose_type(name: str, shape: tuple[int, ...], target: GGMLType, plugin: Architecture) -> tuple[GGMLType, str]:
    """The GGUF type of one output tensor and, when it is not `target`, why."""
    if len(shape) <= 1:
        return GGMLType.F32, "" if target == GGMLType.F32 else "1-D: kept F32"
    if name.endswith("_norm.weight"):
        return GGMLType.F32, "" if target == GGMLType.F32 else "norm: kept F32"
    if plugin.keep_f32(name) or any(p.fullmatch(name) for p in ALWAYS_F32) or not name.endswith(".weight"):
        return GGMLType.F32, "" if target == GGMLType.F32 else "kept F32 as llama.cpp expects"
    row_length = shape[-1]
    chosen = target
    if row_length % GGML_TYPE_LAYOUT[chosen].block_size:
        chosen = _KQUANT_FALLBACK.get(chosen, GGMLType.F16)
        if row_length % GGML_TYPE_LAYOUT[chosen].block_size:
            chosen = GGMLType.F16
        block = GGML_TYPE_LAYOUT[target].block_size
        return chosen, f"fallback {target.name} -> {chosen.name}: rows of {row_length} are not a multiple of {block}"
    return chosen, ""


def plan_tensor(name: str, sources: tuple[str, ...], tensor: LazyTensor, target: GGMLType, plugin: Architecture) -> PlannedTensor:
    if not 1 <= len(tensor.shape) <= 4:
        raise ConversionError(f"{name} ({tensor.source}): {len(tensor.shape)} dimensions; GGUF allows 1 to 4")
    if is_stored_encoded(tensor):
        ggml_type = tensor.stored_type  # fixed by the checkpoint: copied, never encoded again
        note = "" if ggml_type == target else f"stored {ggml_type.name} in the checkpoint: kept"
    else:
        ggml_type, note = choose_type(name, tensor.shape, target, plugin)
    nbytes = tensor_data_size(name, tensor.shape, ggml_type)
    return PlannedTensor(name, sources, tensor.shape, tensor.dtype, ggml_type, nbytes, note, tensor)


def is_stored_encoded(tensor: LazyTensor) -> bool:
    """A checkpoint tensor whose bytes are already in a GGML type (not a float the converter encodes)."""
    return isinstance(tensor, EncodedTensor) and tensor.stored_type not in _FLOAT_TYPES


_FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
# The file type llama.cpp's converter writes for a float output type when the checkpoint stores
# some tensors in one of these types (they keep it; see the module docstring).
_STORED_FILE_TYPES = {GGMLType.MXFP4: FileType.MOSTLY_MXFP4_MOE}


def file_type_with_stored(file_type: FileType, planned: list[PlannedTensor]) -> FileType:
    """general.file_type of a plain conversion: `file_type`, but a float conversion of a checkpoint
    with tensors kept in their stored quantized type is labelled by that type."""
    if file_type not in (FileType.ALL_F32, FileType.MOSTLY_F16, FileType.MOSTLY_BF16):
        return file_type
    stored = [t.ggml_type for t in planned if is_stored_encoded(t.tensor) and t.ggml_type in _STORED_FILE_TYPES]
    return _STORED_FILE_TYPES[stored[0]] if stored else file_type


# -- big-endian files (convert --bigendian) ----------------------------------------------------
# A big-endian ggml reads every number of a file in its own byte order, quantized blocks included
# (their f16 scales). llama.cpp's converter swaps only the tensors it holds as arrays of numbers
# (F32, F16) and leaves quantized blocks (and BF16) as they are: little-endian data that a
# big-endian ggml misreads. ggufsmith writes F32, F16 and BF16 swapped and refuses the rest.
_BIG_ENDIAN_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_BIG_ENDIAN_ONLY = ("a big-endian file holds F32, F16 and BF16 tensors only (ggml would misread the scales of "
                    "quantized blocks, which llama.cpp's converter leaves little-endian)")


def refuse_quantized_big_endian(outtype: str) -> None:
    """Before any work: convert --bigendian with a quantized outtype."""
    if outtype.lower() not in ("f32", "f16", "bf16", AUTO_OUTTYPE):
        raise ConversionError(f"--bigendian with --outtype {outtype}: {_BIG_ENDIAN_ONLY}; "
                              "give --outtype f32, f16, bf16 or auto")


def big_endian_plan(plan: ConversionPlan) -> None:
    """Make `plan` write a big-endian file; a tensor that would be quantized (gpt-oss' MXFP4 experts
    kept as they are, a quantize preset) is refused."""
    for t in plan.tensors:
        if t.ggml_type not in _BIG_ENDIAN_TYPES:
            raise ConversionError(f"--bigendian: tensor {t.name} would be {t.ggml_type.name}; {_BIG_ENDIAN_ONLY}")
    plan.byteorder = "big"
