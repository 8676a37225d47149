"""DeepSeek V2 / V3 (llama.cpp's deepseek2) and GLM-4.5 (glm4moe, DeepSeek V3's feed-forward)
converted by ggufsmith: llama.cpp gives transformers' logits in both expert layouts, and llama.cpp's
own converter writes the same file.

Three tiny models, each with one dense leading block, then sparse blocks of 8 experts (top 2) and
shared experts:
  - v3: q low-rank (q_a_proj, q_a_layernorm, q_b_proj), sigmoid scores with a random selection bias
    (e_score_correction_bias), 2 groups of which 1 is searched, renormalized top-k, routed scaling;
  - v2: a plain q_proj (q_lora_rank null, as V2-Lite), softmax scores, yarn rope with mscale;
  - kimi: a V3 config as Kimi K2 ships (one group), with transformers' rope_interleave false
    (rotate-half rope: the rotated rows are reordered) and yarn with mscale 1;
  - glm: GLM-4.5's attention (q/k/v biases, q/k norms, rope on half of each head), sigmoid routing
    with selection bias in 2 groups, and its next-token-prediction layer, which the file keeps.
Value heads (v_head_dim) are wider than the key's unrotated part (qk_nope_head_dim), so a split of
kv_b_proj at the wrong row, or without the transposition of attn_k_b, fails on shapes or logits.
Tolerances and the 90th percentile for f16/q8_0: see tests/moe_harness.py. Measured: f32
5.9e-6 to 7.5e-6 std for every model and layout, f16 0.007-0.008, q8_0 0.23-0.29. Checked by hand:
reading kv_b_proj's heads in the wrong order, dropping the rotate-half reordering, the selection
bias, the expert groups or yarn_log_multiplier, a full-head rope or softmax routing for glm, or
naming its post-attention norm ffn_norm, each fails the f32 logits of the models concerned.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import build_model, hf_logits, llamacpp_logits, prompt_ids
from tests.llamacpp_reference import assert_same_file
from tests.moe_harness import EOT_FIM_DIFFERENCES, TOLERANCE, VOCAB, conversions, logits_error
from tests.tokenizer_helpers import train_bpe, train_bpe_for_table_entry

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

COMMON = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
              num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
              kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=20, max_position_embeddings=512,
              tie_word_embeddings=False, vocab_size=VOCAB + 8, bos_token_id=0, eos_token_id=0, pad_token_id=0)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128, beta_fast=32.0,
            beta_slow=1.0)
V3 = dict(COMMON, q_lora_rank=32, n_shared_experts=1, n_group=2, topk_group=1, norm_topk_prob=True,
          routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc")
MODELS = {
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", V3),
    "v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
           dict(COMMON, q_lora_rank=None, n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5,
                scoring_func="softmax", topk_method="greedy", rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707))),
    "kimi": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
             dict(V3, n_group=1, topk_group=1, rope_interleave=False, rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=1.0))),
    "glm": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
            dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                 n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5, attention_bias=True,
                 use_qk_norm=True, routed_scaling_factor=2.0, norm_topk_prob=True, num_nextn_predict_layers=1,
                 max_position_embeddings=512, tie_word_embeddings=False, vocab_size=VOCAB + 8,
                 bos_token_id=None, eos_token_id=None, pad_token_id=None)),
}
GLM_SPECIALS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>")
PRE = {"glm": "glm4"}  # the pre-tokenizer of the tokenizer trained for a model (default qwen2)
# (model, layout) pairs built, and the outtypes each is compared at.
CASES = {("v3", "per-expert"): tuple(TOLERANCE), ("v3", "fused"): tuple(TOLERANCE),
         ("v2", "per-expert"): tuple(TOLERANCE), ("v2", "fused"): ("f32",), ("kimi", "per-expert"): ("f32", "f16"),
         ("glm", "per-expert"): tuple(TOLERANCE), ("glm", "fused"): ("f32",)}
KEY_DIFFERENCES = EOT_FIM_DIFFERENCES
# q_lora_rank null: llama.cpp reads the key unless the model has V2-Lite's 26/27 layers.
V2_KEY_DIFFERENCES = {**KEY_DIFFERENCES, "deepseek2.attention.q_lora_rank": "0 for a plain q_proj; the reference "
                      "leaves it out and llama.cpp refuses its file"}
# The reference's GLM-4 set_vocab names <|endoftext|> as unk and [gMASK] as bos (see
# tests/test_tokenizer_vs_convert_hf_families.py); the tokenizer itself names neither.
GLM_KEY_DIFFERENCES = {**KEY_DIFFERENCES, "tokenizer.ggml.unknown_token_id": "not named by the tokenizer",
                       "tokenizer.ggml.bos_token_id": "not named by the tokenizer",
                       "tokenizer.ggml.eom_token_id": "not named by the tokenizer"}
DIFFERENCES = {"v3": KEY_DIFFERENCES, "v2": V2_KEY_DIFFERENCES, "glm": GLM_KEY_DIFFERENCES}


def add_nextn_layer(model_dir, n_layer: int, hidden: int, vocab: int) -> None:
    """Append a next-token-prediction layer as DeepSeek V3 and GLM-4.5 checkpoints hold it (and
    transformers does not load): block n_layer, a copy of the last block, with eh_proj, enorm,
    hnorm and shared_head."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(1)
    weights = load_file(model_dir / "model.safetensors")
    last = f"model.layers.{n_layer - 1}."
    weights.update({f"model.layers.{n_layer}." + name[len(last):]: value.copy()
                    for name, value in weights.items() if name.startswith(last)})
    extra = {"eh_proj.weight": (hidden, 2 * hidden), "enorm.weight": (hidden,), "hnorm.weight": (hidden,),
             "shared_head.head.weight": (vocab, hidden), "shared_head.norm.weight": (hidden,)}
    for name, shape in extra.items():
        weights[f"model.layers.{n_layer}.{name}"] = rng.normal(0, 0.15, shape).astype(np.float32)
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    out = {}
    for kind, layout in CASES:
        config_class, model_class, fields = MODELS[kind]
        model_dir = root / f"{kind}-{layout}"
        if kind == "glm":
            train_bpe_for_table_entry(model_dir, "glm4", vocab_size=VOCAB, specials=GLM_SPECIALS)
        else:
            train_bpe(model_dir, "qwen2", vocab_size=VOCAB)
        build_model(config_class, model_class, model_dir, fused_experts=layout == "fused", **fields)
        if kind == "glm" and layout == "per-expert":
            add_nextn_layer(model_dir, fields["num_hidden_layers"], fields["hidden_size"], fields["vocab_size"])
        ids = prompt_ids(model_dir)
        out[kind, layout] = model_dir, ids, hf_logits(model_dir, model_class, ids)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("deepseek-gguf"))


