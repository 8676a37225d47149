"""Pre-quantized integer releases (issue 19): GPTQ (2, 3, 4, 8 bits, act order, both zero-point
formats), AWQ (GEMM) and compressed-tensors (pack-quantized int4/int8 by group, channel
or tensor, symmetric and not; int-quantized, naive-quantized) made from a small Qwen3
(tests/prequantized_checkpoints.py), converted by ggufsmith and run by llama.cpp.

References: the weights the packers' integer codes stand for (GPTQ, AWQ), or that the
compressed-tensors library decompresses its own checkpoint to; transformers' forward with those
weights for the logits; llama.cpp's convert_hf_to_gguf.py on the same folder for the formats it reads.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ggufsmith
from ggufsmith.errors import ConversionError
from tests.damaged_inputs import edit_json
from tests.decoder_reference import reference_convert
from tests.family_models import llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import EXPLICIT_SPECIAL_IDS, assert_same_file
from tests.prequantized_checkpoints import (FIELDS, GROUP, MODEL_CLASS, awq_tensors, compressed_tensors_checkpoint,
                                            gptq_tensors, small_float_model, write_packed_checkpoint)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llama_cpp")
pytest.importorskip("compressed_tensors")


def _gptq(bits: int, desc_act: bool, sym: bool, checkpoint_format: str):
    config = {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": desc_act, "sym": sym,
              "checkpoint_format": checkpoint_format, "damp_percent": 0.01, "true_sequential": True}
    rng = np.random.default_rng(bits)
    return "gptq", config, lambda weight: gptq_tensors(weight, bits, desc_act, sym, checkpoint_format, rng)


AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None}

# name -> ("gptq" | "awq", config, pack) or ("compressed-tensors", format, bits, strategy, symmetric)
VARIANTS = {
    "gptq-4bit-act-order": _gptq(4, desc_act=True, sym=False, checkpoint_format="gptq"),
    "gptq-8bit-sym-v2": _gptq(8, desc_act=False, sym=True, checkpoint_format="gptq_v2"),
    "gptq-2bit": _gptq(2, desc_act=False, sym=False, checkpoint_format="gptq"),
    "gptq-3bit-act-order": _gptq(3, desc_act=True, sym=False, checkpoint_format="gptq_v2"),
    "awq-4bit": ("awq", AWQ_CONFIG, awq_tensors),
    "pack-int4-group-asym": ("compressed-tensors", "pack-quantized", 4, "group", False),
    "pack-int8-channel-sym": ("compressed-tensors", "pack-quantized", 8, "channel", True),
    "pack-int4-channel-asym": ("compressed-tensors", "pack-quantized", 4, "channel", False),
    "pack-int4-tensor-sym": ("compressed-tensors", "pack-quantized", 4, "tensor", True),
    "int8-channel-sym": ("compressed-tensors", "int-quantized", 8, "channel", True),
    "naive-int8-group-asym": ("compressed-tensors", "naive-quantized", 8, "group", False),
    "int8-w8a8-static": ("compressed-tensors", "int-quantized", 8, "channel", True, True),  # + input_scale/zero_point
}
# llama.cpp's converter reads these the same way (it has no AWQ nor 3-bit GPTQ; pack-quantized by
# group only; int-quantized without zero points)
LLAMACPP_READS = ["gptq-4bit-act-order", "gptq-8bit-sym-v2", "gptq-2bit", "pack-int4-group-asym", "int8-channel-sym"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (folder, the dequantized state dict)."""
    root = tmp_path_factory.mktemp("integer-quantized")
    original = small_float_model(root / "float")
    out = {}
    for name, variant in VARIANTS.items():
        folder = root / name
        if variant[0] == "compressed-tensors":
            state = compressed_tensors_checkpoint(original, folder, MODEL_CLASS, *variant[1:])
        else:
            state = write_packed_checkpoint(original, folder, variant[1], variant[2])
        out[name] = folder, state
    return out


