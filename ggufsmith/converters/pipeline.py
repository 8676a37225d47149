"""Checkpoint folder -> GGUF file: read, pick the plugin, plan, transform, quantize, stream.

Memory stays bounded whatever the model size: tensors are read one at a time from memory maps,
large ones in slices of rows, and at most workers.lookahead_bytes(workers) of output are converted
ahead of the one being written. Conversion runs on one worker thread per available core (or
`threads`), the writer in a thread of its own (fanout.py, which also writes several types of one
checkpoint in one pass); a large tensor is cut into row ranges that the workers convert at once. Quantizers that hold the interpreter lock run in worker processes
(workers.Quantizer). Every piece is the same bytes whoever converts it, so the file is identical
for every worker count. The output appears only when complete: the writer renames its temporary
file at the end and deletes it on any error or Ctrl-C.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture
from ggufsmith.arch.registry import find_architecture, get_architecture
from ggufsmith.constants import GGML_QUANTIZATION_VERSION, GGMLType, Keys
from ggufsmith.readers.checkpoint import Checkpoint, open_checkpoint
from ggufsmith.converters.general_metadata import (MetadataOverrides, count_parameters, general_metadata,
                                                   read_metadata_overrides)
from ggufsmith.converters.output_names import has_type_template, named_output
from ggufsmith.readers.file_rows import FileRows
from ggufsmith.readers.lazy_tensor import EncodedTensor
from ggufsmith.converters.plan import (AUTO_OUTTYPE, OUTTYPES, ConversionPlan, PlannedTensor, big_endian_plan,
                                      file_type_with_stored, refuse_quantized_big_endian,
                                      guess_outtype, is_preset_outtype, outtype_of, plan_tensor)
from ggufsmith.converters.quantize_plan import QuantizeRequest, apply_preset, split_importance_rows
from ggufsmith.converters.split import SplitRule, split_plan
from ggufsmith.converters.task_adapters import task_adapter_plans
from ggufsmith.readers.safetensors import RowSlicedTensor, bf16_bits_to_f32
from ggufsmith.errors import ConversionError, GgufsmithError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.output import check_target, folder_files
from ggufsmith.converters.workers import Quantizer, resolve_workers

# A slice of a large tensor holds about this many elements (16 MiB as float32). Slices are the
# unit of work: the workers convert the slices of one tensor at once.
SLICE_ELEMENTS = 1 << 22


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
    vocab_only: bool = False,
    metadata_overrides: MetadataOverrides | None = None,
) -> ConversionPlan:
    """Every output tensor's name, shape, type and size, and all metadata; nothing is loaded yet.

    `vocab_only` plans the file llama.cpp's converter writes with --vocab-only: every key (the
    tokenizer's, the model's), no tensor. `metadata_overrides`: see general_metadata.

    A preset outtype (q4_k_m, q4_0, ...) plans the F32 conversion, then what llama-quantize makes
    of that file; `quantize_request` carries llama-quantize's options (default: the preset's).
    `strict_tokenizer` refuses a tokenizer llama.cpp would apply differently on some text.
    `outtype` "auto" is bf16 or f16, from the checkpoint's storage type (plan.guess_outtype)."""
    if outtype.lower() == AUTO_OUTTYPE:
        outtype = guess_outtype(checkpoint.tensors)
    if (is_preset_outtype(outtype) or quantize_request is not None) and not vocab_only:
        request = quantize_request or QuantizeRequest(outtype)
        f32 = make_plan(checkpoint, "f32", arch, model_name=model_name, with_tokenizer=with_tokenizer,
                        strict_tokenizer=strict_tokenizer, metadata_overrides=metadata_overrides)
        return apply_preset(f32, request)
    target, file_type = outtype_of(outtype)
    plugin = resolve_architecture(checkpoint, arch)
    plugin.read_scalars(checkpoint.tensors)  # the few numbers some plugins write as keys (before metadata())
    mapped = plugin.map_tensors(checkpoint.tensors)
    planned = [plan_tensor(m.name, m.sources, m.tensor, target, plugin) for m in mapped]
    file_type = file_type_with_stored(file_type, planned)

    params = count_parameters([] if vocab_only else [(t.name, t.shape) for t in planned])
    metadata = Metadata()
    metadata.add_string(Keys.General.ARCHITECTURE, plugin.name)
    metadata.update(general_metadata(checkpoint.model_dir, checkpoint.config.values, params, model_name,
                                     metadata_overrides, repo_id=checkpoint.repo_id))
    metadata.update(plugin.metadata())
    metadata.add_uint32(Keys.General.FILE_TYPE, int(file_type))
    metadata.add_uint32(Keys.General.QUANTIZATION_VERSION, GGML_QUANTIZATION_VERSION)
    if with_tokenizer:
        metadata.update(tokenizer_metadata(checkpoint.model_dir, _vocab_size(checkpoint, planned), plugin.tokenizer_kind,
                                           strict=strict_tokenizer))
    plugin.check(mapped, metadata)
    return ConversionPlan(plugin, outtype.lower(), file_type, metadata, [] if vocab_only else planned)


