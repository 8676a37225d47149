"""GGUF -> GGUF with a llama-quantize preset: `ggufsmith quantize IN.gguf OUT.gguf Q4_K_M`.

The input's tensors become a plan in their stored types; quantize_plan.apply_preset turns it into
llama-quantize's output plan, and the conversion pipeline's writer executes it (tensors whose type
does not change are copied byte for byte, the others dequantized and quantized in slices of rows).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.readers.gguf_source import open_gguf_model, split_paths
from ggufsmith.converters.pipeline import write_plan
from ggufsmith.converters.workers import resolve_workers
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor
from ggufsmith.converters.quantize_plan import QuantizeRequest, apply_preset, set_key
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.output import check_target
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.writer import tensor_data_size
from ggufsmith.quantize.registry import supported_types


def quantize_gguf(
    src: str | Path,
    dst: str | Path,
    request: QuantizeRequest | str,
    *,
    dry_run: bool = False,
    progress: bool = False,
    keep_split: bool = False,
    force: bool = False,
    threads: int | None = None,
) -> ConversionPlan:
    """Write what llama-quantize writes for `src` with `request` (a preset name or all options) to `dst`.

    Returns the plan. `threads`: workers (default: every core this process may use; the file is
    the same for any number). `dst` appears only once complete; with `dry_run` nothing is written.
    `dst` may not be an input (a part of `src`, the importance matrix), nor a directory, device or
    FIFO unless `force` (see gguf_writer/output.py)."""
    resolve_workers(threads)  # reject a bad count before reading anything
    if isinstance(request, str):
        request = QuantizeRequest(request)
    src, dst = Path(src), Path(dst)
    inputs = [src] + ([Path(request.imatrix.path)] if request.imatrix is not None and request.imatrix.path else [])
    check_target(dst, inputs, force=force)  # before reading anything
    with open_gguf_model(src) as model:
        keep_split = keep_split and model.n_splits > 1  # as llama-quantize: one part in, one file out
        if model.n_splits > 1:
            inputs += split_paths(src, model.n_splits)
        if Keys.General.ARCHITECTURE not in model.metadata:
            raise ConversionError(f"{src}: no general.architecture key; only model files can be quantized")
        planned = [
            PlannedTensor(name, (t.source,), t.shape, t.dtype, t.stored_type, tensor_data_size(name, t.shape, t.stored_type), "", t)
            for name, t in model.tensors.items()
        ]
        source = ConversionPlan(None, "input", int(model.metadata.get(Keys.General.FILE_TYPE, 0)), model.metadata, planned)
        plan = apply_preset(source, request, keep_order=keep_split)
        _check_decodable(src, plan)
        if not dry_run:
            if keep_split:
                parts = split_plans(plan, dst, model.n_splits)
                for path, _ in parts:
                    check_target(path, inputs, force=force)  # every part before writing the first
                for path, part in parts:
                    write_plan(part, path, progress=progress, inputs=inputs, force=force, threads=threads)
            else:
                write_plan(plan, dst, progress=progress, inputs=inputs, force=force, threads=threads)
    return plan


def _check_decodable(src: Path, plan: ConversionPlan) -> None:
    """Before anything is written: every tensor whose type changes is stored in a type we can decode."""
    decodable = set(supported_types())
    for t in plan.tensors:
        stored = t.tensor.stored_type
        if t.ggml_type != stored and stored not in decodable:
            raise ConversionError(
                f"{src}: tensor {t.name} is stored as {stored.name}, which ggufsmith cannot decode to requantize it to "
                f"{t.ggml_type.name}; start from the F16/F32 file (or use llama-quantize)"
            )


def split_plans(plan: ConversionPlan, dst: Path, n_splits: int) -> list[tuple[Path, ConversionPlan]]:
    """llama-quantize --keep-split's files: part i holds the tensors of input part i, named
    DST-0000i-of-0000n.gguf (DST without .gguf); the first part has all metadata, the others only
    the split.* keys, which every part gets at the end."""
    prefix = str(dst)[: -len(".gguf")] if str(dst).endswith(".gguf") else str(dst)
    parts = []
    for index in range(n_splits):
        metadata = plan.metadata if index == 0 else Metadata()
        metadata = _copy(metadata)
        set_key(metadata, Keys.Split.NO, index, GGUFValueType.UINT16)
        set_key(metadata, Keys.Split.COUNT, n_splits, GGUFValueType.UINT16)
        set_key(metadata, Keys.Split.TENSORS_COUNT, len(plan.tensors), GGUFValueType.INT32)
        tensors = [t for t in plan.tensors if t.tensor.split_index == index]
        path = Path(f"{prefix}-{index + 1:05d}-of-{n_splits:05d}.gguf")
        parts.append((path, dataclasses.replace(plan, metadata=metadata, tensors=tensors)))
    return parts


def _copy(metadata: Metadata) -> Metadata:
    copy = Metadata()
    for key, value in metadata.items():
        copy.add_read_value(key, value)
    return copy
