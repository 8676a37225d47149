"""Changing the metadata of an existing GGUF file (`ggufsmith set-metadata`).

The file is rewritten whole: the new header, then every tensor's bytes copied as they are, into a
temporary file renamed over the target only when complete (gguf_writer/output.py), so an
interrupted edit leaves the old file intact. Writing in place is the default; the old file stays
readable through the reader's mapping until the rename.

A change names its type or takes the type the key already has:
    general.name=My Model                 the existing key's type (a string)
    llama.context_length=8192             the existing key's type (uint32 here)
    general.tags=["chat", "llama"]        an array: JSON, elements of the existing element type
    my.key:float32=0.5                    an explicit type (a new key without one is a string)
    my.list:string[]=["a", "b"]           an explicit array type
Keys whose change would break the file or its loading are refused, naming the key: the alignment
(it places every tensor), the architecture (every other key is named after it), the split keys
(they tie files together) and the vocabulary arrays (their length is the embedding's row count).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.errors import GGUFError, GgufsmithError
from ggufsmith.gguf_writer.metadata import MetadataValue, check_key, make_value
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.gguf_writer.writer import GGUFWriter

PROTECTED_KEYS = {
    Keys.General.ALIGNMENT: "it places every tensor in the file",
    Keys.General.ARCHITECTURE: "every model key is named after it; convert again with another --arch instead",
    Keys.Tokenizer.TOKENS: "its length must stay the embedding's row count",
    Keys.Tokenizer.SCORES: "its length must stay the embedding's row count",
    Keys.Tokenizer.TOKEN_TYPE: "its length must stay the embedding's row count",
}
PROTECTED_PREFIXES = {"split.": "the split keys tie the files of a split model together"}

# Type names of an explicit KEY:TYPE=VALUE: GGUF's value types in lowercase.
_TYPES = {t.name.lower(): t for t in GGUFValueType if t != GGUFValueType.ARRAY}


class EditError(GgufsmithError):
    """A change that cannot be made: names the key and why."""


@dataclass(frozen=True)
class Change:
    key: str
    text: str  # the value as given
    vtype: GGUFValueType | None = None  # explicit type; None: the existing key's, else string
    element_type: GGUFValueType | None = None  # explicit array element type


def parse_change(text: str) -> Change:
    """KEY=VALUE or KEY:TYPE=VALUE (TYPE a GGUF value type, TYPE[] an array of it)."""
    target, sep, value = text.partition("=")
    if not sep or not target:
        raise EditError(f"{text!r}: expected KEY=VALUE or KEY:TYPE=VALUE")
    key, colon, type_name = target.partition(":")
    _check_editable(key)
    if not colon:
        return Change(key, value)
    is_array = type_name.endswith("[]")
    element = _TYPES.get(type_name.removesuffix("[]").lower())
    if element is None:
        raise EditError(f"{key}: unknown type {type_name!r}; use one of {', '.join(_TYPES)} (or TYPE[] for an array)")
    if is_array:
        return Change(key, value, GGUFValueType.ARRAY, element)
    return Change(key, value, element)


def _check_editable(key: str) -> None:
    try:
        check_key(key)
    except GGUFError:
        raise EditError(f"{key!r} is not a GGUF key (lowercase words separated by dots, like general.name)") from None
    why = PROTECTED_KEYS.get(key) or next((w for p, w in PROTECTED_PREFIXES.items() if key.startswith(p)), None)
    if why:
        raise EditError(f"{key} cannot be changed: {why}")


def typed_value(change: Change, existing: MetadataValue | None) -> MetadataValue:
    """The change's value with its type: the explicit one, else the existing key's, else string."""
    vtype, element_type = change.vtype, change.element_type
    if vtype is None and existing is not None:
        vtype, element_type = existing.type, existing.element_type
    vtype = vtype or GGUFValueType.STRING
    try:
        if vtype == GGUFValueType.ARRAY:
            if element_type == GGUFValueType.ARRAY:
                raise EditError(f"{change.key}: arrays of arrays cannot be set from the command line")
            items = json.loads(change.text)
            if not isinstance(items, list):
                raise ValueError("not a JSON list")
            return make_value(change.key, [_from_json(v, element_type) for v in items], vtype, element_type)
        return make_value(change.key, _from_text(change.text, vtype), vtype)
    except (ValueError, GGUFError) as e:
        kind = f"{element_type.name} array (JSON)" if vtype == GGUFValueType.ARRAY else vtype.name
        raise EditError(f"{change.key}: {change.text!r} is not a valid {kind} ({e})") from None


def _from_text(text: str, vtype: GGUFValueType) -> Any:
    """A scalar given as command-line text, in the Python type `vtype` wants."""
    if vtype == GGUFValueType.STRING:
        return text
    if vtype == GGUFValueType.BOOL:
        if text not in ("true", "false"):
            raise ValueError("expected true or false")
        return text == "true"
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(text)
    return int(text)


def _from_json(value: Any, vtype: GGUFValueType) -> Any:
    """An array element given as JSON: it must already be of the element type's kind."""
    expected = {GGUFValueType.STRING: (str,), GGUFValueType.BOOL: (bool,),
                GGUFValueType.FLOAT32: (int, float), GGUFValueType.FLOAT64: (int, float)}.get(vtype, (int,))
    if not isinstance(value, expected) or (isinstance(value, bool) and vtype != GGUFValueType.BOOL):
        raise ValueError(f"{json.dumps(value)} is not a {vtype.name}")
    return float(value) if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else value


def set_metadata(path: str | os.PathLike, changes: list[str | Change] = (), remove: list[str] = (),
                 output: str | os.PathLike | None = None) -> Path:
    """Rewrite the GGUF file `path` (or write `output`) with `changes` (KEY=VALUE texts or Change)
    applied and the keys `remove` deleted; every tensor is copied byte for byte. Returns the path
    written. Raises EditError naming the key for a change that cannot be made, before writing."""
    path = Path(path)
    parsed = [c if isinstance(c, Change) else parse_change(c) for c in changes]
    for key in remove:
        _check_editable(key)
    if not parsed and not remove:
        raise EditError(f"{path}: nothing to change; give KEY=VALUE pairs or --remove KEY")
    reader = GGUFReader(path)
    if reader.byteorder != "little":
        raise EditError(f"{path}: a big-endian file; set-metadata rewrites little-endian files only")
    metadata = reader.metadata
    for key in remove:
        if key not in metadata:
            raise EditError(f"{path}: has no key {key} to remove")
        metadata.remove(key)
    for change in parsed:
        existing = metadata[change.key] if change.key in metadata else None
        value = typed_value(change, existing)
        metadata.replace(change.key, value.value, value.type, value.element_type)
    target = Path(output) if output is not None else path
    # In place, the input is the target: the temporary file is renamed over it once complete.
    writer = GGUFWriter(target, metadata, alignment=reader.alignment, inputs=() if output is None else (path,))
    with writer:
        for t in reader.tensors:
            writer.add_tensor(t.name, t.shape, t.ggml_type)
        for t in reader.tensors:
            writer.write_tensor(t.name, t.data)
    return target
