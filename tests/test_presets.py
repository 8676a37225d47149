"""Per-tensor type choice of every preset, against llama.cpp's own quantizer (llama_model_quantize)."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize.presets import (
    PRESETS,
    ModelFacts,
    QuantizeOptions,
    TypeChooser,
    get_preset,
    llama_tensor_order,
    requires_importance,
)
from tests.llama_gguf_models import write_llama_gguf
from tests.requant_oracle import PRESETS_NEEDING_IMATRIX, llama_quantize, llama_quantize_types

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

MODELS = {
    "gqa": dict(),
    "fallback-to-legacy": dict(ff=320),  # ffn_down rows of 320: K-quants fall back to 32-blocks
    "fallback-to-f16-tied": dict(ff=336, tied=True),  # rows of 336: not even 32 fits
    "moe8": dict(n_expert=8, n_layer=4, ff=256),
    "mha-16-layers": dict(n_kv=8, n_layer=16, hidden=512),
    # One attn_qkv per block (phi3, bloom, gptneox...): llama.cpp gives it the attn_v rules (its
    # separate ATTENTION_QKV branch comes after the attn_v one and is never reached).
    "fused-qkv": dict(fused_qkv=True),
    "falcon-fused-qkv": dict(fused_qkv=True, arch="falcon", n_kv=1),  # falcon-7b: one kv head, its own rules
    # Two ffn_down per block (routed and shared experts): the IQ2/IQ1 presets' "first n_layer/8
    # ffn_down" counts tensors against the block count
    "moe4-shared-8-layers": dict(n_expert=4, n_layer=8, ff=256, shared_expert=True),
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("preset-models")
    return {name: (root / f"{name}.gguf", cfg, write_llama_gguf(root / f"{name}.gguf", **cfg)) for name, cfg in MODELS.items()}


def _facts(cfg) -> ModelFacts:
    return ModelFacts(cfg.get("arch", "llama"), cfg.get("n_layer", 8), cfg.get("n_head", 8), cfg.get("n_kv", 2), cfg.get("n_expert", 0))


def _llama_cpp_types(src, dst, preset, imatrix=None, **params) -> dict[str, GGMLType]:
    """llama-quantize's choice, from its dry run (the same selection, without quantizing the data:
    the data's bytes are compared whole-file in tests/test_requantize.py and the arch tests)."""
    status, types = llama_quantize_types(src, preset.file_type, imatrix=imatrix, **params)
    assert status == 0
    return {name: GGMLType[ggml_name.upper()] for name, ggml_name in types.items()}


def _our_types(shapes, cfg, options) -> dict[str, GGMLType]:
    names = [n for n, _ in shapes]
    chooser = TypeChooser(options, _facts(cfg), names)
    return {n: chooser.choose(n, dict(shapes)[n], GGMLType.F32) for n in llama_tensor_order(names)}


def _imatrix_for(shapes, rng):
    # llama.cpp's layout: one weight per column, per expert for 3-D tensors.
    return {
        name: rng.uniform(0.01, 2.0, size=shape[-1] * (shape[0] if len(shape) == 3 else 1))
        for name, shape in shapes
        if len(shape) >= 2
    }


NEED_IMATRIX = PRESETS_NEEDING_IMATRIX


@pytest.mark.parametrize("preset_name", [p for p in PRESETS if p != "F32" and p not in NEED_IMATRIX])
@pytest.mark.parametrize("model", list(MODELS))
def test_types_match_llama_quantize(model_files, tmp_path, preset_name, model):
    src, cfg, shapes = model_files[model]
    preset = get_preset(preset_name)
    if preset_name == "Q1_0" and model.startswith("fallback"):
        # rows of 320 or 336 do not fit Q1_0's blocks of 128, and it has no fallback type
        assert llama_quantize(src, tmp_path / "out.gguf", preset.file_type) != 0
        with pytest.raises(QuantizationError, match="no fallback type for Q1_0"):
            _our_types(shapes, cfg, QuantizeOptions(preset))
        return
    theirs = _llama_cpp_types(src, tmp_path / "out.gguf", preset)
    ours = _our_types(shapes, cfg, QuantizeOptions(preset))
    assert ours == theirs


@pytest.mark.parametrize("preset_name", ["Q4_0", "Q5_0", "Q3_K_M", "Q4_K_M", "IQ4_NL", "IQ4_XS"] + NEED_IMATRIX)
@pytest.mark.parametrize("model", ["gqa", "moe8", "fallback-to-legacy", "mha-16-layers", "moe4-shared-8-layers"])
def test_types_with_imatrix_match_llama_quantize(model_files, tmp_path, preset_name, model):
    src, cfg, shapes = model_files[model]
    preset = get_preset(preset_name)
    imatrix = _imatrix_for(shapes, np.random.default_rng(1))
    theirs = _llama_cpp_types(src, tmp_path / "out.gguf", preset, imatrix=imatrix)
    ours = _our_types(shapes, cfg, QuantizeOptions(preset, has_imatrix=True))
    assert ours == theirs


@pytest.mark.parametrize("preset_name", NEED_IMATRIX)
def test_presets_that_require_an_imatrix_like_llama_cpp(model_files, tmp_path, preset_name):
    src, cfg, shapes = model_files["gqa"]
    preset = get_preset(preset_name)
    assert llama_quantize(src, tmp_path / "o.gguf", preset.file_type) != 0
    ours = _our_types(shapes, cfg, QuantizeOptions(preset))
    assert any(requires_importance(n, t, preset) for n, t in ours.items())


OPTION_CASES = {
    "pure": (dict(pure=True), dict(pure=True)),
    "output-q8": (dict(output_tensor_type=GGMLType.Q8_0), dict(output_tensor_type=int(GGMLType.Q8_0))),
    "embd-q4k": (dict(token_embedding_type=GGMLType.Q4_K), dict(token_embedding_type=int(GGMLType.Q4_K))),
    "leave-output": (dict(leave_output_tensor=True), dict(quantize_output_tensor=False)),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
@pytest.mark.parametrize("preset_name", ["Q4_K_M", "Q3_K_S", "Q5_1"])
def test_options_match_llama_quantize(model_files, tmp_path, case, preset_name):
    src, cfg, shapes = model_files["fallback-to-legacy"]
    preset = get_preset(preset_name)
    ours_opts, their_params = OPTION_CASES[case]
    theirs = _llama_cpp_types(src, tmp_path / "out.gguf", preset, **their_params)
    ours = _our_types(shapes, cfg, QuantizeOptions(preset, **ours_opts))
    assert ours == theirs
