"""`ggufsmith inspect FILE.gguf`: validate a GGUF file and show what is in it.

Prints the header, the metadata (long arrays summarized), the tensor table, totals, a check of the
file name against the GGUF naming convention, and warnings about what llama.cpp will refuse.
`--json` prints the same as one JSON document, with arrays in full, for scripts.
A file that does not validate gives a one-line error and exit status 1 (through the CLI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ggufsmith.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAX_TENSOR_NAME_BYTES, GGUFValueType
from ggufsmith.gguf_writer.encoding import align_offset
from ggufsmith.gguf_writer.metadata import MetadataValue, check_key
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.errors import GGUFError

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
TEXT_PREVIEW = 70  # characters shown of a long string


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the GGUF file to inspect")
    parser.add_argument("--json", action="store_true", help="print one JSON document (arrays in full) instead of text")


def run(args: argparse.Namespace) -> int:
    reader = GGUFReader(args.file)
    report = build_report(reader)
    text = json.dumps(report, indent=1) if args.json else format_report(reader, report)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `ggufsmith inspect x.gguf | head`: the reader has all it wanted; not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# -- the report -----------------------------------------------------------------------------------
def build_report(reader: GGUFReader) -> dict[str, Any]:
    """Everything `inspect` shows, as plain JSON-able data."""
    tensors = [
        {
            "name": t.name,
            "shape": list(t.shape),
            "ne": list(t.ne),
            "type": t.ggml_type.name,
            "offset": t.offset,
            "relative_offset": t.relative_offset,
            "nbytes": t.nbytes,
            "n_elements": t.n_elements,
        }
        for t in reader.tensors
    ]
    bytes_by_type: dict[str, int] = {}
    tensors_by_type: dict[str, int] = {}
    for t in reader.tensors:
        bytes_by_type[t.ggml_type.name] = bytes_by_type.get(t.ggml_type.name, 0) + t.nbytes
        tensors_by_type[t.ggml_type.name] = tensors_by_type.get(t.ggml_type.name, 0) + 1
    return {
        "file": str(reader.path),
        "file_size": reader.file_size,
        "version": reader.version,
        "byte_order": reader.byteorder,
        "alignment": reader.alignment,
        "data_offset": reader.data_offset,
        "n_kv": reader.n_kv,
        "n_tensors": reader.n_tensors,
        "metadata": {key: _json_value(value) for key, value in reader.metadata.items()},
        "tensors": tensors,
        "totals": {
            "parameters": sum(t.n_elements for t in reader.tensors),
            "tensor_bytes": sum(t.nbytes for t in reader.tensors),
            "bytes_by_type": bytes_by_type,
            "tensors_by_type": tensors_by_type,
        },
        "naming": check_file_name(reader.path.name),
        "warnings": llama_cpp_warnings(reader),
    }


def check_file_name(name: str) -> dict[str, Any]:
    match = NAMING_CONVENTION.match(name)
    if not match:
        return {"follows_convention": False, "parts": {}}
    return {"follows_convention": True, "parts": {p: match.group(p) for p in NAMING_PARTS if match.group(p) is not None}}


def llama_cpp_warnings(reader: GGUFReader) -> list[str]:
    """What is valid GGUF but will stop or surprise llama.cpp (ggml's loader is stricter than the spec)."""
    warnings = []
    if reader.version == 1:
        warnings.append("GGUF v1 file: current llama.cpp no longer loads version 1")
    if reader.byteorder == "big":
        warnings.append("big-endian file: llama.cpp loads it only on a big-endian machine")
    if reader.alignment % 8:
        warnings.append(f"alignment {reader.alignment} is not a multiple of 8 as the spec asks")
    for key, value in reader.metadata.items():
        if value.type == GGUFValueType.ARRAY and value.element_type == GGUFValueType.ARRAY:
            warnings.append(f"metadata {key} is an array of arrays: llama.cpp refuses to load files with nested arrays")
        try:
            check_key(key)
        except GGUFError:
            warnings.append(f"metadata key {key!r} is not lower_snake_case.dotted ASCII as the spec asks")
    expected_offset = 0
    for t in reader.tensors:
        if len(t.name.encode("utf-8")) > GGUF_MAX_TENSOR_NAME_BYTES:
            warnings.append(f"tensor name {t.name!r} is 64 bytes: ggml loads names of at most 63")
        if t.relative_offset != expected_offset:
            warnings.append(
                f"tensor {t.name} is at data offset {t.relative_offset}; llama.cpp expects the tensors "
                f"stored in order, each padded to the alignment (offset {expected_offset})"
            )
        expected_offset = align_offset(t.relative_offset + t.nbytes, reader.alignment)
    return warnings


def _json_value(item: MetadataValue) -> dict[str, Any]:
    if item.type != GGUFValueType.ARRAY:
        return {"type": item.type.name, "value": _json_scalar(item.value)}
    if item.element_type == GGUFValueType.ARRAY:
        values = [_json_value(v) for v in item.value]
    elif isinstance(item.value, np.ndarray):
        values = item.value.tolist()
    else:
        values = [_json_scalar(v) for v in item.value]
    return {"type": "ARRAY", "element_type": item.element_type.name, "length": len(item.value), "value": values}


def _json_scalar(value: Any) -> Any:
    # Strings that are not UTF-8 (llama.cpp allows any bytes) round-trip through surrogate escapes.
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


# -- text -----------------------------------------------------------------------------------------
def format_report(reader: GGUFReader, report: dict[str, Any]) -> str:
    lines = [
        f"{reader.path}: GGUF v{reader.version}, {reader.byteorder}-endian, {reader.file_size:,} bytes",
        f"  {reader.n_kv} metadata keys, {reader.n_tensors} tensors, alignment {reader.alignment}"
        + ("" if reader.alignment == GGUF_DEFAULT_ALIGNMENT else " (from general.alignment)")
        + f", tensor data at byte {reader.data_offset:,}",
        "",
        "metadata:",
    ]
    width = max((len(k) for k in reader.metadata), default=0)
    for key, item in reader.metadata.items():
        lines.append(f"  {key:<{width}}  {_type_name(item):<10}  {_summary(item)}")
    lines += ["", "tensors:"]
    if reader.tensors:
        rows = [("name", "shape", "type", "offset", "bytes")]
        rows += [
            (t.name, "x".join(map(str, t.shape)), t.ggml_type.name, f"{t.offset:,}", f"{t.nbytes:,}")
            for t in reader.tensors
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            lines.append(
                f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]:>{widths[4]}}"
            )
    else:
        lines.append("  (none)")
    totals = report["totals"]
    lines += [
        "",
        f"parameters: {totals['parameters']:,} ({_human(totals['parameters'])})",
        f"tensor data: {totals['tensor_bytes']:,} bytes",
    ]
    for type_name, nbytes in sorted(totals["bytes_by_type"].items()):
        lines.append(f"  {type_name:<8} {totals['tensors_by_type'][type_name]:>5} tensors  {nbytes:>16,} bytes")
    naming = report["naming"]
    if naming["follows_convention"]:
        parts = ", ".join(f"{k}={v}" for k, v in naming["parts"].items())
        lines.append(f"file name: follows the GGUF naming convention ({parts})")
    else:
        lines.append(
            "file name: does not follow the GGUF naming convention "
            "(<BaseName>-<SizeLabel>-<FineTune>-<Version>-<Encoding>-<Type>-<Shard>.gguf)"
        )
    if report["warnings"]:
        lines += ["", "warnings:"] + [f"  - {w}" for w in report["warnings"]]
    return "\n".join(lines)


def _type_name(item: MetadataValue) -> str:
    return item.type.name if item.type != GGUFValueType.ARRAY else f"[{item.element_type.name}]"


def _summary(item: MetadataValue) -> str:
    if item.type == GGUFValueType.STRING:
        return _short_text(item.value)
    if item.type != GGUFValueType.ARRAY:
        return repr(item.value)
    values = item.value
    n = len(values)
    shown = [_summary(v) if isinstance(v, MetadataValue) else _scalar_text(v) for v in values[:ARRAY_PREVIEW]]
    more = f", ... ({n:,} values)" if n > ARRAY_PREVIEW else ""
    return f"[{', '.join(shown)}{more}]"


def _scalar_text(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return _short_text(value)
    return repr(value.item() if isinstance(value, np.generic) else value)


def _short_text(value: str | bytes) -> str:
    text = json.dumps(value if isinstance(value, str) else value.decode("utf-8", "backslashreplace"), ensure_ascii=False)
    return text if len(text) <= TEXT_PREVIEW else text[: TEXT_PREVIEW - 4] + '..."'


def _human(n: int) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
