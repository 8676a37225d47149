"""Mixture-of-experts decoders (issue 15) converted by ggufsmith: llama.cpp gives transformers'
logits, in both checkpoint layouts (one tensor per expert, and transformers 5's fused stacks), and
llama.cpp's own converter writes the same file from the per-expert layout.

Tolerances (tests/moe_harness.py): f32 bounds every position at 1e-3 of the logits' standard
deviation (measured 2.6e-6-9.9e-6); f16 and q8_0 bound 90% of the positions at 0.25 and 0.6
(measured 0.008-0.10 and 0.14-0.28), since rounding can flip a near-tied routing choice.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.decoder_reference import reference_convert
from tests.family_models import build_model, hf_logits, llamacpp_logits, prompt_ids
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file
from tests.moe_harness import EOT_FIM_DIFFERENCES, TOLERANCE, VOCAB, conversions, logits_error
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

ATTENTION = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=512, tie_word_embeddings=False, vocab_size=VOCAB + 8, bos_token_id=0,
                 eos_token_id=0, pad_token_id=0)
COMMON = dict(ATTENTION, intermediate_size=160, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
# Families whose experts are intermediate_size wide, counted by num_local_experts.
LOCAL = dict(ATTENTION, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
GRANITE = dict(LOCAL, attention_multiplier=0.2, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=3.0)
# kind -> (config class, model class, llama.cpp architecture, config fields)
MODELS = {
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "qwen2moe",
                 dict(COMMON, shared_expert_intermediate_size=48, norm_topk_prob=False)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe", dict(COMMON, norm_topk_prob=True, head_dim=24)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "llama", dict(LOCAL, rope_theta=1e6)),
    # llama.cpp's olmoe has no grouped-query attention (its key norm is as wide as the queries')
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", "olmoe",
              dict(ATTENTION, num_key_value_heads=4, intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", "granitemoe", GRANITE),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", "granitemoe",
                         dict(GRANITE, shared_intermediate_size=48)),
    # transformers sizes the experts by intermediate_size; the per-layer lists are for llama.cpp's converter
    "hunyuan-moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", "hunyuan-moe",
                    dict(ATTENTION, intermediate_size=32, num_experts=4, moe_topk=[2] * 3, head_dim=16,
                         moe_intermediate_size=[32] * 3, num_shared_expert=[1] * 3)),
    # one dense leading block, two shared experts, renormalized and scaled sigmoid routing, the
    # experts chosen in the better of two groups (no GQA in llama.cpp's dots1)
    "dots1": ("Dots1Config", "Dots1ForCausalLM", "dots1",
              dict(COMMON, num_key_value_heads=4, head_dim=24, n_routed_experts=4, n_shared_experts=2,
                   first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_group=2, topk_group=1)),
    # one dense leading block, two shared experts (intermediate_size / num_key_value_heads, which
    # llama.cpp's converter takes for their width, chosen equal to HF's 2 x moe_intermediate_size)
    "ernie4_5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", "ernie4_5-moe",
                     dict(ATTENTION, intermediate_size=128, moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
                          moe_num_shared_experts=2, moe_layer_start_index=1,
                          bos_token_id=1, eos_token_id=2)),  # <s>, </s> of the SentencePiece model
    # q/k norms over whole projections wider than hidden_size, rope on half of each head (rotary_dim,
    # the published configs' name, which llama.cpp's converter reads), sigmoid routing with the
    # selection bias (scoring_func: the published configs' field, from which the reference writes it)
    "minimax-m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", "minimax-m2",
                   dict(LOCAL, head_dim=24, rotary_dim=12, scoring_func="sigmoid")),
}
SENTENCEPIECE = {"ernie4_5-moe"}  # llama.cpp's converter reads ERNIE's vocabulary only from tokenizer.model
LAYOUTS = ("per-expert", "fused")
KEY_DIFFERENCES = {
    **EOT_FIM_DIFFERENCES,
    "dots1.expert_gating_func": "theirs leaves it out, and llama.cpp aborts on such a file's first MoE layer",
    **TOKENIZER_KEY_DIFFERENCES,  # the SentencePiece tokenizer's (ernie4_5-moe)
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    out = {}
    for kind, (config_class, model_class, _, fields) in MODELS.items():
        for layout in LAYOUTS:
            model_dir = root / f"{kind}-{layout}"
            if kind in SENTENCEPIECE:
                train_sentencepiece(model_dir, vocab_size=VOCAB)
            else:
                train_bpe(model_dir, "qwen2", vocab_size=VOCAB)
            build_model(config_class, model_class, model_dir, fused_experts=layout == "fused", **fields)
            ids = prompt_ids(model_dir)
            out[kind, layout] = model_dir, ids, hf_logits(model_dir, model_class, ids)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("moe-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_match_transformers(models, converted, kind, layout, outtype):
    _, ids, expected = models[kind, layout]
    error = logits_error(llamacpp_logits(converted(kind, layout, outtype), ids), expected, outtype)
    print(f"{kind} {layout} {outtype}: max error {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{kind} {layout} {outtype}: max error {error:.2e} of the logits' std"


@pytest.mark.parametrize("kind", list(MODELS))
def test_both_layouts_give_the_same_file(models, converted, kind):
    """The fused stacks hold the same experts as the per-expert tensors: same weights, same file."""
    from tests.llamacpp_reference import gguf_contents

    per_expert = gguf_contents(converted(kind, "per-expert", "f32"))[1]
    fused = gguf_contents(converted(kind, "fused", "f32"))[1]
    assert sorted(per_expert) == sorted(fused)


# Families whose reference writes each block's expert stacks in an order of its own (ERNIE's: gate, up,
# down; ours, the checkpoint's: down, gate, up). The order of tensors in a GGUF file has no meaning.
OWN_ORDER = {"ernie4_5-moe"}
# Families llama.cpp's converter cannot convert from a folder transformers writes.
NO_REFERENCE = {
    "hunyuan-moe": "its converter reads only Hunyuan's tiktoken tokenizer (remote code: tokenizer.mergeable_ranks)",
}


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("kind", [kind for kind in MODELS if kind not in NO_REFERENCE])
def test_same_file_as_convert_hf_to_gguf(models, converted, kind, outtype):
    model_dir = models[kind, "per-expert"][0]
    theirs = reference_convert(model_dir, model_dir.parent / f"{kind}-reference-{outtype}.gguf", outtype, pre="qwen2")
    assert_same_file(converted(kind, "per-expert", outtype), theirs, KEY_DIFFERENCES, same_order=kind not in OWN_ORDER)


# transformers' own GGUF loader undoes the layout independently of us, for the MoE families it reads
# (transformers/integrations/ggml.py): from our f32 file, the checkpoint's logits.
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["minimax-m2"])
def test_transformers_gguf_loader_gives_the_original_logits(models, converted, kind, layout, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    (tmp_path / "model.gguf").symlink_to(converted(kind, layout, "f32"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    _, ids, expected = models[kind, layout]
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0].float().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
