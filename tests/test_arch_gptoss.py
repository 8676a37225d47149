"""gpt-oss (issue 15): a tiny random GptOssForCausalLM converted by ggufsmith runs in llama.cpp with
transformers' logits, from both checkpoint layouts: the float parameters transformers saves, and the
MXFP4 blocks and scales the released checkpoints ship, whose bytes go into the file unchanged.

The model makes each gpt-oss feature matter: 4 layers alternating sliding (window 8) and full
attention over a 68-token prompt, a learned sink per head drawn N(0, 1), router and expert biases,
expert weights large enough that the SwiGLU clamp (7.0) binds for many units (checked against
transformers with the clamp lifted), yarn rope. The yarn config says truncate: true: with gpt-oss'
truncate: false transformers does not round yarn's correction range, which ggml always does, so no
converter's file can match transformers then (measured 1.9 std on this model; the plugin warns).

Tolerances, in units of the logits' standard deviation. f32 from float weights: every position
within 1e-3 (measured 1.1e-5). Rounded weights move the router's scores, and where two experts are
nearly tied for a token llama.cpp may pick the other one (tests/test_arch_moe.py), which moves that
token's logits by up to a few std, and the later tokens' through attention: so the median and the
90th percentile of the per-position errors are bounded (measured on this model, whose large gate
weights make the routing and the clamp sensitive on purpose):
- f16: 0.05 / 0.25 (measured 0.006 / 0.011);
- q8_0: 0.3 / 0.8 (measured 0.18 / 0.51; with MXFP4 experts 0.17 / 0.68);
- MXFP4 experts, f32 elsewhere: 0.15 / 0.25 (measured 0.066 / 0.096, max 0.14). The expert weights
  are exactly transformers' dequantized values (llama.cpp's own decoder gives transformers' logits
  to 9e-6), but ggml multiplies MXFP4 weights with activations rounded to Q8_0, its dot-product
  type for MXFP4, where transformers computes in f32; MXFP4 with f16 elsewhere: the same bounds
  (measured 0.066 / 0.099).
A layout error (gate and up swapped, an expert stack not transposed, the nibbles in the wrong
order) moves every position by whole standard deviations.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import conversions, hf_logits, llamacpp_logits, prompt_ids, randomize, relative_error
from tests.llamacpp_reference import assert_same_file, gguf_contents
from tests.tokenizer_helpers import train_bpe

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

F32_TOLERANCE = 1e-3
# (median, 90th percentile) of the per-position errors; see the module docstring
TOLERANCE = {"f16": (0.05, 0.25), "q8_0": (0.3, 0.8), "mxfp4": (0.15, 0.25)}
VOCAB = 600
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": True, "original_max_position_embeddings": 4096}
CONFIG = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
              max_position_embeddings=512, rope_parameters=YARN, vocab_size=VOCAB + 8, bos_token_id=0,
              eos_token_id=0, pad_token_id=0)
# transformers' MXFP4 code table: code -> value (bit 3 is the sign)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
KEY_DIFFERENCES = {
    **{key: "written explicitly; llama.cpp finds the same id by its text at load time"
       for key in ("tokenizer.ggml.eot_token_id", *(f"tokenizer.ggml.fim_{kind}_token_id" for kind in ("pre", "suf", "mid", "pad", "rep", "sep")))},
}


def build_gptoss(model_dir, seed: int = 0, **overrides):
    """A random GptOss model saved to model_dir (float32), with sinks N(0, 1) and the experts'
    gate_up weights scaled so that the SwiGLU clamp binds."""
    config = transformers.GptOssConfig(**{**CONFIG, **overrides})
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config)
    randomize(model)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj.mul_(2.5)
            layer.mlp.experts.gate_up_proj_bias.normal_(0.0, 1.5)
    model.save_pretrained(model_dir)
    return model_dir


def mxfp4_encode(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., rows, cols) floats -> (blocks (..., rows, cols/32, 16), scales (..., rows, cols/32)) as the
    gpt-oss checkpoints store them: per block of 32 a power of two 2^(scale - 127) and the nearest
    E2M1 code of each value over it, codes 2j / 2j + 1 in the low / high nibble of byte j."""
    blocks = weights.reshape(*weights.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    exponent = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    scaled = blocks / np.exp2(exponent)
    codes = np.abs(scaled[..., None] - FP4_VALUES).argmin(axis=-1).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent[..., 0] + 127).astype(np.uint8)