@pytest.mark.parametrize("kind, layout, outtype", [(k, l, o) for (k, l), outtypes in CASES.items() for o in outtypes])
def test_logits_match_transformers(models, converted, kind, layout, outtype):
    _, ids, expected = models[kind, layout]
    error = logits_error(llamacpp_logits(converted(kind, layout, outtype), ids), expected, outtype)
    print(f"{kind} {layout} {outtype}: error {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{kind} {layout} {outtype}: error {error:.2e} of the logits' std"


@pytest.mark.parametrize("kind", ["v3", "v2"])  # glm's per-expert folder has a next-token-prediction layer
def test_both_layouts_give_the_same_file(models, converted, kind):
    from tests.llamacpp_reference import gguf_contents

    assert gguf_contents(converted(kind, "per-expert", "f32"))[1] == gguf_contents(converted(kind, "fused", "f32"))[1]


@pytest.mark.parametrize("kind, outtype", [("v3", "f32"), ("v3", "f16"), ("v2", "f32"), ("glm", "f32"), ("glm", "f16")])
def test_same_file_as_convert_hf_to_gguf(models, converted, kind, outtype):
    model_dir = models[kind, "per-expert"][0]
    theirs = reference_convert(model_dir, model_dir.parent / f"{kind}-reference-{outtype}.gguf", outtype,
                               pre=PRE.get(kind, "qwen2"))
    assert_same_file(converted(kind, "per-expert", outtype), theirs, DIFFERENCES[kind])


def test_multi_token_prediction_layer_left_out(models, converted, tmp_path, caplog):
    """A V3 checkpoint with its next-token-prediction layer (model.layers.<num_hidden_layers>.*,
    which transformers does not load): the layer is left out with one notice, the rest converts."""
    import shutil

    model_dir = tmp_path / "mtp"
    shutil.copytree(models["v3", "per-expert"][0], model_dir)
    add_nextn_layer(model_dir, V3["num_hidden_layers"], V3["hidden_size"], V3["vocab_size"])
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 1}))
    with caplog.at_level("WARNING"):
        ggufsmith.convert(model_dir, tmp_path / "mtp.gguf", outtype="f32")
    notices = [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(notices) == 1 and "layer(s) 3 (" in notices[0]
    from tests.llamacpp_reference import gguf_contents

    assert gguf_contents(tmp_path / "mtp.gguf")[1] == gguf_contents(converted("v3", "per-expert", "f32"))[1]


@pytest.mark.parametrize("kind, preset", [("glm", "Q4_K_M"), ("glm", "MXFP4_MOE")])
def test_presets_match_llama_quantize(models, converted, tmp_path, kind, preset):
    """`convert --outtype PRESET` straight from the checkpoint gives the file llama_model_quantize
    makes from the f32 conversion, byte for byte (GLM-4.5's feed-forward; DeepSeek's every preset:
    test_every_preset_matches_llama_quantize)."""
    from ggufsmith.quantize.presets import get_preset
    from tests.requant_oracle import assert_same_file as assert_same_bytes, llama_quantize

    ours = tmp_path / "ours.gguf"
    ggufsmith.convert(models[kind, "per-expert"][0], ours, outtype=preset.lower())
    assert llama_quantize(converted(kind, "per-expert", "f32"), tmp_path / "theirs.gguf", get_preset(preset).file_type) == 0
    assert_same_bytes(ours, tmp_path / "theirs.gguf")


# --- every llama-quantize preset, with and without an importance matrix (issue 15) ----------------

# A V3 whose rows take the 256-blocks of the K- and IQ-quants (hidden, kv_lora_rank, the experts'
# widths), with attn_k_b's rows of qk_nope_head_dim 32 falling back to 32-blocks as real DeepSeeks'
# 128 do; a dense block and a sparse one, 4 experts in 2 groups: as small as that goes, since
# ggufsmith's numpy IQ quantizers take most of the time.
QUANTIZABLE = dict(V3, hidden_size=256, intermediate_size=256, moe_intermediate_size=256, n_routed_experts=4,
                   num_hidden_layers=2, q_lora_rank=256, kv_lora_rank=256, qk_nope_head_dim=32, qk_rope_head_dim=32,
                   v_head_dim=32)
PLAIN_OUTTYPES = ("F16", "BF16", "Q8_0")  # convert keeps convert_hf_to_gguf.py's metadata for these
IMATRIX_CHUNK = 64


@pytest.fixture(scope="module")
def quantizable(tmp_path_factory):
    """The checkpoint, its f32 conversion, and an importance matrix of it made by `ggufsmith imatrix`,
    with the values llama-quantize would hand llama_model_quantize from that file and the keys it adds."""
    import subprocess
    import sys

    from tests.requant_oracle import imatrix_as_llama_quantize_reads_it
    from tests.tokenizer_helpers import training_text

    root = tmp_path_factory.mktemp("deepseek-presets")
    model_dir = root / "v3"
    train_bpe(model_dir, "qwen2", vocab_size=VOCAB)
    build_model("DeepseekV3Config", "DeepseekV3ForCausalLM", model_dir, **QUANTIZABLE)
    f32 = root / "f32.gguf"
    ggufsmith.convert(model_dir, f32, outtype="f32")
    text, imatrix = root / "calibration.txt", root / "imatrix.gguf"
    text.write_text("\n".join(training_text(60, seed=5)), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "ggufsmith", "imatrix", str(model_dir), str(text), str(imatrix),
                    "--chunk-size", str(IMATRIX_CHUNK), "--max-chunks", "4", "--quiet"], check=True)
    values, overrides = imatrix_as_llama_quantize_reads_it(imatrix)
    return model_dir, f32, imatrix, values, overrides


