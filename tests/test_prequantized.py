"""Pre-quantized releases (issue 19): FP8 checkpoints as DeepSeek V3 / Qwen3-FP8 ship them (block-wise
`weight_scale_inv`) and llm-compressor's compressed-tensors FP8 (per-channel `weight_scale`), made
here from a small Qwen3 with torch's own float8 type, converted by ggufsmith and run by llama.cpp.

Reference: transformers' forward with the weights dequantized by torch (fp8.float() x scale, the
scale repeated over its block or row). The f32 file is also compared with llama.cpp's
convert_hf_to_gguf.py on the same FP8 folder, which dequantizes the same way.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import ggufsmith
from ggufsmith.errors import ConversionError
from tests.decoder_reference import reference_convert
from tests.family_models import llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import EXPLICIT_SPECIAL_IDS, assert_same_file
from tests.prequantized_checkpoints import MODEL_CLASS, small_float_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llama_cpp")

BLOCK = 128
FP8_MAX = 448.0
FORMATS = {
    "fp8-blocks": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]},
    "compressed-tensors-channel": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}}},
        "ignore": ["lm_head"],
    },
}


def _quantize(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 weight, the scale tensor the checkpoint stores, the dequantized weight torch computes)."""
    rows, cols = weight.shape
    if fmt == "fp8-blocks":
        nr, nc = -(-rows // BLOCK), -(-cols // BLOCK)
        padded = torch.zeros(nr * BLOCK, nc * BLOCK)
        padded[:rows, :cols] = weight
        amax = padded.reshape(nr, BLOCK, nc, BLOCK).abs().amax(dim=(1, 3))
        scale = (amax / FP8_MAX).clamp(min=1e-12)
        full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    else:
        scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        full = scale
    fp8 = (weight / full).to(torch.float8_e4m3fn)
    return fp8, scale.float(), fp8.float() * full


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """format -> (FP8 folder, prompt ids, transformers' logits with the dequantized weights)."""
    from safetensors.torch import load_file, save_file

    import transformers

    root = tmp_path_factory.mktemp("prequantized")
    original = small_float_model(root / "bf16")
    state = load_file(original / "model.safetensors")
    out = {}
    for fmt, quant_config in FORMATS.items():
        folder = root / fmt
        shutil.copytree(original, folder)
        stored, dequantized = {}, {}
        for name, tensor in state.items():
            if name.endswith("proj.weight"):  # every Linear of the blocks; embeddings, norms and lm_head stay
                fp8, scale, values = _quantize(tensor.float(), fmt)
                stored[name] = fp8
                stored[name + ("_scale_inv" if fmt == "fp8-blocks" else "_scale")] = scale
                dequantized[name] = values
            else:
                stored[name] = dequantized[name] = tensor
        save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = quant_config
        (folder / "config.json").write_text(json.dumps(config, indent=2))

        model = getattr(transformers, MODEL_CLASS).from_pretrained(original, dtype=torch.float32).eval()
        model.load_state_dict({k: v.float() for k, v in dequantized.items()}, strict=True)
        ids = prompt_ids(folder)
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0].numpy()
        out[fmt] = folder, ids, expected
    return out


@pytest.mark.slow
@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_logits_match_the_dequantized_model(models, tmp_path, fmt, outtype):
    folder, ids, expected = models[fmt]
    out = tmp_path / f"{fmt}-{outtype}.gguf"
    ggufsmith.convert(folder, out, outtype=outtype)
    error = relative_error(llamacpp_logits(out, ids), expected)
    assert error <= {"f32": 1e-3, "q8_0": 0.3}[outtype], f"{fmt} {outtype}: {error:.2e} of the logits' std"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_same_file_as_convert_hf_to_gguf(models, tmp_path, fmt):
    folder = models[fmt][0]
    ours = tmp_path / "ours.gguf"
    ggufsmith.convert(folder, ours, outtype="f32")
    theirs = reference_convert(folder, tmp_path / "reference.gguf", "f32", pre="qwen2")
    assert_same_file(ours, theirs, EXPLICIT_SPECIAL_IDS)


def test_scales_are_applied_per_block_and_rows_stream(models):
    """Row slices (the pipeline's pieces) equal the whole tensor, and equal torch's dequantization."""
    from safetensors.torch import load_file

    from ggufsmith.readers.checkpoint import open_checkpoint

    folder = models["fp8-blocks"][0]
    raw = load_file(folder / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"  # (256, 320): the last column block is cut to 64
    expected = (raw[name].float() * raw[name + "_scale_inv"].repeat_interleave(BLOCK, 0)
                .repeat_interleave(BLOCK, 1)[:, :320]).numpy()
    with open_checkpoint(folder) as checkpoint:
        tensor = checkpoint.tensors[name]
        assert name + "_scale_inv" not in checkpoint.tensors
        np.testing.assert_array_equal(tensor.load(), expected)
        np.testing.assert_array_equal(np.concatenate([tensor.load_rows(0, 100), tensor.load_rows(100, 256)]), expected)


@pytest.mark.parametrize("damage, message", [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported"),
    ({"weight_block_size": [128]}, "weight_block_size"),
    ({"weight_block_size": [64, 64]}, "does not give one scale per 64 x 64 block"),
])
def test_damaged_quantization_config_is_refused(models, tmp_path, damage, message):
    folder = tmp_path / "damaged"
    shutil.copytree(models["fp8-blocks"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] |= damage
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=message):
        ggufsmith.convert(folder, tmp_path / "out.gguf", outtype="f32")
    assert not (tmp_path / "out.gguf").exists()


def test_fp8_without_quantization_config_is_refused(models, tmp_path):
    folder = tmp_path / "no-config"
    shutil.copytree(models["fp8-blocks"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="F8_E4M3 without a scale"):
        ggufsmith.convert(folder, tmp_path / "out.gguf", outtype="f32")