def _vocab_size(checkpoint: Checkpoint, planned: list[PlannedTensor]) -> int | None:
    size = checkpoint.config.get("vocab_size", "n_vocab", default=None)
    if size is None:
        embd = next((t for t in planned if t.name == "token_embd.weight"), None)
        size = embd.shape[0] if embd is not None else None
    return size


# -- execution ---------------------------------------------------------------------------------

def _work_units(t: PlannedTensor, quantizer: Quantizer) -> Iterator[tuple[Callable[[], np.ndarray], int]]:
    """(function giving the next piece of the tensor's GGUF bytes, its size), in order."""
    tensor = t.tensor
    if isinstance(tensor, EncodedTensor) and tensor.stored_type == t.ggml_type:
        # already of the type wanted: its bytes are copied as they are, as llama-quantize does
        yield from _row_slices(t, tensor.raw_rows)
        return
    if isinstance(tensor, RowSlicedTensor) and len(tensor.shape) >= 2:
        if tensor.dtype == "BF16" and t.ggml_type == GGMLType.F16 and tensor.stored_rows_loader is not None:
            def bf16_to_f16(start: int, stop: int) -> np.ndarray:
                bits = tensor.load_stored_rows(start, stop)
                return _refuse_f16_overflow(t, bf16_bits_to_f16_bits(bits), lambda: bool((~bits & 0x7F80).all()))

            yield from _row_slices(t, lambda start, stop: _checked(t, lambda: bf16_to_f16(start, stop)))
        else:
            rows = rows_loader(tensor, [t], quantizer)
            yield from _row_slices(t, lambda start, stop: _encode(t, lambda: rows(start, stop), start, quantizer))
    elif len(tensor.shape) < 2 or tensor.n_elements <= SLICE_ELEMENTS:
        yield (lambda: _encode(t, tensor.load, 0, quantizer)), t.nbytes
    else:
        # a transformed tensor (permuted, regrouped, transposed) is loaded whole, once, by the
        # first of its pieces to run; the workers then quantize its row ranges at once
        whole = _LoadedOnce(tensor, n_pieces=len(list(_row_ranges(tensor))))
        yield from _row_slices(t, lambda start, stop: _encode(t, lambda: whole.rows(start, stop), start, quantizer))


def rows_loader(tensor: RowSlicedTensor, group: list[PlannedTensor],
                quantizer: Quantizer) -> Callable[[int, int], np.ndarray | FileRows]:
    """The tensor's load_rows; or, when every tensor of `group` is quantized in a worker process
    and the rows can be read from their file by another process, where they lie there (FileRows):
    the process reads them itself, with no widening here and no copy through a pipe."""
    if tensor.file_rows is not None and all(quantizer.uses_process(tensor.n_elements, t.ggml_type, t.importance)
                                            for t in group):
        return tensor.file_rows
    return tensor.load_rows


def _row_ranges(tensor) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of rows of about SLICE_ELEMENTS elements."""
    row_length = tensor.shape[-1] if len(tensor.shape) >= 2 else max(1, tensor.n_elements)
    n_rows = tensor.n_elements // row_length if row_length else 0
    step = max(1, SLICE_ELEMENTS // max(1, row_length))
    for start in range(0, max(1, n_rows), step):
        yield start, min(start + step, n_rows)


def _row_slices(t: PlannedTensor, piece: Callable[[int, int], np.ndarray]) -> Iterator[tuple[Callable[[], np.ndarray], int]]:
    """(piece(start, stop), its size) for each of the tensor's _row_ranges."""
    n_rows = t.tensor.n_elements // t.tensor.shape[-1] if len(t.tensor.shape) >= 2 and t.tensor.shape[-1] else 1
    row_bytes = t.nbytes // n_rows if n_rows else 0
    for start, stop in _row_ranges(t.tensor):
        yield (lambda start=start, stop=stop: piece(start, stop)), (stop - start) * row_bytes


