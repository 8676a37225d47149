"""Shared helpers of the mamba / rwkv / whisper tests: tiny HF models, the documented name tables,
and reading converted files back through gguf-py (an independent GGUF reader)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ggufsmith.readers.lazy_tensor import LazyTensor

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architectures-other.md"


def numpy_state_dict(model) -> dict[str, np.ndarray]:
    """The model's parameters as float32 numpy arrays, copied (the model may change them later)."""
    return {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}


def lazy_source(state: dict[str, np.ndarray]) -> dict[str, LazyTensor]:
    return {k: LazyTensor.from_array(v, "F32", source=k) for k, v in state.items()}


def documented_names(arch: str) -> list[tuple[re.Pattern, str]]:
    """The HF -> GGUF rows of docs/architectures-other.md's table for `arch`, as (regex, template).

    `{N}` is a block number and `{weight,bias}` stands for either; a row whose HF side is
    "(computed)" has no HF tensor and is returned with the regex `(computed)`.
    """
    text = DOC.read_text(encoding="utf-8")
    marker = f"<!-- tensor-table: {arch} -->"
    assert marker in text, f"{DOC} has no tensor table for {arch}"
    rows = []
    for line in text.split(marker, 1)[1].splitlines()[3:]:
        if not line.startswith("|"):
            break
        hf, gguf = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:2])
        for part in (["weight", "bias"] if "{weight,bias}" in hf else [None]):
            h, g = hf, gguf
            if part:
                h, g = h.replace("{weight,bias}", part), g.replace("{weight,bias}", part)
            regex = re.escape(h).replace(r"\{N\}", r"(?P<N>\d+)")
            rows.append((re.compile(regex), g))
    return rows


def documented_gguf_name(rows: list[tuple[re.Pattern, str]], hf_name: str) -> str | None:
    for regex, template in rows:
        m = regex.fullmatch(hf_name)
        if m:
            return template.replace("{N}", m.groupdict().get("N") or "")
    return None


def read_gguf(path: Path):
    """gguf-py's reader: keys as {name: (value, type name)}, tensors as {name: (shape numpy order, type, data)}."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    keys = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            keys[field.name] = (field.contents(), f"ARRAY[{field.types[-1].name}]")
        else:
            keys[field.name] = (field.contents(), vtype.name)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[t.name] = (shape, t.tensor_type.name, np.asarray(t.data))
    return keys, tensors


def dequantized(entry) -> np.ndarray:
    """A tensor read by read_gguf as float32 in its numpy shape (gguf-py's own dequantizer)."""
    import gguf

    shape, type_name, data = entry
    qtype = gguf.GGMLQuantizationType[type_name]
    return gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(shape)


def convert_for_tests(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """Convert with ggufsmith's public API, as a user would."""
    import ggufsmith

    ggufsmith.convert(model_dir, out, outtype=outtype)
    return out
