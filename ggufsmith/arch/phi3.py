"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (`Phi3ForCausalLM`; Phi-3.5-MoE: `PhiMoe` below): a llama-layout decoder whose q, k and v
are one fused matrix (all queries, all keys, all values: llama.cpp's attn_qkv as it is) and whose
gate and up projections are one matrix of 2 * intermediate_size rows (gate first), which llama.cpp
loads as ffn_up and splits itself. NeoX-style rope (no permutation), partial in Phi-4-mini.

The 128k-context models use LongRoPE: per-pair frequency divisors for short and long contexts,
written as llama.cpp's rope_factors_short/long tensors, and a scale of cos and sin (the attention
factor) as rope.scaling.attn_factor (see arch/rope.py). transformers reads the old type names
"su" and "yarn" of Phi-3 configs as LongRoPE; so do we.

sliding_window is written as llama.cpp's converter writes it (0 when the config has none), but
llama.cpp's phi3 attends to the whole context: the same logits as transformers up to the window.
"""

from __future__ import annotations

import logging

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import ATTN_NORM, FFN_NORM, QKV_ROWS, weights_and_biases
from ggufsmith.arch.decoder import (LLAMA_NORMS, ROUTER, Decoder, attention, embeddings, expert_keys, fused_gate_up_mlp,
                                    in_block, mixtral_experts, norms)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig

log = logging.getLogger(__name__)

LONGROPE_ALIASES = ("su", "yarn")  # older Phi-3 configs; transformers' Phi3Config reads both as longrope


class Phi3(Decoder):
    name = "phi3"
    hf_classes = ("Phi3ForCausalLM",)
    model_types = ("phi3",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            "self_attn.qkv_proj.weight": T("attn_qkv.weight", QKV_ROWS, "n_embd"),
            "self_attn.o_proj.weight": T("attn_output.weight", "n_embd", "n_embd"),
            **fused_gate_up_mlp(),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        if self.rope.type in LONGROPE_ALIASES:
            self.rope.type = "longrope"

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.rope.partial_rotary_factor() * self.head_dim))
        if self.rope.type != "longrope":  # else written with the LongRoPE keys
            keys.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, c.get_int("original_max_position_embeddings", default=None, min=1))
        keys.u32(Keys.Attention.SLIDING_WINDOW, c.get_int("sliding_window", default=0))


class PhiMoe(Phi3):
    """Phi-3.5-MoE (`PhiMoEForCausalLM` in its config.json, transformers' `PhimoeForCausalLM`):
    Mixtral's blocks (separate q/k/v, 16 experts, top-2) with LayerNorms (weight and bias), biases
    on the attention and the output head, and Phi-3's rope (LongRoPE, attention factor from
    short_mscale). llama.cpp's phimoe computes two things otherwise than transformers: the norms
    are RMSNorms (plus the bias: no mean subtracted), and the top-2 experts are weighted by a
    softmax over the router's logits renormalized over the two, where transformers' SparseMixer
    gives each of the two the softmax over only the experts within a relative 2 x
    router_jitter_noise of it (for most tokens 1 and 1). No file can change the routing. Converted
    as llama.cpp's converter does (such files are in use), with a warning; the measured gap is in
    docs/architectures.md."""

    name = "phimoe"
    hf_classes = ("PhimoeForCausalLM", "PhiMoEForCausalLM")
    model_types = ("phimoe",)
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's phimoe requires it, and:
        "lm_head.bias": T("output.bias", "n_vocab"),
        "model.norm.bias": T("output_norm.bias", "n_embd"),
        **in_block({
            **weights_and_biases({"input_layernorm": ATTN_NORM, "post_attention_layernorm": FFN_NORM}),
            **attention(o_bias="required"),
            **mixtral_experts(fused_router="router"),
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        log.warning("%s: llama.cpp's phimoe uses RMS norms and softmax top-2 routing where transformers uses "
                    "LayerNorm and SparseMixer: its outputs will differ from transformers'", config.path)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        expert_keys(keys, self.config)