class _LoadedOnce:
    """A tensor that can only be loaded whole, shared by the pieces that convert its row ranges:
    loaded by the first piece to run, let go once every piece has taken its rows."""

    def __init__(self, tensor, n_pieces: int):
        self._tensor = tensor
        self._pieces_left = n_pieces
        self._rows = None
        self._lock = threading.Lock()

    def rows(self, start: int, stop: int) -> np.ndarray:
        with self._lock:
            if self._rows is None:
                self._rows = self._tensor.load().reshape(-1, self._tensor.shape[-1])
            rows = self._rows[start:stop]
            self._pieces_left -= 1
            if self._pieces_left == 0:
                self._rows = None
        return rows


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


def _encode(t: PlannedTensor, load: Callable[[], np.ndarray], first_row: int, quantizer: Quantizer) -> np.ndarray:
    """The GGUF bytes of rows first_row.. of tensor t (given by `load`), quantized to t's type."""
    return encode_many([t], load, first_row, quantizer)[0]


def encode_many(group: list[PlannedTensor], load: Callable[[], np.ndarray | FileRows], first_row: int,
                quantizer: Quantizer) -> list[np.ndarray]:
    """The GGUF bytes of rows first_row.. of one source tensor for each planned tensor of `group`
    (the same tensor in several files, see fanout.py): loaded and made float once, then quantized
    to each one's type, each expert's rows of a 3-D tensor with that expert's importance vector."""

    def produce() -> list[np.ndarray]:
        data = load()
        if isinstance(data, np.ndarray) and data.size and not np.issubdtype(data.dtype, np.floating):
            data = data.astype(np.float32)  # integer and bool tensors are stored as floats, as llama.cpp does
        return [_quantized(t, data, first_row, quantizer) for t in group]

    return _checked(group[0], produce)


def _quantized(t: PlannedTensor, data: np.ndarray | FileRows, first_row: int, quantizer: Quantizer) -> np.ndarray:
    if t.importance is None:
        return _refuse_f16_overflow(t, quantizer(data, t.ggml_type), lambda: bool(np.isfinite(data).all()))
    rows = data if isinstance(data, FileRows) else data.reshape(-1, t.shape[-1])
    rows_per_matrix = int(np.prod(t.shape[:-1], dtype=np.int64)) // t.importance.shape[0]
    pieces = [quantizer(rows[start:stop], t.ggml_type, importance)
              for start, stop, importance in split_importance_rows(t.importance, first_row, len(rows), rows_per_matrix)]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def _refuse_f16_overflow(t: PlannedTensor, encoded: np.ndarray, source_is_finite: Callable[[], bool]) -> np.ndarray:
    """F16 holds at most 65504: a larger finite weight would be written as infinity, and llama.cpp
    would compute with it (NaN logits). Refuse rather than write a broken file."""
    if t.ggml_type == GGMLType.F16 and ((encoded.view("<u2") & 0x7FFF) == 0x7C00).any() and source_is_finite():
        raise ConversionError(
            f"tensor {t.name} (from {t.tensor.source}) holds values beyond float16's range (65504), which "
            "would be written as infinity; convert with --outtype bf16 or f32 instead"
        )
    return encoded


