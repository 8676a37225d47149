"""Turning a plan into llama-quantize's result for a preset (Q4_K_M, Q3_K_S, ...).

One function, `apply_preset`, serves both entry points: `ggufsmith quantize` (a plan whose tensors
come from a GGUF file, in their stored types) and `ggufsmith convert --outtype PRESET` (the plan
of the F32 conversion, whose tensors come straight from the checkpoint). It does what
llama.cpp's quantizer does to its input file, so that the result is the same file:
- tensors in llama.cpp's order (by block number, then by name);
- each tensor's type from the preset's rules (presets.TypeChooser), with the importance matrix
  rows that belong to it;
- metadata: every key of the input in its order, then general.quantization_version and
  general.file_type set, split.* removed, then the --override-kv keys and the quantize.imatrix.*
  keys. Setting a key in llama.cpp removes it and appends it at the end; `set_key` does the same.
- with --prune-layers, the pruned blocks left out and the others renumbered (prune_layers.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ggufsmith.constants import GGML_QUANTIZATION_VERSION, GGMLType, GGUFValueType, Keys, arch_key
from ggufsmith.converters.plan import ConversionPlan
from ggufsmith.converters.prune_layers import LayerPruning
from ggufsmith.errors import QuantizationError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.quantize.imatrix import ImportanceMatrix
from ggufsmith.quantize.presets import (
    ModelFacts,
    QuantizeOptions,
    TypeChooser,
    get_preset,
    is_block_quantized,
    llama_tensor_order,
    requires_importance,
)
from ggufsmith.quantize.registry import get_format

# Keys llama-quantize writes to record the importance matrix it used.
IMATRIX_FILE_KEY = "quantize.imatrix.file"
IMATRIX_DATASET_KEY = "quantize.imatrix.dataset"
IMATRIX_ENTRIES_KEY = "quantize.imatrix.entries_count"
IMATRIX_CHUNKS_KEY = "quantize.imatrix.chunks_count"

_OVERRIDE_TYPES = {"int": GGUFValueType.UINT32, "float": GGUFValueType.FLOAT32, "bool": GGUFValueType.BOOL,
                   "str": GGUFValueType.STRING}


@dataclass
class QuantizeRequest:
    """Everything llama-quantize's command line can ask for, as one value."""

    preset: str
    pure: bool = False
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    leave_output_tensor: bool = False
    tensor_types: list[tuple[str, GGMLType]] = field(default_factory=list)
    kv_overrides: list[tuple[str, GGUFValueType, Any]] = field(default_factory=list)
    imatrix: ImportanceMatrix | None = None
    allow_requantize: bool = False
    prune_layers: list[int] = field(default_factory=list)  # block numbers to leave out (--prune-layers)

    def options(self) -> QuantizeOptions:
        return QuantizeOptions(
            get_preset(self.preset), pure=self.pure, output_tensor_type=self.output_tensor_type,
            token_embedding_type=self.token_embedding_type, leave_output_tensor=self.leave_output_tensor,
            tensor_types=list(self.tensor_types), has_imatrix=bool(self.imatrix and self.imatrix.entries),
        )


def parse_kv_override(text: str) -> tuple[str, GGUFValueType, Any]:
    """KEY=TYPE:VALUE with TYPE int, float, bool or str, as llama.cpp's --override-kv.

    As in llama-quantize, an int is written as uint32 of its absolute value (llama.cpp PR 14182:
    the hyperparameters it overrides are unsigned)."""
    key, sep, rest = text.partition("=")
    kind, colon, value = rest.partition(":")
    if not sep or not key or len(key) >= 128 or not colon or kind not in _OVERRIDE_TYPES:
        raise QuantizationError(f"--override-kv {text!r}: expected KEY=TYPE:VALUE with TYPE int, float, bool or str")
    vtype = _OVERRIDE_TYPES[kind]
    try:
        if kind == "int":
            parsed: Any = abs(int(value)) & 0xFFFFFFFF
        elif kind == "float":
            parsed = float(value)
        elif kind == "bool":
            if value not in ("true", "false"):
                raise ValueError
            parsed = value == "true"
        else:
            if len(value) > 127:
                raise QuantizationError(f"--override-kv {key}: a string value may have at most 127 characters (llama.cpp's limit)")
            parsed = value
    except ValueError:
        raise QuantizationError(f"--override-kv {text!r}: {value!r} is not a valid {kind}") from None
    return key, vtype, parsed


def set_key(metadata: Metadata, key: str, value: Any, vtype: GGUFValueType) -> None:
    """Set `key` the way gguf_set_val_* does: an existing key is removed and the key appended."""
    if key in metadata:
        metadata.remove(key)
    metadata.add(key, value, vtype)


def model_facts(metadata: Metadata) -> ModelFacts:
    """What the type rules need to know about the model, from its {arch}.* keys."""
    arch = str(metadata.get(Keys.General.ARCHITECTURE, ""))

    def first(key: str, default: int) -> int:
        value = metadata.get(arch_key(key, arch), default)
        if isinstance(value, list):  # per-layer arrays: llama.cpp's n_gqa() looks at layer 0
            value = value[0] if value else default
        return int(value)

    n_head = first(Keys.Attention.HEAD_COUNT, 0)
    return ModelFacts(
        arch, first(Keys.LLM.BLOCK_COUNT, 0), n_head, first(Keys.Attention.HEAD_COUNT_KV, n_head),
        first(Keys.LLM.EXPERT_COUNT, 0),
    )


