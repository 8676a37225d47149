"""Run llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python source tree) on a model folder.

It names BPE pre-tokenizers by hashing the tokens of a test string, which knows only published
tokenizers, so for the tokenizers trained in the tests it is told the name (FORCE_PRE); everything
else is its own doing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_SOURCE", "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))

_RUNNER = """
import os, runpy, sys
llama = sys.argv.pop(1)
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base as base
if os.environ.get("FORCE_PRE"):
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ["FORCE_PRE"]
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def available() -> bool:
    return (LLAMA_CPP / "convert_hf_to_gguf.py").is_file()


def reference_convert(model_dir: Path, out: Path, outtype: str = "f32", pre: str = "gpt-2") -> Path:
    env = dict(os.environ, FORCE_PRE=pre)
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(LLAMA_CPP), str(model_dir), "--outfile", str(out), "--outtype", outtype],
        env=env, capture_output=True, text=True, timeout=600,
    )
    if result.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {model_dir}:\n{result.stderr[-3000:]}")
    return out


def read_gguf(path: Path) -> tuple[dict, dict]:
    """(key -> (value, gguf-py value type), tensor name -> (numpy data, ggml type)) of a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        keys[field.name] = (field.contents(), field.types[0] if field.types else None)
    tensors = {t.name: (np.array(t.data), t.tensor_type) for t in reader.tensors}
    return keys, tensors


import numpy as np  # noqa: E402  (used by read_gguf; kept below the runner text for readability)
