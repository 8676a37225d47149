"""Every preset on tests/test_requantize.py's qwen3moe (8 experts, issue 15's per-expert layout),
through `ggufsmith quantize` and through `convert --outtype PRESET`, against llama.cpp's own
quantizer: the same file byte for byte (oracle and checks: tests/requant_models.py).

A file of its own so that under `--dist loadfile` these ~6 minutes run beside the rest of
test_requantize.py's instead of after them; the model, its F32 file and its importance matrix are
test_requantize.py's (the same builder, seed and shape).
"""

from __future__ import annotations

import pytest

from tests.requant_models import build_models, check_convert_preset, check_quantize, imatrix_files, preset_cases
from tests.test_requantize import ALL_PRESETS, MODELS, SLOW_CASES, _build, _every_case

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """qwen3moe -> (HF folder, our F32 GGUF of it)."""
    return build_models({"qwen3moe": MODELS["qwen3moe"]}, tmp_path_factory, _build)


@pytest.fixture(scope="module")
def imatrices(models, tmp_path_factory):
    return imatrix_files(models, tmp_path_factory)


@pytest.mark.slow
@preset_cases(SLOW_CASES)
@pytest.mark.parametrize("model", ["qwen3moe"])
def test_quantize_is_llama_quantize_every_preset(models, imatrices, tmp_path, model, preset, with_imatrix):
    check_quantize(models, imatrices, tmp_path, model, preset, with_imatrix)


# Issue 15: every preset through `convert --outtype PRESET` on the per-expert qwen3moe, with and
# without an importance matrix, is llama_model_quantize on the f32 conversion (the plain outtypes
# f32/f16/bf16/q8_0 take none: convert refuses one for them).
QWEN3MOE_CASES = _every_case(ALL_PRESETS)


@pytest.mark.slow
@preset_cases(QWEN3MOE_CASES)
def test_convert_every_preset_qwen3moe(models, imatrices, tmp_path, preset, with_imatrix):
    check_convert_preset(models, imatrices, tmp_path, "qwen3moe", preset, with_imatrix)
