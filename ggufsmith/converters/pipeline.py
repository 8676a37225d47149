"""Checkpoint folder -> GGUF file: read, pick the plugin, plan, transform, quantize, stream.

Memory stays bounded whatever the model size: tensors are read one at a time from memory maps,
large ones in slices of rows, and at most LOOKAHEAD_BYTES of output are converted ahead of the
one being written. Conversion runs in a small thread pool (numpy releases the GIL in its kernels),
writing in the calling thread, so two cores are busy. The output appears only when complete:
the writer renames its temporary file at the end and deletes it on any error or Ctrl-C.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain, groupby
from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture
from ggufsmith.arch.registry import find_architecture, get_architecture
from ggufsmith.constants import GGML_QUANTIZATION_VERSION, GGUF_DEFAULT_ALIGNMENT, GGMLType, Keys
from ggufsmith.readers.checkpoint import Checkpoint, open_checkpoint
from ggufsmith.converters.general_metadata import count_parameters, general_metadata
from ggufsmith.readers.gguf_source import GGUFTensor
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor, is_preset_outtype, outtype_of, plan_tensor
from ggufsmith.converters.quantize_plan import QuantizeRequest, apply_preset, split_importance_rows
from ggufsmith.readers.safetensors import RowSlicedTensor, bf16_bits_to_f32
from ggufsmith.errors import ConversionError, GgufsmithError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.writer import GGUFWriter
from ggufsmith.quantize import quantize

# A slice of a large tensor holds about this many elements (16 MiB as float32).
SLICE_ELEMENTS = 1 << 22
# Output bytes converted (or being converted) ahead of the writer. While a write blocks (the
# kernel throttles writers when the disk falls behind) the workers keep going; this bounds the
# memory that buys. Pieces are loaded only when a worker starts on them.
LOOKAHEAD_BYTES = 64 << 20
WORKERS = 2


def resolve_architecture(checkpoint: Checkpoint, arch: str | type[Architecture] | None) -> Architecture:
    """The plugin named by `arch` (a registry name or a plugin class), else the one config.json asks for."""
    if arch is None:
        plugin_class = find_architecture(checkpoint.config)
    elif isinstance(arch, str):
        plugin_class = get_architecture(arch)
    else:
        plugin_class = arch
    return plugin_class(checkpoint.config)


def tokenizer_metadata(model_dir: Path, vocab_size: int | None, kind: str | None, strict: bool = False) -> Metadata:
    """All tokenizer.* keys, from the tokenizer exporter (`strict`: see export_tokenizer)."""
    from ggufsmith.tokenizer import export_tokenizer

    return export_tokenizer(model_dir, vocab_size=vocab_size, kind=kind, strict=strict)


def make_plan(
    checkpoint: Checkpoint,
    outtype: str = "f16",
    arch: str | type[Architecture] | None = None,
    *,
    model_name: str | None = None,
    with_tokenizer: bool = True,
    quantize_request: QuantizeRequest | None = None,
    strict_tokenizer: bool = False,
) -> ConversionPlan:
    """Every output tensor's name, shape, type and size, and all metadata; nothing is loaded yet.

    A preset outtype (q4_k_m, q4_0, ...) plans the F32 conversion, then what llama-quantize makes
    of that file; `quantize_request` carries llama-quantize's options (default: the preset's).
    `strict_tokenizer` refuses a tokenizer llama.cpp would apply differently on some text."""
    if is_preset_outtype(outtype) or quantize_request is not None:
        request = quantize_request or QuantizeRequest(outtype)
        f32 = make_plan(checkpoint, "f32", arch, model_name=model_name, with_tokenizer=with_tokenizer,
                        strict_tokenizer=strict_tokenizer)
        return apply_preset(f32, request)
    target, file_type = outtype_of(outtype)
    plugin = resolve_architecture(checkpoint, arch)
    mapped = plugin.map_tensors(checkpoint.tensors)
    planned = [plan_tensor(m.name, m.sources, m.tensor, target, plugin) for m in mapped]

    params = count_parameters([(t.name, t.shape) for t in planned])
    metadata = Metadata()
    metadata.add_string(Keys.General.ARCHITECTURE, plugin.name)
    metadata.update(general_metadata(checkpoint.model_dir, checkpoint.config.values, params, model_name))
    metadata.update(plugin.metadata())
    metadata.add_uint32(Keys.General.FILE_TYPE, int(file_type))
    metadata.add_uint32(Keys.General.QUANTIZATION_VERSION, GGML_QUANTIZATION_VERSION)
    if with_tokenizer:
        metadata.update(tokenizer_metadata(checkpoint.model_dir, _vocab_size(checkpoint, planned), plugin.tokenizer_kind,
                                           strict=strict_tokenizer))
    plugin.check(mapped, metadata)
    return ConversionPlan(plugin, outtype.lower(), file_type, metadata, planned)


def _vocab_size(checkpoint: Checkpoint, planned: list[PlannedTensor]) -> int | None:
    size = checkpoint.config.get("vocab_size", "n_vocab", default=None)
    if size is None:
        embd = next((t for t in planned if t.name == "token_embd.weight"), None)
        size = embd.shape[0] if embd is not None else None
    return size


# -- execution ---------------------------------------------------------------------------------

def _work_units(t: PlannedTensor) -> Iterator[tuple[Callable[[], np.ndarray], int]]:
    """(function giving the next piece of the tensor's GGUF bytes, its size), in order."""
    tensor = t.tensor
    if isinstance(tensor, GGUFTensor) and tensor.stored_type == t.ggml_type:
        # already of the type wanted: its bytes are copied as they are, as llama-quantize does
        yield from _row_slices(t, tensor.raw_rows)
        return
    if not isinstance(tensor, RowSlicedTensor) or len(tensor.shape) < 2:
        yield (lambda: _encode(t, tensor.load, 0)), t.nbytes
        return
    if tensor.dtype == "BF16" and t.ggml_type == GGMLType.F16 and tensor.stored_rows_loader is not None:
        yield from _row_slices(t, lambda start, stop: _checked(t, lambda: bf16_bits_to_f16_bits(tensor.load_stored_rows(start, stop))))
    else:
        yield from _row_slices(t, lambda start, stop: _encode(t, lambda: tensor.load_rows(start, stop), start))


def _row_slices(t: PlannedTensor, piece: Callable[[int, int], np.ndarray]) -> Iterator[tuple[Callable[[], np.ndarray], int]]:
    """(piece(start, stop), its size) for consecutive ranges of rows of about SLICE_ELEMENTS elements."""
    row_bytes = t.nbytes // max(1, row_count(t.tensor))
    for start, stop in row_ranges(t.tensor):
        yield (lambda start=start, stop=stop: piece(start, stop)), (stop - start) * row_bytes


def row_count(tensor) -> int:
    """Rows of a tensor (a 1-D tensor is one row)."""
    row_length = tensor.shape[-1] if len(tensor.shape) >= 2 else max(1, tensor.n_elements)
    return tensor.n_elements // row_length if row_length else 0


def row_ranges(tensor) -> Iterator[tuple[int, int]]:
    """Consecutive [start, stop) ranges of rows of about SLICE_ELEMENTS elements (one empty range for no rows)."""
    row_length = tensor.shape[-1] if len(tensor.shape) >= 2 else max(1, tensor.n_elements)
    n_rows = row_count(tensor)
    step = max(1, SLICE_ELEMENTS // max(1, row_length))
    for start in range(0, max(1, n_rows), step):
        yield start, min(start + step, n_rows)


def bf16_bits_to_f16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 -> float16 as bit patterns, equal to converting through float32 with round to nearest
    even, in about a third of the time. Every bf16 whose exponent lies in float16's normal range
    converts exactly by moving the exponent and padding the mantissa; the rest (zeros, tiny values,
    overflow, Inf, NaN: rare in weights) go through float32."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    magnitude = bits & np.uint16(0x7FFF)
    # f16 exponent = bf16 exponent - 112; normal f16 exponents are 1..30, i.e. bf16 113..142.
    out = magnitude - np.uint16(112 << 7)
    out <<= np.uint16(3)
    out |= bits & np.uint16(0x8000)
    outside = (magnitude - np.uint16(113 << 7)) > np.uint16((142 << 7 | 0x7F) - (113 << 7))
    if outside.any():
        idx = np.flatnonzero(outside.reshape(-1))
        flat_out, flat_bits = out.reshape(-1), bits.reshape(-1)
        with np.errstate(over="ignore"):  # beyond f16's range is Inf, as the float path gives
            flat_out[idx] = bf16_bits_to_f32(flat_bits[idx]).astype("<f2").view(np.uint16)
    return out.view(np.uint8).reshape(-1)


def _checked(t: PlannedTensor, produce: Callable[[], np.ndarray]) -> np.ndarray:
    try:
        return produce()
    except GgufsmithError as e:
        raise ConversionError(f"tensor {t.name} (from {t.tensor.source}): {e}") from None


def _encode(t: PlannedTensor, load: Callable[[], np.ndarray], first_row: int) -> np.ndarray:
    """The GGUF bytes of rows first_row.. of tensor t (given by `load`), quantized to t's type."""
    return encode_many([t], load, first_row)[0]


def encode_many(group: list[PlannedTensor], load: Callable[[], np.ndarray], first_row: int) -> list[np.ndarray]:
    """The GGUF bytes of rows first_row.. of one source tensor for each planned output tensor of
    `group` (the same tensor in several files): loaded and made float once, quantized to each type,
    each expert's rows of a 3-D tensor with that expert's importance vector."""

    def produce() -> list[np.ndarray]:
        data = load()
        if data.size and not np.issubdtype(data.dtype, np.floating):
            data = data.astype(np.float32)  # integer and bool tensors are stored as floats, as llama.cpp does
        return [_quantized(t, data, first_row) for t in group]

    return _checked(group[0], produce)


def _quantized(t: PlannedTensor, data: np.ndarray, first_row: int) -> np.ndarray:
    if t.importance is None:
        return quantize(data, t.ggml_type)
    rows = data.reshape(-1, t.shape[-1])
    rows_per_matrix = int(np.prod(t.shape[:-1], dtype=np.int64)) // t.importance.shape[0]
    pieces = [quantize(rows[start:stop], t.ggml_type, importance)
              for start, stop, importance in split_importance_rows(t.importance, first_row, len(rows), rows_per_matrix)]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def write_plan(plan: ConversionPlan, dst: str | Path, *, progress: bool = True) -> Path:
    """Load, transform, quantize and write every planned tensor. Returns the written path."""
    from ggufsmith.converters.fanout import write_plans

    return write_plans([(plan, Path(dst))], progress=progress)[0]


def convert(
    src: str | Path,
    dst: str | Path,
    outtype: str = "f16",
    arch: str | type[Architecture] | None = None,
    *,
    dry_run: bool = False,
    progress: bool = False,
    model_name: str | None = None,
    with_tokenizer: bool = True,
    imatrix: str | Path | None = None,
    quantize_request: QuantizeRequest | None = None,
    strict_tokenizer: bool = False,
) -> ConversionPlan:
    """Convert the Hugging Face model folder `src` to the GGUF file `dst`; returns the plan.

    `outtype` is one of plan.OUTTYPES, or a llama-quantize preset name (q4_k_m, ...: the file
    llama-quantize would make from the F32 conversion, made without any intermediate file);
    `imatrix` an importance matrix file for the preset. `arch` a registered architecture name
    (default: chosen from config.json). With `dry_run` nothing is written. `dst` appears only once
    complete. Where llama.cpp will tokenize some text differently from the Hugging Face tokenizer,
    one warning is logged; `strict_tokenizer` makes that an error (docs/tokenizers.md).
    """
    dst = Path(dst)
    if dst.is_dir():
        raise ConversionError(f"{dst} is a directory; give the path of the .gguf file to write")
    if is_preset_outtype(outtype) or quantize_request is not None:
        quantize_request = quantize_request or QuantizeRequest(outtype)
        if imatrix is not None:
            from ggufsmith.quantize.imatrix import read_imatrix

            quantize_request.imatrix = read_imatrix(imatrix)
    elif imatrix is not None:
        raise ConversionError(f"an importance matrix is used by quantization presets (q4_k_m, ...), not by --outtype {outtype}")
    else:
        outtype_of(outtype)  # reject a bad type before opening anything
    with open_checkpoint(src) as checkpoint:
        plan = make_plan(checkpoint, outtype, arch, model_name=model_name, with_tokenizer=with_tokenizer,
                         quantize_request=quantize_request, strict_tokenizer=strict_tokenizer)
        if not dry_run:
            write_plan(plan, dst, progress=progress)
    return plan
