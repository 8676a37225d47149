"""Models, importance matrices and whole-file checks against llama-quantize shared by
tests/test_requantize.py and tests/test_requantize_families.py.

A model is (HF folder, our F32 GGUF of it); the oracle (tests/requant_oracle.py) runs
llama_model_quantize on that F32 file, and ours must give the same file byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.converters.plan import OUTTYPES
from ggufsmith.converters.quantize_plan import QuantizeRequest
from ggufsmith.converters.requantize import quantize_gguf
from ggufsmith.quantize.imatrix import read_imatrix
from ggufsmith.quantize.presets import PRESETS, get_preset
from tests.llama_models import with_tokenizer
from tests.requant_oracle import assert_same_file, assert_same_tensors, llama_quantize, random_imatrix

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "examples" / "tiny-llama"
# Q1_0 has no fallback for the models' ffn rows of 320: llama.cpp and we refuse (tests/test_presets.py);
# test_q1_0_is_llama_quantize uses rows of 384
ALL_PRESETS = [p for p in PRESETS if p != "Q1_0"]


def build_models(specs: dict, tmp_path_factory, build: Callable[..., None]) -> dict[str, tuple[Path, Path]]:
    """name -> (HF folder, our F32 GGUF of it), for every name -> spec of `specs`: build(model_dir,
    *spec) saves the model with save_pretrained into a folder holding the tiny-llama tokenizer."""
    out = {}
    for name, spec in specs.items():
        model_dir = with_tokenizer(tmp_path_factory.mktemp(name), TOKENIZER)
        (model_dir / "model.safetensors").unlink()
        (model_dir / "config.json").unlink()
        build(model_dir, *spec)
        # in a directory of its own: two fixtures build models of the same name (q1_0_models)
        f32 = tmp_path_factory.mktemp(f"{name}-gguf") / f"{name}-f32.gguf"
        ggufsmith.convert(model_dir, f32, "f32")
        out[name] = (model_dir, f32)
    return out


def imatrix_files(models, tmp_path_factory):
    """name -> (imatrix file, values as llama.cpp gets them, kv overrides llama-quantize adds)."""
    out = {}
    for name, (_, f32) in models.items():
        out[name] = random_imatrix(f32, tmp_path_factory.mktemp("imatrix") / f"{name}.imatrix.gguf")
    return out


def preset_cases(cases: list[tuple[str, bool]]):
    """pytest's parametrize of a test's (preset, with_imatrix) over `cases`, with ids such as
    "Q4_K_M-imatrix" and "Q4_0-plain"."""
    return pytest.mark.parametrize(("preset", "with_imatrix"), cases,
                                   ids=[f"{p}-{'imatrix' if i else 'plain'}" for p, i in cases])


_llama_quantized: dict[tuple, Path] = {}


def llama_quantized(models, imatrices, tmp_path, model, preset, with_imatrix) -> Path:
    """llama_model_quantize's file of the model's F32 file at `preset` (with the model's importance
    matrix as llama-quantize hands it over), made once per session for a given F32 file (its path,
    inode and mtime) and request: the quantize and `convert --outtype` tests of a preset compare
    with the same file. Made (and its status checked) in the first asking test's tmp_path."""
    _, f32 = models[model]
    stat = Path(f32).stat()
    imatrix = str(imatrices[model][0]) if with_imatrix else None
    key = (str(Path(f32).resolve()), stat.st_ino, stat.st_mtime_ns, preset, imatrix)
    if key not in _llama_quantized:
        theirs = tmp_path / f"theirs-{preset}{'-imatrix' if with_imatrix else ''}.gguf"
        if with_imatrix:
            _, values, overrides = imatrices[model]
            assert llama_quantize(f32, theirs, get_preset(preset).file_type, imatrix=values, kv_overrides=overrides) == 0
        else:
            assert llama_quantize(f32, theirs, get_preset(preset).file_type) == 0
        _llama_quantized[key] = theirs
    return _llama_quantized[key]


def check_quantize(models, imatrices, tmp_path, model, preset, with_imatrix):
    """`ggufsmith quantize` of the model's F32 file is llama-quantize's file byte for byte."""
    _, f32 = models[model]
    theirs, ours = llama_quantized(models, imatrices, tmp_path, model, preset, with_imatrix), tmp_path / "ours.gguf"
    if with_imatrix:
        path, _, _ = imatrices[model]
        quantize_gguf(f32, ours, QuantizeRequest(preset, imatrix=read_imatrix(path)))
    else:
        quantize_gguf(f32, ours, preset)
    assert_same_file(ours, theirs)


def check_convert_preset(models, imatrices, tmp_path, model, preset, with_imatrix, run=False):
    """`ggufsmith convert --outtype PRESET` of the checkpoint is llama-quantize's file of the F32
    conversion; with `run`, the file also loads and gives finite logits in llama.cpp."""
    import llama_cpp

    model_dir, f32 = models[model]
    theirs, ours = llama_quantized(models, imatrices, tmp_path, model, preset, with_imatrix), tmp_path / "ours.gguf"
    kwargs = {"imatrix": str(imatrices[model][0])} if with_imatrix else {}
    ggufsmith.convert(model_dir, ours, preset.lower(), **kwargs)
    if preset.lower() in OUTTYPES:
        # f32/f16/bf16/q8_0 keep convert_hf_to_gguf.py's meaning (its tensor order and metadata);
        # the tensors are still llama-quantize's
        assert_same_tensors(ours, theirs)
    else:
        assert_same_file(ours, theirs)
    if run:  # the file loads and runs in llama.cpp: finite logits for a prompt
        llm = llama_cpp.Llama(model_path=str(ours), n_ctx=64, logits_all=True, verbose=False)
        tokens = llm.tokenize(b"Hello world, this is a test.")
        llm.eval(tokens)
        logits = np.asarray(llm.scores[: len(tokens)])
        assert np.isfinite(logits).all() and logits.std() > 0
        llm.close()
