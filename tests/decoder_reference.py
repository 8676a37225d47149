"""Run llama.cpp's own convert_hf_to_gguf.py (fetched by tests/llamacpp_reference.py) on a model
folder, and read GGUF files with its gguf-py.

It names BPE pre-tokenizers by hashing the tokens of a test string, which knows only published
tokenizers, so for the tokenizers trained in the tests it is told the name (FORCE_PRE); everything
else is its own doing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.llamacpp_reference import reference_dir, reference_env

_RUNNER = """
import os, runpy, sys
llama = sys.argv.pop(1)
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ["FORCE_PRE"]
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def reference_convert(model_dir: Path, out: Path, outtype: str = "f32", pre: str = "gpt-2",
                      extra_args: tuple[str, ...] = ()) -> Path:
    """extra_args: more options for the converter (e.g. --no-mtp)."""
    env = reference_env() | {"FORCE_PRE": pre}
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(reference_dir()), str(model_dir), "--outfile", str(out),
         "--outtype", outtype, *extra_args],
        env=env, capture_output=True, text=True, timeout=900,
    )
    if result.returncode:
        raise AssertionError(f"convert_hf_to_gguf.py failed on {model_dir}:\n{result.stderr[-3000:]}")
    return out


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
