"""The GGUF naming convention for output files: the name llama.cpp's converters give a file they
write into a folder (<basename>-<size label>-<finetune>-<version>-<ENCODING>.gguf, from the
general.* keys), and the `{ftype}` placeholder a given file name may hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata

G = Keys.General


def naming_fields(metadata: Metadata) -> dict[str, str]:
    """The parts of the GGUF naming convention from the general.* keys, each with spaces and slashes
    made dashes ("" when absent); the basename is general.name when there is no general.basename."""

    def dashed(value: Any) -> str:
        return "" if value is None else str(value).strip().replace(" ", "-").replace("/", "-")

    return {
        "basename": dashed(metadata.get(G.BASENAME) or metadata.get(G.NAME) or "ggml-model"),
        "size_label": dashed(metadata.get(G.SIZE_LABEL)), "finetune": dashed(metadata.get(G.FINETUNE)),
        "version": dashed(metadata.get(G.VERSION)), "name": dashed(metadata.get(G.NAME)),
    }


def default_file_name(metadata: Metadata, encoding: str, vocab_only: bool = False, adapter: bool = False) -> str:
    """The file name the GGUF spec's naming convention gives, as llama.cpp's converters name the file
    they write into a folder: <basename or name>-<size label>-<finetune>-<version>-<ENCODING>.gguf,
    <basename or name>-<finetune>-<version>-vocab.gguf for a vocab-only file, and ...-<ENCODING>-LoRA.gguf
    for a LoRA adapter (convert_lora_to_gguf.py)."""
    fields = naming_fields(metadata)
    if vocab_only:
        parts = [fields["basename"], fields["finetune"], fields["version"], "vocab"]
    else:
        parts = [fields[k] for k in ("basename", "size_label", "finetune", "version")] + [encoding.upper()]
    if adapter:
        parts.append("LoRA")
    return "-".join(p for p in parts if p) + ".gguf"


def named_output(dst: Path, metadata: Metadata, encoding: str, *, vocab_only: bool = False,
                 adapter: bool = False) -> Path:
    """The file written for the output `dst` once the type is known: in an existing folder, the
    naming convention's name (default_file_name); a name holding {ftype} ..., filled in; else `dst`."""
    if dst.is_dir():
        return dst / default_file_name(metadata, encoding, vocab_only, adapter)
    if has_type_template(dst.name):
        return dst.with_name(fill_type_template(dst.name, encoding))
    return dst


# An output name may hold the type to be filled in, as llama.cpp's converter allows
# ("model-{ftype}.gguf", useful with --outtype auto): lowercase or, spelt in capitals, uppercase.
_TYPE_TEMPLATES = ("{ftype}", "{outtype}", "{FTYPE}", "{OUTTYPE}")


def has_type_template(name: str) -> bool:
    return any(t in name for t in _TYPE_TEMPLATES)


def fill_type_template(name: str, outtype: str) -> str:
    for template in _TYPE_TEMPLATES:
        name = name.replace(template, outtype.upper() if template.isupper() else outtype.lower())
    return name
