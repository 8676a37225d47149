"""Hunyuan-A13B (`HunYuanMoEV1ForCausalLM`): a llama-layout decoder with per-head RMSNorm of queries
and keys applied after the rope (`query_layernorm`, `key_layernorm`), NeoX-style rope, and in every
block a routed mixture of experts (router `mlp.gate.wg`, top-k weights renormalized) beside one
shared MLP (`mlp.shared_mlp`, intermediate_size wide).

The config may give the per-layer expert settings (moe_topk, moe_intermediate_size,
num_shared_expert) as lists; llama.cpp has one value for the model, so they must be uniform.
Rope: Tencent's "dynamic" scaling with `alpha` is NTK-aware scaling of the base frequency at every
length, base * alpha^(d / (d - 2)): written as that base, as llama.cpp's converter does.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import (LLAMA_NORMS, ROUTER, Decoder, attention, embeddings, experts, in_block, norms,
                                    shared_expert)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig


def uniform_int(c: HFConfig, name: str, default: int | None = None) -> int | None:
    """An integer config value, or a per-layer list of equal ones (its one value)."""
    if isinstance(c.get(name, default=None), list):
        values = c.get_list(name)
        if not values or not all(isinstance(v, int) and v == values[0] for v in values):
            raise c.error(name, values, "one value for all layers (llama.cpp has no per-layer setting for it)")
        return values[0]
    return c.get_int(name, default=default, min=1)


class HunyuanMoe(Decoder):
    name = "hunyuan-moe"
    hf_classes = ("HunYuanMoEV1ForCausalLM",)
    model_types = ("hunyuan_v1_moe",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            **attention(o_bias="none"),
            "self_attn.query_layernorm.weight": T("attn_q_norm.weight", "head_dim"),
            "self_attn.key_layernorm.weight": T("attn_k_norm.weight", "head_dim"),
            **experts(router="gate.wg"),
            **shared_expert("mlp.shared_mlp."),
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        alpha = self.rope.params.get_float("alpha", default=None, min=0)
        if self.rope.type == "dynamic" and alpha is not None:
            self.rope.theta = (self.rope.theta or 10000.0) * alpha ** (self.head_dim / (self.head_dim - 2))
            self.rope.type = "default"  # the scaled base is the whole of it

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_experts", min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, uniform_int(c, "moe_topk"))
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, uniform_int(c, "moe_intermediate_size", c.get_int("intermediate_size", min=1)))
        keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_COUNT, uniform_int(c, "num_shared_expert", 1))