def save_mxfp4_checkpoint(float_dir, mxfp4_dir):
    """The float checkpoint with its expert weights stored as gpt-oss' released checkpoints store them."""
    import shutil

    from safetensors.numpy import load_file, save_file

    mxfp4_dir.mkdir()
    for f in float_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, mxfp4_dir / f.name)
    tensors = {}
    for name, value in load_file(float_dir / "model.safetensors").items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # transformers' parameters are (E, in, out); the checkpoints store (E, out, in) blocks
            blocks, scales = mxfp4_encode(np.ascontiguousarray(np.swapaxes(value, -1, -2)))
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        else:
            tensors[name] = value
    save_file(tensors, mxfp4_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (mxfp4_dir / "config.json").write_text(json.dumps(config))
    return mxfp4_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptoss")
    float_dir = root / "float"
    train_bpe(float_dir, "qwen2", vocab_size=VOCAB)
    build_gptoss(float_dir)
    mxfp4_dir = save_mxfp4_checkpoint(float_dir, root / "mxfp4")
    ids = prompt_ids(float_dir)
    assert len(ids) > 4 * CONFIG["sliding_window"]  # the window cuts off most of the prompt
    return {
        "ids": ids,
        "float": (float_dir, hf_logits(float_dir, "GptOssForCausalLM", ids)),
        # transformers dequantizes the MXFP4 experts on CPU: its logits are the reference
        "mxfp4": (mxfp4_dir, hf_logits(mxfp4_dir, "GptOssForCausalLM", ids)),
    }


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("gptoss-gguf"))