@pytest.fixture(scope="module")
def expected_logits(checkpoints):
    """variant -> (prompt ids, transformers' logits with the dequantized weights)."""
    import transformers

    out = {}
    for name, (folder, state) in checkpoints.items():
        model = getattr(transformers, MODEL_CLASS)(transformers.Qwen3Config(**FIELDS)).eval()
        model.load_state_dict({k: torch.from_numpy(np.asarray(state[k], np.float32)) for k in model.state_dict()})
        ids = prompt_ids(folder)
        with torch.no_grad():
            out[name] = ids, model(torch.tensor([ids])).logits[0].numpy()
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_weights_are_the_dequantized_values(checkpoints, variant):
    """Every dequantized weight equals the reference bit for bit, and row slices (the pipeline's
    pieces) equal the whole; the packed companions are gone."""
    from ggufsmith.readers.checkpoint import open_checkpoint

    folder, state = checkpoints[variant]
    with open_checkpoint(folder) as checkpoint:
        names = [n for n in checkpoint.tensors if n.endswith("proj.weight")]
        assert len(names) == 14 and not [n for n in checkpoint.tensors if n.endswith(
            ("qweight", "qzeros", "scales", "g_idx", "_packed", "_scale", "_zero_point", "_shape"))]
        for name in names:
            tensor = checkpoint.tensors[name]
            np.testing.assert_array_equal(tensor.load(), np.asarray(state[name], np.float32), err_msg=name)
        down = checkpoint.tensors["model.layers.1.mlp.down_proj.weight"]  # (256, 320)
        np.testing.assert_array_equal(np.concatenate([down.load_rows(0, 13), down.load_rows(13, 256)]), down.load())


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_the_dequantized_model(checkpoints, expected_logits, tmp_path, variant):
    ids, expected = expected_logits[variant]
    out = tmp_path / f"{variant}.gguf"
    ggufsmith.convert(checkpoints[variant][0], out, outtype="f32")
    error = relative_error(llamacpp_logits(out, ids), expected)
    assert error <= 1e-3, f"{variant}: {error:.2e} of the logits' std"


@pytest.mark.slow
@pytest.mark.parametrize("variant", LLAMACPP_READS)
def test_same_file_as_convert_hf_to_gguf(checkpoints, tmp_path, variant):
    folder = checkpoints[variant][0]
    ours = tmp_path / "ours.gguf"
    ggufsmith.convert(folder, ours, outtype="f32")
    theirs = reference_convert(folder, tmp_path / "reference.gguf", "f32", pre="qwen2")
    assert_same_file(ours, theirs, EXPLICIT_SPECIAL_IDS, same_order=False)


def _with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    edit_json(dst / "config.json",
              lambda config: config | {"quantization_config": config["quantization_config"] | changes})
    return dst


@pytest.mark.parametrize("variant, changes, message", [
    ("gptq-4bit-act-order", {"bits": 5}, "bits is 5; expected one of 2, 3, 4, 8"),
    ("gptq-4bit-act-order", {"checkpoint_format": "marlin"}, "checkpoint_format/format 'marlin'"),
    ("gptq-4bit-act-order", {"is_marlin_format": True}, "checkpoint_format"),
    ("gptq-4bit-act-order", {"format": "gptq_p"}, "format 'gptq_p'"),  # GPTQModel's planar packing
    ("gptq-4bit-act-order", {"bits": 8}, "expected [80, 256] (320 inputs of 8 bits)"),
    ("awq-4bit", {"version": "gemv"}, "AWQ version 'gemv'"),
    ("awq-4bit", {"bits": 8}, "bits is 8; expected 4"),
])
def test_quantization_config_that_cannot_be_dequantized_is_refused(checkpoints, tmp_path, variant, changes, message):
    folder = _with_config(checkpoints[variant][0], tmp_path / "damaged", **changes)
    with pytest.raises(ConversionError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ggufsmith.convert(folder, tmp_path / "out.gguf", outtype="f32")
    assert not (tmp_path / "out.gguf").exists()
