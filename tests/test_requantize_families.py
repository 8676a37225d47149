"""`convert --outtype PRESET` against llama.cpp's own quantizer on the families with their own
llama-quantize rules: state-space models (mamba2, the qwen35 hybrid) and gpt-oss (its float and its
MXFP4 checkpoint).

Oracle and checks as tests/test_requantize.py's (tests/requant_models.py): llama_model_quantize on
the F32 GGUF of the same checkpoint gives the same file byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ggufsmith
from ggufsmith.constants import GGMLType
from ggufsmith.converters.plan import OUTTYPES
from ggufsmith.converters.quantize_plan import QuantizeRequest
from ggufsmith.quantize.presets import get_preset
from tests.llama_models import randomize_weights
from tests.requant_models import ALL_PRESETS, build_models, check_convert_preset, imatrix_files, preset_cases
from tests.requant_oracle import PRESETS_NEEDING_IMATRIX, assert_same_file, assert_same_tensors, llama_quantize

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")


# Issue 17: llama-quantize's rules for state-space models (which recurrent tensors stay F32: A, D,
# the conv kernel, the grouped norm; which are quantized: the in/out projections), every preset
# through `convert --outtype PRESET`, and the presets that need an importance matrix with one.
SSM_MODELS = {  # name -> (transformers config class, model class, config fields)
    # hidden 256 so that the K-quants' 256-blocks fit ssm_in's rows; in_proj: 2 x 512 + 2 x 2 x 16 + 8 rows
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM",
               dict(hidden_size=256, num_hidden_layers=2, num_heads=8, head_dim=64, n_groups=2, state_size=16,
                    expand=2, chunk_size=16)),
    # a hybrid: gated delta-net blocks around one attention block (llama-quantize's rules for attn_qkv,
    # attn_gate, ssm_* and for which blocks hold attention), 4 value heads on 2 key heads
    "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
               dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
                    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                    linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
                    linear_num_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2]})),
}
SSM_CASES = [(p, p in PRESETS_NEEDING_IMATRIX) for p in ALL_PRESETS] + [("Q4_K_M", True)]


def _build_ssm(model_dir: Path, config_class: str, model_class: str, config: dict) -> None:
    import torch
    import transformers

    torch.manual_seed(3)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(vocab_size=2000, **config))
    randomize_weights(model.eval(), 3)
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def ssm_models(tmp_path_factory):
    return build_models(SSM_MODELS, tmp_path_factory, _build_ssm)


@pytest.fixture(scope="module")
def ssm_imatrices(ssm_models, tmp_path_factory):
    return imatrix_files(ssm_models, tmp_path_factory)


@pytest.mark.slow
@preset_cases(SSM_CASES)
@pytest.mark.parametrize("model", list(SSM_MODELS))
def test_convert_every_preset_ssm(ssm_models, ssm_imatrices, tmp_path, model, preset, with_imatrix):
    check_convert_preset(ssm_models, ssm_imatrices, tmp_path, model, preset, with_imatrix)


# Issue 15, gpt-oss: every preset through `convert --outtype PRESET`, with and without an importance
# matrix, on the float checkpoint (experts stored (in, out), gate and up interleaved, expert biases);
# and on the MXFP4 checkpoint, whose f32 conversion keeps the experts MXFP4: MXFP4_MOE copies them,
# another preset re-quantizes them only with --allow-requantize, both as llama-quantize does to the
# f32 conversion.
GPTOSS_SHAPE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                    intermediate_size=320, num_local_experts=4)
GPTOSS_CASES = [(p, p in PRESETS_NEEDING_IMATRIX) for p in ALL_PRESETS] + [("Q4_K_M", True), ("MXFP4_MOE", True)]


@pytest.fixture(scope="module")
def gptoss_models(tmp_path_factory):
    from tests.test_arch_gptoss import VOCAB, build_gptoss, save_mxfp4_checkpoint
    from tests.tokenizer_helpers import train_bpe

    root = tmp_path_factory.mktemp("gptoss")
    train_bpe(root / "float", "qwen2", vocab_size=VOCAB)
    build_gptoss(root / "float", **GPTOSS_SHAPE)
    save_mxfp4_checkpoint(root / "float", root / "mxfp4")
    out = {}
    for name in ("float", "mxfp4"):
        ggufsmith.convert(root / name, root / f"{name}-f32.gguf", "f32")
        out[name] = (root / name, root / f"{name}-f32.gguf")
    return out


@pytest.fixture(scope="module")
def gptoss_imatrices(gptoss_models, tmp_path_factory):
    return imatrix_files(gptoss_models, tmp_path_factory)


@pytest.mark.slow
@preset_cases(GPTOSS_CASES)
def test_convert_every_preset_gptoss(gptoss_models, gptoss_imatrices, tmp_path, preset, with_imatrix):
    check_convert_preset(gptoss_models, gptoss_imatrices, tmp_path, "float", preset, with_imatrix,
                          run=preset in ("Q4_K_M", "MXFP4_MOE"))


@pytest.mark.parametrize("preset", ["MXFP4_MOE", "Q8_0", "Q4_K_M"])
def test_presets_on_the_mxfp4_checkpoint(gptoss_models, tmp_path, preset):
    model_dir, f32 = gptoss_models["mxfp4"]
    file_type = get_preset(preset).file_type
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    if preset != "MXFP4_MOE":  # the experts' type changes: refused unless asked for, by both
        assert llama_quantize(f32, theirs, file_type) != 0
        with pytest.raises(ggufsmith.errors.QuantizationError, match="already MXFP4"):
            ggufsmith.convert(model_dir, ours, quantize_request=QuantizeRequest(preset))
    assert llama_quantize(f32, theirs, file_type, allow_requantize=True) == 0
    ggufsmith.convert(model_dir, ours, quantize_request=QuantizeRequest(preset, allow_requantize=True))
    if preset.lower() in OUTTYPES:
        assert_same_tensors(ours, theirs)
    else:
        assert_same_file(ours, theirs)
    types = {t.name: GGMLType(int(t.tensor_type)) for t in gguf.GGUFReader(ours).tensors}
    assert (types["blk.0.ffn_up_exps.weight"] == GGMLType.MXFP4) == (preset == "MXFP4_MOE")
