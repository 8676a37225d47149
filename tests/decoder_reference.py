"""Run llama.cpp's own convert_hf_to_gguf.py (fetched by tests/llamacpp_reference.py) on a model
folder, and read GGUF files with its gguf-py.

It names BPE pre-tokenizers by hashing the tokens of a test string, which knows only published
tokenizers, so for the tokenizers trained in the tests it is told the name (FORCE_PRE); everything
else is its own doing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.llamacpp_reference import run_reference_converter


def reference_convert(model_dir: Path, out: Path, outtype: str = "f32", pre: str = "gpt-2",
                      extra_args: tuple[str, ...] = ()) -> Path:
    """extra_args: more options for the converter (e.g. --no-mtp)."""
    return run_reference_converter(model_dir, out, outtype, *extra_args, pre=pre, timeout=900)


def read_gguf(path: Path) -> tuple[dict, dict]:
    """(key -> (value, value type), tensor name -> (raw data, ggml type)), as gguf-py reads the file."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys = {}
    for field in reader.fields.values():
        if not field.name.startswith("GGUF."):
            keys[field.name] = (field.contents(), field.types[0] if field.types else None)
    tensors = {t.name: (np.array(t.data), t.tensor_type) for t in reader.tensors}
    return keys, tensors
