"""`ggufsmith inspect FILE.gguf`: validate a GGUF file and show what is in it.

Prints the header, the metadata (long arrays summarized), the tensor table, totals, a check of the
file name against the GGUF naming convention, and warnings about what llama.cpp will refuse.
`--json` prints the same as one JSON document, with arrays in full, for scripts.
Both are written as they are produced, never built whole: with the reader's lazy values, memory
stays a small multiple of the file's size however the file is made (tests/test_gguf_reader_memory.py).
A file that does not validate gives a one-line error and exit status 1 (through the CLI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from ggufsmith.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_INTEGER_TYPES, GGUF_MAX_TENSOR_NAME_BYTES, GGUFValueType, Keys
from ggufsmith.gguf_writer.encoding import align_offset
from ggufsmith.gguf_writer.metadata import MetadataValue, check_key
from ggufsmith.gguf_writer.reader import GGUFReader, ReaderTensor
from ggufsmith.errors import GGUFError, GgufsmithError, one_line

# The naming convention's regular expression from the GGUF spec ("Validating Above Naming
# Convention"), in Python syntax: <BaseName>-<SizeLabel>-<FineTune>-<Version>-<Encoding>-<Type>-<Shard>.gguf
NAMING_CONVENTION = re.compile(
    r"^(?P<BaseName>[A-Za-z0-9\s]*(?:(?:-(?:(?:[A-Za-z\s][A-Za-z0-9\s]*)|(?:[0-9\s]*)))*))"
    r"-(?:(?P<SizeLabel>(?:\d+x)?(?:\d+\.)?\d+[A-Za-z](?:-[A-Za-z]+(\d+\.)?\d+[A-Za-z]+)?)"
    r"(?:-(?P<FineTune>[A-Za-z0-9\s-]+))?)?"
    r"-(?:(?P<Version>v\d+(?:\.\d+)*))"
    r"(?:-(?P<Encoding>(?!LoRA|vocab)[\w_]+))?"
    r"(?:-(?P<Type>LoRA|vocab))?"
    r"(?:-(?P<Shard>\d{5}-of-\d{5}))?\.gguf$",
    re.ASCII,
)
NAMING_PARTS = ("BaseName", "SizeLabel", "FineTune", "Version", "Encoding", "Type", "Shard")
ARRAY_PREVIEW = 5  # values shown of a long array
ARRAY_PREVIEW_DEPTH = 2  # levels of nested arrays shown (each level multiplies the values shown by 5)
TEXT_PREVIEW = 70  # characters shown of a long string
JSON_CHUNK = 1024  # array elements written at a time by --json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the GGUF file to inspect")
    parser.add_argument("--json", action="store_true", help="print one JSON document (arrays in full) instead of text")


def run(args: argparse.Namespace) -> int:
    reader = GGUFReader(args.file)
    try:
        # Written piece by piece: the output of a large file is never held whole in memory.
        for piece in json_pieces(reader) if args.json else text_lines(reader):
            sys.stdout.write(piece if args.json else piece + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `ggufsmith inspect x.gguf | head`: the reader has all it wanted; not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# -- the report -----------------------------------------------------------------------------------
def tensor_totals(reader: GGUFReader) -> dict[str, Any]:
    """Parameters and bytes, in all and by tensor type."""
    bytes_by_type: dict[str, int] = {}
    tensors_by_type: dict[str, int] = {}
    parameters = tensor_bytes = 0
    for t in reader.tensors:
        parameters += t.n_elements
        tensor_bytes += t.nbytes
        bytes_by_type[t.ggml_type.name] = bytes_by_type.get(t.ggml_type.name, 0) + t.nbytes
        tensors_by_type[t.ggml_type.name] = tensors_by_type.get(t.ggml_type.name, 0) + 1
    return {
        "parameters": parameters,
        "tensor_bytes": tensor_bytes,
        "bytes_by_type": bytes_by_type,
        "tensors_by_type": tensors_by_type,
    }


def _tensor_entry(t: ReaderTensor) -> dict[str, Any]:
    return {
        "name": t.name,
        "shape": list(t.shape),
        "ne": list(t.ne),
        "type": t.ggml_type.name,
        "offset": t.offset,
        "relative_offset": t.relative_offset,
        "nbytes": t.nbytes,
        "n_elements": t.n_elements,
    }


def json_pieces(reader: GGUFReader) -> Iterator[str]:
    """The report as one JSON document, in pieces: header fields, then each metadata value (arrays
    in full, element by element), each tensor, totals, the name check and the warnings."""
    header = {
        "file": str(reader.path),
        "file_size": reader.file_size,
        "version": reader.version,
        "byte_order": reader.byteorder,
        "alignment": reader.alignment,
        "data_offset": reader.data_offset,
        "n_kv": reader.n_kv,
        "n_tensors": reader.n_tensors,
    }
    yield "{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
    yield ' "metadata": {'
    for i, (key, value) in enumerate(reader.metadata.items()):
        yield f"{',' if i else ''}\n  {json.dumps(key)}: "
        yield from _json_value(value)
    yield "\n },\n \"tensors\": ["
    for i, t in enumerate(reader.tensors):
        yield f"{',' if i else ''}\n  {json.dumps(_tensor_entry(t))}"
    yield f"\n ],\n \"totals\": {json.dumps(tensor_totals(reader))},\n"
    split = split_report(reader)
    if split is not None:
        yield f' "split": {json.dumps(split)},\n'
    yield f' "naming": {json.dumps(check_file_name(reader.path.name))},\n "warnings": ['
    for i, warning in enumerate(llama_cpp_warnings(reader)):
        yield f"{',' if i else ''}\n  {json.dumps(warning)}"
    yield "\n ]\n}\n"


def check_file_name(name: str) -> dict[str, Any]:
    match = NAMING_CONVENTION.match(name)
    if not match:
        return {"follows_convention": False, "parts": {}}
    return {"follows_convention": True, "parts": {p: match.group(p) for p in NAMING_PARTS if match.group(p) is not None}}


def llama_cpp_warnings(reader: GGUFReader) -> Iterator[str]:
    """What is valid GGUF but will stop or surprise llama.cpp (ggml's loader is stricter than the spec)."""
    if reader.version == 1:
        yield "GGUF v1 file: current llama.cpp no longer loads version 1"
    if reader.byteorder == "big":
        yield "big-endian file: llama.cpp loads it only on a big-endian machine"
    if reader.alignment % 8:
        yield f"alignment {reader.alignment} is not a multiple of 8 as the spec asks"
    for key, value in reader.metadata.items():
        if value.type == GGUFValueType.ARRAY and value.element_type == GGUFValueType.ARRAY:
            yield f"metadata {key} is an array of arrays: llama.cpp refuses to load files with nested arrays"
        try:
            check_key(key)
        except GGUFError:
            yield f"metadata key {key!r} is not lower_snake_case.dotted ASCII as the spec asks"
    expected_offset = 0
    for t in reader.tensors:
        if len(t.name.encode("utf-8")) > GGUF_MAX_TENSOR_NAME_BYTES:
            yield f"tensor name {t.name!r} is 64 bytes: ggml loads names of at most 63"
        if t.relative_offset != expected_offset:
            yield (
                f"tensor {t.name} is at data offset {t.relative_offset}; llama.cpp expects the tensors "
                f"stored in order, each padded to the alignment (offset {expected_offset})"
            )
        expected_offset = align_offset(t.relative_offset + t.nbytes, reader.alignment)


def split_report(reader: GGUFReader) -> dict[str, Any] | None:
    """For a part of a split model (split.count above 1): which part it is, and for the first part
    the whole model: each part's tensors and bytes, the totals, and what would stop llama.cpp from
    loading it (a missing or damaged part, tensor counts that do not add up)."""
    count = _int_key(reader, Keys.Split.COUNT)
    if count is None or count <= 1:
        return None
    number = (_int_key(reader, Keys.Split.NO) or 0) + 1
    report: dict[str, Any] = {"part": number, "count": count, "warnings": []}
    if number != 1:
        return report
    from ggufsmith.readers.gguf_source import split_paths

    warnings = report["warnings"]
    try:
        paths = split_paths(reader.path, count)
    except GgufsmithError as e:
        warnings.append(str(e))
        return report
    parts, names = [], set()
    for index, path in enumerate(paths):
        try:
            part = reader if index == 0 else GGUFReader(path)
        except (OSError, GgufsmithError) as e:
            warnings.append(f"part {path.name} cannot be read ({one_line(e)}): llama.cpp will not load the model")
            continue
        if index and _int_key(part, Keys.Split.NO) != index:
            warnings.append(f"{path.name} has split.no {_int_key(part, Keys.Split.NO)}, not {index}")
        duplicates = names.intersection(t.name for t in part.tensors)
        if duplicates:
            warnings.append(f"tensor {sorted(duplicates)[0]} is in more than one part")
        names.update(t.name for t in part.tensors)
        totals = tensor_totals(part)
        parts.append({"file": path.name, "tensors": len(part.tensors), "parameters": totals["parameters"],
                      "tensor_bytes": totals["tensor_bytes"]})
    tensors = sum(p["tensors"] for p in parts)
    expected = _int_key(reader, Keys.Split.TENSORS_COUNT)
    if expected != tensors and len(parts) == count:
        warnings.append(f"the parts hold {tensors} tensors but split.tensors.count is {expected}")
    report.update(tensors_count=expected, parts=parts, totals={
        "tensors": tensors, "parameters": sum(p["parameters"] for p in parts),
        "tensor_bytes": sum(p["tensor_bytes"] for p in parts)})
    return report


def _int_key(reader: GGUFReader, key: str) -> int | None:
    if key not in reader.metadata:
        return None
    item = reader.metadata[key]
    return int(item.value) if item.type in GGUF_INTEGER_TYPES else None


def _json_value(item: MetadataValue) -> Iterator[str]:
    """One metadata value as JSON, in pieces: never more than a chunk of an array at a time."""
    if item.type != GGUFValueType.ARRAY:
        yield json.dumps({"type": item.type.name, "value": _json_scalar(item.value)})
        return
    yield f'{{"type": "ARRAY", "element_type": "{item.element_type.name}", "length": {len(item.value)}, "value": ['
    values = item.value
    if item.element_type == GGUFValueType.ARRAY:
        for i, element in enumerate(values):
            yield ", " if i else ""
            yield from _json_value(element)
    elif isinstance(values, np.ndarray):  # as Python numbers a slice at a time: a list of all is ~10x
        for start in range(0, len(values), JSON_CHUNK):
            yield (", " if start else "") + ", ".join(map(json.dumps, values[start : start + JSON_CHUNK].tolist()))
    else:
        strings = iter(values)
        separator = ""
        while chunk := list(islice(strings, JSON_CHUNK)):
            yield separator + ", ".join(json.dumps(_json_scalar(v)) for v in chunk)
            separator = ", "
    yield "]}"


def _json_scalar(value: Any) -> Any:
    # Strings that are not UTF-8 (llama.cpp allows any bytes) round-trip through surrogate escapes.
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


# -- text -----------------------------------------------------------------------------------------
def text_lines(reader: GGUFReader) -> Iterator[str]:
    """The report as text, line by line (the tensor table takes one pass to size its columns)."""
    yield f"{reader.path}: GGUF v{reader.version}, {reader.byteorder}-endian, {reader.file_size:,} bytes"
    yield (
        f"  {reader.n_kv} metadata keys, {reader.n_tensors} tensors, alignment {reader.alignment}"
        + ("" if reader.alignment == GGUF_DEFAULT_ALIGNMENT else " (from general.alignment)")
        + f", tensor data at byte {reader.data_offset:,}"
    )
    yield ""
    yield "metadata:"
    width = max((len(k) for k in reader.metadata), default=0)
    for key, item in reader.metadata.items():
        yield f"  {key:<{width}}  {_type_name(item):<10}  {_summary(item)}"
    yield ""
    yield "tensors:"
    yield from _tensor_table(reader)
    totals = tensor_totals(reader)
    yield ""
    yield f"parameters: {totals['parameters']:,} ({_human(totals['parameters'])})"
    yield f"tensor data: {totals['tensor_bytes']:,} bytes"
    for type_name, nbytes in sorted(totals["bytes_by_type"].items()):
        yield f"  {type_name:<8} {totals['tensors_by_type'][type_name]:>5} tensors  {nbytes:>16,} bytes"
    naming = check_file_name(reader.path.name)
    if naming["follows_convention"]:
        parts = ", ".join(f"{k}={v}" for k, v in naming["parts"].items())
        yield f"file name: follows the GGUF naming convention ({parts})"
    else:
        yield (
            "file name: does not follow the GGUF naming convention "
            "(<BaseName>-<SizeLabel>-<FineTune>-<Version>-<Encoding>-<Type>-<Shard>.gguf)"
        )
    split = split_report(reader)
    if split is not None:
        yield f"split model: part {split['part']} of {split['count']}"
        if "totals" in split:
            totals = split["totals"]
            yield (f"  all parts: {totals['tensors']:,} tensors (split.tensors.count {split['tensors_count']}), "
                   f"{totals['parameters']:,} parameters, {totals['tensor_bytes']:,} bytes of tensor data")
            for part in split["parts"]:
                yield f"  {part['file']}: {part['tensors']} tensors, {part['tensor_bytes']:,} bytes"
    for i, warning in enumerate(chain(llama_cpp_warnings(reader), split["warnings"] if split else ())):
        if i == 0:
            yield ""
            yield "warnings:"
        yield f"  - {warning}"


def _tensor_table(reader: GGUFReader) -> Iterator[str]:
    if not reader.tensors:
        yield "  (none)"
        return

    def row(t: ReaderTensor) -> tuple[str, ...]:
        return t.name, "x".join(map(str, t.shape)), t.ggml_type.name, f"{t.offset:,}", f"{t.nbytes:,}"

    header = ("name", "shape", "type", "offset", "bytes")
    widths = [len(h) for h in header]
    for t in reader.tensors:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row(t))]
    for r in chain([header], (row(t) for t in reader.tensors)):
        yield f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]:>{widths[4]}}"