def _preset_cases():
    from ggufsmith.quantize.presets import PRESETS
    from tests.requant_oracle import PRESETS_NEEDING_IMATRIX

    return [(p, with_imatrix) for p in PRESETS if p != "F32" for with_imatrix in (False, True)
            if (with_imatrix or p not in PRESETS_NEEDING_IMATRIX) and not (with_imatrix and p in PLAIN_OUTTYPES)]


@pytest.mark.parametrize("preset, with_imatrix", _preset_cases(),
                         ids=[f"{p}-{'imatrix' if i else 'plain'}" for p, i in _preset_cases()])
def test_every_preset_matches_llama_quantize(quantizable, tmp_path, preset, with_imatrix):
    """`convert --outtype PRESET [--imatrix FILE]` on the checkpoint is llama_model_quantize on the
    f32 conversion, byte for byte: llama.cpp's rules for the MLA tensors (attn_kv_a_mqa, the 3-D
    attn_k_b / attn_v_b and their per-head importance), the expert stacks and their per-expert
    importance, the shared experts and the leading dense block. Q1_0 has no fallback for attn_k_b's
    rows of 32: both refuse."""
    from ggufsmith.errors import QuantizationError
    from ggufsmith.quantize.presets import get_preset
    from tests.requant_oracle import assert_same_file as assert_same_bytes, assert_same_tensors, llama_quantize

    model_dir, f32, imatrix, values, overrides = quantizable
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    options = dict(imatrix=values, kv_overrides=overrides) if with_imatrix else {}
    status = llama_quantize(f32, theirs, get_preset(preset).file_type, **options)
    if preset == "Q1_0":
        assert status != 0
        with pytest.raises(QuantizationError, match="no fallback type for Q1_0"):
            ggufsmith.convert(model_dir, ours, outtype="q1_0", **({"imatrix": str(imatrix)} if with_imatrix else {}))
        return
    assert status == 0
    ggufsmith.convert(model_dir, ours, outtype=preset.lower(), **({"imatrix": str(imatrix)} if with_imatrix else {}))
    if preset in PLAIN_OUTTYPES:
        assert_same_tensors(ours, theirs)
    else:
        assert_same_bytes(ours, theirs)
