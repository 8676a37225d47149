"""Jamba (`JambaForCausalLM`, AI21): Mamba layers (the first Mamba's mixer, with RMSNorms of dt, B
and C) and attention layers (no positional encoding) by a period and offset, and a feed-forward in
every layer that is routed experts by another period and offset (softmax top-k, the chosen
weights not renormalized: what llama.cpp's jamba computes), a dense MLP elsewhere. llama.cpp
tells the attention layers by their head_count_kv and the MoE layers by their router."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import ROUTER, Decoder, attention, embeddings, expert_keys, experts, in_block, mlp
from ggufsmith.arch.hybrid import (ATTENTION_LAYER, MAMBA1_F32, RECURRENT_LAYER, mamba1_keys, mamba1_mixer,
                                   mamba1_transform, only_where)
from ggufsmith.arch.tensors import T
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

MOE = "bid >= moe_offset and (bid - moe_offset) % moe_period == 0"
DENSE = f"not ({MOE})"


class Jamba(Decoder):
    name = "jamba"
    hf_classes = ("JambaForCausalLM",)
    model_types = ("jamba",)
    tensor_names = {
        **embeddings(),
        "model.final_layernorm.weight": T("output_norm.weight", "n_embd"),
        **in_block({
            "input_layernorm.weight": T("attn_norm.weight", "n_embd"),
            "pre_ff_layernorm.weight": T("ffn_norm.weight", "n_embd"),
            **only_where(attention(biases="none"), ATTENTION_LAYER),
            **only_where({
                **mamba1_mixer("mamba."),
                "mamba.dt_layernorm.weight": T("ssm_dt_norm.weight", "dt_rank"),
                "mamba.b_layernorm.weight": T("ssm_b_norm.weight", "d_state"),
                "mamba.c_layernorm.weight": T("ssm_c_norm.weight", "d_state"),
            }, RECURRENT_LAYER),
            **mlp(biases="none", when=DENSE, prefix="feed_forward."),
            **experts(prefix="feed_forward.", router="router", when=MOE, per_expert=("gate_proj", "up_proj", "down_proj")),
        }),
    }
    del tensor_names["model.norm.weight"]  # Jamba calls its final norm final_layernorm
    f32_tensors = ROUTER + MAMBA1_F32
    dim_names = ("moe_offset", "moe_period")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        n_layer = c.get_int("num_hidden_layers", min=1)
        offset, period = c.get_int("attn_layer_offset", min=0), c.get_int("attn_layer_period", min=1)
        self.attention_layers = [i >= offset and (i - offset) % period == 0 for i in range(n_layer)]
        if c.get_bool("mamba_proj_bias", default=False) or not c.get_bool("mamba_conv_bias", default=True):
            raise ConversionError(f"{c.label}: mamba_proj_bias true or mamba_conv_bias false; llama.cpp's jamba has "
                                  "no projection biases and needs the conv bias")

    def dims(self) -> dict[str, int]:
        c = self.config
        return {"moe_offset": c.get_int("expert_layer_offset", min=0),
                "moe_period": c.get_int("expert_layer_period", min=1)}

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        d_model = c.get_int("hidden_size", min=1)
        mamba1_keys(keys, c, d_model, c.get_int("mamba_expand", default=2, min=1) * d_model, prefix="mamba_")
        expert_keys(keys, c)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return mamba1_transform(name, tensor)
