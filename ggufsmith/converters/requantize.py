"""GGUF -> GGUF with a llama-quantize preset: `ggufsmith quantize IN.gguf OUT.gguf Q4_K_M`.

The input's tensors become a plan in their stored types; quantize_plan.apply_preset turns it into
llama-quantize's output plan, and the conversion pipeline's writer executes it (tensors whose type
does not change are copied byte for byte, the others dequantized and quantized in slices of rows).
"""

from __future__ import annotations

from pathlib import Path

from ggufsmith.constants import Keys
from ggufsmith.readers.gguf_source import GGUFModel, open_gguf_model, split_paths
from ggufsmith.converters.fanout import write_plans
from ggufsmith.converters.general_metadata import apply_metadata_overrides, count_parameters, read_metadata_overrides
from ggufsmith.converters.workers import resolve_workers
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor, big_endian_plan
from ggufsmith.converters.quantize_plan import QuantizeRequest, apply_preset
from ggufsmith.converters.split import SplitRule, part_plans, split_plan
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
    split: SplitRule | None = None,
    force: bool = False,
    threads: int | None = None,
    metadata: str | Path | None = None,
    bigendian: bool = False,
) -> ConversionPlan:
    """Write what llama-quantize writes for `src` with `request` (a preset name or all options) to `dst`.

    Returns the plan. `threads`: workers (default: every core this process may use; the file is
    the same for any number). `dst` appears only once complete; with `dry_run` nothing is written.
    `dst` may not be an input (a part of `src`, the importance matrix), nor a directory, device or
    FIFO unless `force` (see gguf_writer/output.py). `keep_split`: one output file per part of a
    split input (llama-quantize --keep-split); `split`: the output cut into parts by that rule
    (converters/split.py). The parts appear together, once all are complete. `metadata`: a JSON file
    of general.* keys that replace the input's (llama.cpp's --metadata, as `convert --metadata`).
    `bigendian`: a big-endian output, for the F32, F16 and BF16 presets only (plan.big_endian_plan)."""
    resolve_workers(threads)  # reject a bad count before reading anything
    if split is not None and split.active and keep_split:
        raise ConversionError("--keep-split keeps the input's parts; it cannot be combined with "
                              "--split-max-size or --split-max-tensors")
    if isinstance(request, str):
        request = QuantizeRequest(request)
    src, dst = Path(src), Path(dst)
    inputs = [src] + ([Path(request.imatrix.path)] if request.imatrix is not None and request.imatrix.path else [])
    overrides = None
    if metadata is not None:
        overrides = read_metadata_overrides(metadata)  # a bad file fails before anything is read
        inputs.append(Path(metadata))
    check_target(dst, inputs, force=force)  # before reading anything
    with open_gguf_model(src) as model:
        keep_split = keep_split and model.n_splits > 1  # as llama-quantize: one part in, one file out
        if model.n_splits > 1:
            inputs += split_paths(src, model.n_splits)
        if Keys.General.ARCHITECTURE not in model.metadata:
            raise ConversionError(f"{src}: no general.architecture key; only model files can be quantized")
        plan = apply_preset(stored_plan(model), request, keep_order=keep_split)
        if overrides is not None:
            params = count_parameters([(t.name, t.shape) for t in plan.tensors])
            apply_metadata_overrides(plan.metadata, overrides, params.total)
        if bigendian:
            big_endian_plan(plan)
        _check_decodable(src, plan)
        if keep_split:
            parts = part_plans(plan, dst, [[t for t in plan.tensors if t.tensor.split_index == index]
                                           for index in range(model.n_splits)])
        else:
            parts = split_plan(plan, dst, split or SplitRule())
        for path, _ in parts:
            check_target(path, inputs, force=force)  # every part before anything is written
        if not dry_run:
            write_plans([(part, path) for path, part in parts], progress=progress, inputs=inputs, force=force,
                        threads=threads)
    return plan


def stored_plan(model: GGUFModel) -> ConversionPlan:
    """The model as it is: every tensor in its stored type, in the order of the parts, bytes copied."""
    planned = [
        PlannedTensor(name, (t.source,), t.shape, t.dtype, t.stored_type, tensor_data_size(name, t.shape, t.stored_type), "", t)
        for name, t in model.tensors.items()
    ]
    return ConversionPlan(None, "input", int(model.metadata.get(Keys.General.FILE_TYPE, 0)), model.metadata, planned)


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
