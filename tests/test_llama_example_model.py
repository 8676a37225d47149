"""The example model the README's first command converts: examples/tiny-llama.

    ggufsmith convert examples/tiny-llama tiny-llama-f16.gguf --outtype f16

must work from the repository root and give a file llama.cpp runs like transformers runs the
checkpoint; and the committed folder must be what scripts/make_example_model.py makes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.llamacpp_reference import run_reference_converter
from tests.test_llama_convert import TOLERANCE, assert_same_file, llamacpp_logits, relative_error, transformers_logits

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tiny-llama"
TEXT = "The llama reads the weights. Das Lama liest große Dateien. Лама пишет файл GGUF. 羊驼读取文件。 12345 🦙"


@pytest.fixture(scope="module")
def example_f16(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("example") / "tiny-llama-f16.gguf"
    result = subprocess.run(
        [sys.executable, "-m", "ggufsmith", "convert", "examples/tiny-llama", str(out), "--outtype", "f16"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_readme_command_gives_a_file_llamacpp_runs_like_transformers(example_f16):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(EXAMPLE).encode(TEXT)
    expected = transformers_logits(EXAMPLE, ids)
    got = llamacpp_logits(example_f16, ids)
    # The checkpoint is bf16; f16 holds these values exactly, so only llama.cpp's f16 matmul rounds.
    assert relative_error(got, expected) < TOLERANCE["f16"]
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


def test_example_f16_is_the_same_file_as_llamacpp_converters(example_f16, tmp_path):
    # From a bf16 checkpoint, as most published ones are.
    assert_same_file(example_f16, run_reference_converter(EXAMPLE, tmp_path / "reference-f16.gguf", "f16"))


def test_example_tokenizes_in_llamacpp_like_transformers(example_f16):
    import llama_cpp
    from transformers import AutoTokenizer

    llm = llama_cpp.Llama(model_path=str(example_f16), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(TEXT.encode("utf-8"), add_bos=True) == AutoTokenizer.from_pretrained(EXAMPLE).encode(TEXT)
    finally:
        llm.close()


def test_committed_example_is_what_the_script_makes(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "make_example_model.py"), "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    committed = sorted(p.name for p in EXAMPLE.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (EXAMPLE / name).read_bytes(), name
    assert sum((EXAMPLE / name).stat().st_size for name in committed) < 5_000_000


def test_example_logits_are_not_degenerate():
    # A test model whose logits are nearly uniform would let a broken conversion pass.
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(EXAMPLE).encode(TEXT)
    logits = transformers_logits(EXAMPLE, ids)
    assert logits.std(axis=-1).min() > 0.5
    assert len(set(np.argmax(logits, axis=-1).tolist())) > 3


def test_readme_command_on_a_fresh_install(tmp_path):
    """`pip install .` into an empty virtual environment (numpy and tqdm only: no torch,
    sentencepiece, protobuf or transformers), then the README's convert command."""
    import os
    import venv

    from transformers import AutoTokenizer

    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / ("Scripts" if os.name == "nt" else "bin")
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(REPO)],
                             capture_output=True, text=True, timeout=900)
    if install.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"pip install . failed: {install.stderr[-2000:]}")
        pytest.skip(f"pip install . failed (offline?): {install.stderr.strip().splitlines()[-1:]}")
    out = tmp_path / "tiny-llama-f16.gguf"
    result = subprocess.run([str(bin_dir / "ggufsmith"), "convert", "examples/tiny-llama", str(out), "--outtype", "f16"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ids = AutoTokenizer.from_pretrained(EXAMPLE).encode(TEXT)
    assert relative_error(llamacpp_logits(out, ids), transformers_logits(EXAMPLE, ids)) < TOLERANCE["f16"]