def _type_name(item: MetadataValue) -> str:
    return item.type.name if item.type != GGUFValueType.ARRAY else f"[{item.element_type.name}]"


def _summary(item: MetadataValue, depth: int = 0) -> str:
    if item.type == GGUFValueType.STRING:
        return _short_text(item.value)
    if item.type != GGUFValueType.ARRAY:
        return repr(item.value)
    n = len(item.value)
    if depth == ARRAY_PREVIEW_DEPTH:
        return f"[({n:,} values)]"
    shown = [
        _summary(v, depth + 1) if isinstance(v, MetadataValue) else _scalar_text(v)
        for v in islice(item.value, ARRAY_PREVIEW)
    ]
    more = f", ... ({n:,} values)" if n > ARRAY_PREVIEW else ""
    return f"[{', '.join(shown)}{more}]"


def _scalar_text(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return _short_text(value)
    return repr(value.item() if isinstance(value, np.generic) else value)


def _short_text(value: str | bytes) -> str:
    value = value[: 4 * TEXT_PREVIEW]  # what can be shown: a long text is never escaped whole
    text = json.dumps(value if isinstance(value, str) else value.decode("utf-8", "backslashreplace"), ensure_ascii=False)
    return text if len(text) <= TEXT_PREVIEW else text[: TEXT_PREVIEW - 4] + '..."'


def _human(n: int) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