def per_position_error(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.abs(got - expected).max(axis=-1) / expected.std()


def assert_close(got: np.ndarray, expected: np.ndarray, bounds: tuple[float, float], what: str) -> None:
    """The per-position errors' median and 90th percentile within `bounds`."""
    errors = per_position_error(got, expected)
    measured = np.quantile(errors, [0.5, 0.9])
    print(f"{what}: error median {measured[0]:.2e}, 90% {measured[1]:.2e}, max {errors.max():.2e} std")
    assert measured[0] <= bounds[0] and measured[1] <= bounds[1], what


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_logits_match_transformers(models, converted, outtype):
    _, expected = models["float"]
    got = llamacpp_logits(converted("float", outtype), models["ids"])
    if outtype == "f32":
        error = relative_error(got, expected)
        print(f"gpt-oss f32: max error {error:.2e} std")
        assert error <= F32_TOLERANCE
    else:
        assert_close(got, expected, TOLERANCE[outtype], f"gpt-oss {outtype}")


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_mxfp4_checkpoint_logits_match_transformers(models, converted, outtype):
    _, expected = models["mxfp4"]
    got = llamacpp_logits(converted("mxfp4", outtype), models["ids"])
    assert_close(got, expected, TOLERANCE["q8_0" if outtype == "q8_0" else "mxfp4"], f"gpt-oss MXFP4 experts, {outtype}")


def test_mxfp4_experts_decoded_by_llamacpp_give_transformers_logits(models, converted, tmp_path):
    """llama.cpp's own MXFP4 decoder (llama-quantize to F32, --allow-requantize) makes our file's
    experts exactly transformers' dequantized weights: the logits then match to f32 precision, so
    the error above is ggml's MXFP4 matrix product (activations rounded to Q8_0), not the bytes."""
    from tests.requant_oracle import llama_quantize

    decoded = tmp_path / "decoded.gguf"
    assert llama_quantize(converted("mxfp4", "f32"), decoded, 0, allow_requantize=True) == 0  # LLAMA_FTYPE_ALL_F32
    _, expected = models["mxfp4"]
    error = relative_error(llamacpp_logits(decoded, models["ids"]), expected)
    print(f"gpt-oss MXFP4 experts decoded by llama.cpp: max error {error:.2e} std")
    assert error <= F32_TOLERANCE


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_mxfp4_experts_pass_through(models, converted, outtype):
    """Whatever the output type, the experts stay MXFP4: each block's exponent byte is the
    checkpoint's scale byte, and its codes decode (gguf-py's MXFP4 decoder) to transformers'
    dequantized weights exactly; the file is labelled MOSTLY_MXFP4_MOE for float outtypes."""
    from safetensors.numpy import load_file

    mxfp4_dir = models["mxfp4"][0]
    stored = load_file(mxfp4_dir / "model.safetensors")
    model = transformers.GptOssForCausalLM.from_pretrained(mxfp4_dir, dtype=torch.float32)
    keys, tensors = gguf_contents(converted("mxfp4", outtype))
    expected_file_type = {"f32": 38, "f16": 38, "q8_0": 7}[outtype]  # as llama.cpp's converter labels them
    assert keys["general.file_type"] == expected_file_type
    for bid, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        gate_up = experts.gate_up_proj.detach().numpy().swapaxes(-1, -2)  # (E, 2F, D)
        down = experts.down_proj.detach().numpy().swapaxes(-1, -2)  # (E, D, F)
        scales = stored[f"model.layers.{bid}.mlp.experts.gate_up_proj_scales"]
        for name, values, exponents in (("gate", gate_up[:, 0::2], scales[:, 0::2]),
                                        ("up", gate_up[:, 1::2], scales[:, 1::2]),
                                        ("down", down, stored[f"model.layers.{bid}.mlp.experts.down_proj_scales"])):
            shape, ttype, data = tensors[f"blk.{bid}.ffn_{name}_exps.weight"]
            assert ttype == int(gguf.GGMLQuantizationType.MXFP4)
            blocks = np.frombuffer(data, np.uint8).reshape(-1, 17)
            assert (blocks[:, 0] == exponents.reshape(-1)).all(), f"blk.{bid}.ffn_{name}_exps: scale bytes"
            decoded = gguf.quants.dequantize(np.frombuffer(data, np.uint8), gguf.GGMLQuantizationType.MXFP4)
            assert np.array_equal(decoded.reshape(values.shape), values), f"blk.{bid}.ffn_{name}_exps: values"


@pytest.mark.parametrize("layout,outtype", [("float", "f32"), ("float", "f16"), ("mxfp4", "f32"), ("mxfp4", "q8_0")])
def test_same_file_as_convert_hf_to_gguf(models, converted, layout, outtype):
    model_dir = models[layout][0]
    theirs = reference_convert(model_dir, model_dir.parent / f"{layout}-reference-{outtype}.gguf", outtype, pre="qwen2")
    # llama.cpp's converter writes the MXFP4 experts of every block before all other tensors; the
    # order of tensors in a GGUF file has no meaning
    assert_same_file(converted(layout, outtype), theirs, KEY_DIFFERENCES, same_order=layout == "float")


def test_features_matter(models, tmp_path):
    """The clamp binds and the sinks and the window change transformers' logits by whole standard
    deviations on this model, so the logit comparisons check them."""
    float_dir, expected = models["float"]
    ids = models["ids"]

    def logits_with(**changes) -> np.ndarray:
        model = transformers.GptOssForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                if "limit" in changes:
                    layer.mlp.experts.limit = changes["limit"]
                if "sinks" in changes:
                    layer.self_attn.sinks.fill_(changes["sinks"])
                if "window" in changes:
                    layer.self_attn.sliding_window = None
            if "window" in changes:
                model.config.layer_types = ["full_attention"] * model.config.num_hidden_layers
            return model(torch.tensor([ids])).logits[0].numpy()

    assert relative_error(logits_with(limit=1e9), expected) > 0.3
    assert relative_error(logits_with(sinks=-1e9), expected) > 0.3
    assert relative_error(logits_with(window=None), expected) > 0.3


def test_other_swiglu_constants_are_refused(models, tmp_path):
    model_dir = tmp_path / "limit"
    build_gptoss(model_dir, swiglu_limit=5.0)
    with pytest.raises(ggufsmith.errors.ConversionError, match="swiglu_limit is 5.0"):
        ggufsmith.convert(model_dir, tmp_path / "out.gguf", outtype="f32", with_tokenizer=False)


def test_yarn_without_truncation_warns(models, tmp_path, caplog):
    """gpt-oss' own config (truncate: false): converted as llama.cpp's converter does, with a warning."""
    float_dir = models["float"][0]
    model_dir = tmp_path / "untruncated"
    model_dir.mkdir()
    for f in float_dir.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    config = json.loads((float_dir / "config.json").read_text())
    config["rope_parameters"]["truncate"] = False
    (model_dir / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        ggufsmith.convert(model_dir, tmp_path / "out.gguf", outtype="f32", with_tokenizer=False, dry_run=True)
    assert "truncate" in caplog.text


def test_a_non_default_window_pattern_is_written(models, tmp_path):
    """llama.cpp alternates sliding and full layers by itself; another pattern is written as an array."""
    model_dir = tmp_path / "pattern"
    build_gptoss(model_dir, layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])
    plan = ggufsmith.convert(model_dir, tmp_path / "out.gguf", outtype="f32", with_tokenizer=False, dry_run=True)
    assert list(plan.metadata["gpt-oss.attention.sliding_window_pattern"].value) == [False, True, True, False]
    default = ggufsmith.convert(models["float"][0], tmp_path / "d.gguf", outtype="f32", with_tokenizer=False, dry_run=True)
    assert "gpt-oss.attention.sliding_window_pattern" not in default.metadata
