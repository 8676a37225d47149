"""GGUF -> GGUF with a llama-quantize preset: `ggufsmith quantize IN.gguf OUT.gguf Q4_K_M`.

The input's tensors become a plan in their stored types; quantize_plan.apply_preset turns it into
llama-quantize's output plan, and the conversion pipeline's writer executes it (tensors whose type
does not change are copied byte for byte, the others dequantized and quantized in slices of rows).
"""

from __future__ import annotations

from pathlib import Path

from ggufsmith.constants import Keys
from ggufsmith.converters.gguf_source import open_gguf_model
from ggufsmith.converters.pipeline import write_plan
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor
from ggufsmith.converters.quantize_plan import QuantizeRequest, apply_preset
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.writer import tensor_data_size


def quantize_gguf(
    src: str | Path,
    dst: str | Path,
    request: QuantizeRequest | str,
    *,
    dry_run: bool = False,
    progress: bool = False,
    keep_split: bool = False,
) -> ConversionPlan:
    """Write what llama-quantize writes for `src` with `request` (a preset name or all options) to `dst`.

    Returns the plan. `dst` appears only once complete; with `dry_run` nothing is written."""
    if isinstance(request, str):
        request = QuantizeRequest(request)
    src, dst = Path(src), Path(dst)
    if dst.is_dir():
        raise ConversionError(f"{dst} is a directory; give the path of the .gguf file to write")
    if src.resolve() == dst.resolve() and not dry_run:
        raise ConversionError(f"{dst}: the output would overwrite the input; choose another file name")
    with open_gguf_model(src) as model:
        if keep_split and model.n_splits > 1:
            raise ConversionError(
                f"{src}: --keep-split (one output file per input part) is not implemented yet; "
                "leave it out to write the whole model into one file"
            )
        if Keys.General.ARCHITECTURE not in model.metadata:
            raise ConversionError(f"{src}: no general.architecture key; only model files can be quantized")
        planned = [
            PlannedTensor(name, (), t.shape, t.dtype, t.stored_type, tensor_data_size(name, t.shape, t.stored_type), "", t)
            for name, t in model.tensors.items()
        ]
        source = ConversionPlan(None, "input", int(model.metadata.get(Keys.General.FILE_TYPE, 0)), model.metadata, planned)
        plan = apply_preset(source, request)
        if not dry_run:
            write_plan(plan, dst, progress=progress)
    return plan