def write_plan(plan: ConversionPlan, dst: str | Path, *, progress: bool = True, inputs: Iterable[str | Path] = (),
               force: bool = False, threads: int | None = None) -> Path:
    """Load, transform, quantize and write every planned tensor on `threads` workers (default:
    every core this process may use). Returns the written path. The case of one file of
    fanout.write_plans (several files of one checkpoint, each tensor read once).

    `inputs` are the files the plan reads, which `dst` must not be; `force` lets `dst` be an
    existing device or FIFO, written into (see gguf_writer/output.py)."""
    from ggufsmith.converters.fanout import write_plans

    return write_plans([(plan, Path(dst))], progress=progress, inputs=inputs, force=force, threads=threads)[0]


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
    force: bool = False,
    threads: int | None = None,
    split: SplitRule | None = None,
    vocab_only: bool = False,
    metadata: str | Path | None = None,
    download: bool = False,
    bigendian: bool = False,
) -> ConversionPlan:
    """Convert the Hugging Face model folder `src` to the GGUF file `dst`; returns the plan (its
    `output` is the path written).

    `src` may also be a repository id ("Org/Model") found in the local Hugging Face cache, or
    downloaded into it with `download` (readers/hub.py). `dst` may be an existing folder: the file
    is then named by the GGUF naming convention, as llama.cpp's converter names it; `{ftype}` or
    `{outtype}` in its name is replaced by the type (`{FTYPE}`, `{OUTTYPE}`: in capitals), as there.
    `outtype` is one of plan.OUTTYPES, "auto" (bf16 or f16, as the checkpoint is stored, as
    llama.cpp decides), or a llama-quantize preset name (q4_k_m, ...: the file llama-quantize
    would make from the F32 conversion, made without any intermediate file); `imatrix` an
    importance matrix file for the preset. `arch` a registered architecture name (default: chosen
    from config.json). `threads`: workers (default: every core this process may use; the file is
    the same for any number). With `dry_run` nothing is written. `vocab_only` writes the
    tokenizer and the metadata, no tensor (llama.cpp loads it with vocab_only). `metadata` is a
    JSON file of general.* keys replacing those found (llama.cpp's --metadata). `dst` appears only
    once complete; it may not be one of the inputs, nor a device or FIFO unless `force`. Where
    llama.cpp will tokenize some text differently from the Hugging Face tokenizer, one warning is
    logged; `strict_tokenizer` makes that an error (docs/tokenizers.md). `split` cuts the output into
    parts DST-00001-of-0000n.gguf ... (converters/split.py), which appear together once all are complete.
    `bigendian` writes a big-endian file (convert_hf_to_gguf.py --bigendian) of float tensors only
    (see big_endian_plan).
    """
    from ggufsmith.readers.hub import resolve_source

    resolve_workers(threads)  # reject a bad count before reading anything
    src, repo_id = resolve_source(src, download=download)
    dst = Path(dst)
    into_folder = dst.is_dir()
    templated = not into_folder and has_type_template(dst.name)
    overrides = read_metadata_overrides(metadata) if metadata is not None else None
    inputs = folder_files(src) + [Path(p) for p in (imatrix, metadata) if p is not None]
    if not into_folder and not templated:
        check_target(dst, inputs, force=force)  # before any work
    if vocab_only and (is_preset_outtype(outtype) or quantize_request is not None or imatrix is not None):
        raise ConversionError(f"--vocab-only writes no tensors: give a plain --outtype ({', '.join(OUTTYPES)}, auto), "
                              f"not {outtype}")
    if is_preset_outtype(outtype) or quantize_request is not None:
        quantize_request = quantize_request or QuantizeRequest(outtype)
        if imatrix is not None:
            from ggufsmith.quantize.imatrix import read_imatrix

            quantize_request.imatrix = read_imatrix(imatrix)
    elif imatrix is not None:
        raise ConversionError(f"an importance matrix is used by quantization presets (q4_k_m, ...), not by --outtype {outtype}")
    elif outtype.lower() != AUTO_OUTTYPE:
        outtype_of(outtype)  # reject a bad type before opening anything
    if bigendian:
        refuse_quantized_big_endian(outtype if quantize_request is None else quantize_request.preset)
    quantizer = Quantizer(resolve_workers(threads))
    with quantizer, open_checkpoint(src) as checkpoint:
        if quantize_request is not None and not dry_run:
            # a preset's K-quants run in worker processes: started now, they import numpy and the
            # quantizers while this process makes the plan (the tokenizer's export included)
            quantizer.start()
        checkpoint.repo_id = repo_id or checkpoint.repo_id  # a snapshot given by path: open_checkpoint named it
        plan = make_plan(checkpoint, outtype, arch, model_name=model_name, with_tokenizer=with_tokenizer,
                         quantize_request=quantize_request, strict_tokenizer=strict_tokenizer, vocab_only=vocab_only,
                         metadata_overrides=overrides)
        if bigendian:
            big_endian_plan(plan)
        # the type a name says is general.file_type's, as llama.cpp's converter names it (MOSTLY_BF16: BF16)
        encoding = plan.file_type.name.partition("_")[2]
        if into_folder or templated:  # named now that the type is known
            dst = named_output(dst, plan.metadata, encoding, vocab_only=vocab_only)
            check_target(dst, inputs + checkpoint.files, force=force)
        plan.output = dst
        parts = split_plan(plan, dst, split or SplitRule())
        adapters = [] if vocab_only else task_adapter_plans(checkpoint, plan.architecture, dst)
        plan.adapter_files = [path for _, path in adapters]
        for path, _ in parts:
            check_target(path, inputs, force=force)
        for adapter, path in adapters:
            check_target(path, inputs + checkpoint.files, force=force)
            if bigendian:
                big_endian_plan(adapter)
        if not dry_run:
            from ggufsmith.converters.fanout import write_plans

            write_plans([(part, path) for path, part in parts], progress=progress, inputs=inputs + checkpoint.files,
                        force=force, threads=threads, quantizer=quantizer)
            for job in adapters:  # one file at a time: the task adapters' tensors share names, not data
                write_plans([job], progress=progress, inputs=inputs + checkpoint.files, force=force, threads=threads)
    return plan