def apply_preset(plan: ConversionPlan, request: QuantizeRequest, *, keep_order: bool = False) -> ConversionPlan:
    """The plan of llama-quantize's output for `plan`'s file (each planned type = the type the
    input tensor has). Raises QuantizationError where llama-quantize refuses. With `keep_order`
    the tensors stay in the input's order (llama-quantize --keep-split: by part, then by offset)."""
    options = request.options()
    preset = options.preset
    imatrix = request.imatrix if options.has_imatrix else None
    metadata = quantized_metadata(plan.metadata, preset.file_type, request)
    # llama.cpp's loader sees the --override-kv values too (e.g. a block count) when it sizes the
    # model; it loads the input, so the rules see the block count from before any pruning
    facts = model_facts(metadata)
    original_name = {t.name: t.name for t in plan.tensors}  # output name -> input name
    if request.prune_layers:
        pruning = LayerPruning(request.prune_layers, facts.n_layer)
        renamed = ((pruning.rename(t.name), t.name) for t in plan.tensors)
        original_name = {new: old for new, old in renamed if new is not None}
        pruning.apply_to_metadata(metadata, facts.arch)
    by_name = {t.name: t for t in plan.tensors}
    order = list(original_name) if keep_order else llama_tensor_order(original_name)
    chooser = TypeChooser(options, facts, order)
    tensors = []
    for name in order:
        t = by_name[original_name[name]]
        fallbacks = chooser.n_fallback
        new_type = chooser.choose(name, t.shape, t.ggml_type)
        if chooser.n_fallback > fallbacks:
            note = f"fallback to {new_type.name}: rows of {t.shape[-1]} do not fit the blocks of the type chosen"
        elif new_type in (preset.default_type, t.ggml_type):
            note = ""
        else:
            note = f"{preset.name} rule"
        importance = None
        if new_type != t.ggml_type:
            if is_block_quantized(t.ggml_type) and not request.allow_requantize:
                raise QuantizationError(
                    f"tensor {name} is already {t.ggml_type.name}; quantizing it again to {new_type.name} loses "
                    "precision. Pass --allow-requantize to do it anyway, or start from an F32/F16/BF16 file"
                )
            if imatrix is not None:
                importance = imatrix.for_tensor(t.name, t.shape)
            if importance is None and requires_importance(name, new_type, preset):
                raise QuantizationError(
                    f"tensor {name}: {preset.name} makes it {new_type.name}, which needs an importance matrix "
                    f"(--imatrix FILE{'' if imatrix is None else ' with an entry for this tensor'}); without one the result is garbage"
                )
            if importance is not None and not get_format(new_type).supports_importance:
                importance = None
        tensors.append(dataclasses.replace(t, name=name, ggml_type=new_type, nbytes=_nbytes(t.shape, new_type), note=note,
                                           importance=importance))
    return ConversionPlan(plan.architecture, preset.name.lower(), preset.file_type, metadata, tensors)


def quantized_metadata(source: Metadata, file_type: int, request: QuantizeRequest) -> Metadata:
    """The input's metadata as llama-quantize rewrites it (see the module docstring)."""
    metadata = Metadata()
    for key, value in source.items():
        metadata.add_read_value(key, value)
    set_key(metadata, Keys.General.QUANTIZATION_VERSION, GGML_QUANTIZATION_VERSION, GGUFValueType.UINT32)
    set_key(metadata, Keys.General.FILE_TYPE, int(file_type), GGUFValueType.UINT32)
    for key in (Keys.Split.NO, Keys.Split.COUNT, Keys.Split.TENSORS_COUNT):
        if key in metadata:
            metadata.remove(key)
    for key, vtype, value in request.kv_overrides + imatrix_overrides(request):
        set_key(metadata, key, value, vtype)
    return metadata


def imatrix_overrides(request: QuantizeRequest) -> list[tuple[str, GGUFValueType, Any]]:
    """The quantize.imatrix.* keys llama-quantize adds when it uses an importance matrix."""
    im = request.imatrix
    if im is None or not im.entries:
        return []
    keys = [(IMATRIX_FILE_KEY, GGUFValueType.STRING, str(im.path or "")[:127])]
    if im.datasets:
        keys.append((IMATRIX_DATASET_KEY, GGUFValueType.STRING, im.datasets[0][:127]))
    keys.append((IMATRIX_ENTRIES_KEY, GGUFValueType.UINT32, len(im.entries)))
    if im.chunk_count > 0:
        keys.append((IMATRIX_CHUNKS_KEY, GGUFValueType.UINT32, im.chunk_count))
    return keys


def _nbytes(shape: tuple[int, ...], ggml_type: GGMLType) -> int:
    from ggufsmith.gguf_writer.writer import tensor_data_size

    return tensor_data_size("", shape, ggml_type)


def split_importance_rows(importance: np.ndarray | None, first_row: int, n_rows: int, rows_per_matrix: int):
    """(start, stop, importance vector) for runs of rows [first_row, first_row + n_rows) that belong
    to the same matrix (one expert of a 3-D MoE tensor has its own importance vector)."""
    if importance is None:
        yield 0, n_rows, None
        return
    start = 0
    while start < n_rows:
        matrix = (first_row + start) // rows_per_matrix
        stop = min(n_rows, (matrix + 1) * rows_per_matrix - first_row)
        yield start, stop, importance[matrix]
        start = stop
