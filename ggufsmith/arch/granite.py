"""Granite 3.x (`GraniteForCausalLM`): the llama decoder with four multipliers llama.cpp reads as
keys: the embeddings are scaled (embedding_multiplier), each residual branch (residual_multiplier),
the attention scores (attention_multiplier, in place of 1/sqrt(head_dim)), and the logits divided
(logits_scaling). The rope is llama's (q/k permuted to GGML's pairs)."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import ROUTER, in_block, llama_decoder
from ggufsmith.arch.hybrid import (ATTENTION_LAYER, NO_ROPE_CONTEXT, RECURRENT_LAYER, SSM_CONV_F32, mamba2_keys,
                                   mamba2_mixer, mamba2_size, mamba2_transform, only_where, recurrent_layers)
from ggufsmith.arch.llama import Llama
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import GGUFValueType, Keys, arch_key
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

SHARED = "n_ff_shexp > 0"
MAMBA2 = {"prefix": "mamba_", "defaults": {"n_groups": 1, "d_state": 256}}  # Granite 4's config names, defaults


def multiplier_keys(keys: ArchKeys, c: HFConfig) -> None:
    keys.f32(Keys.Attention.SCALE, c.get_float("attention_multiplier", default=None))
    keys.f32(Keys.LLM.EMBEDDING_SCALE, c.get_float("embedding_multiplier", default=None))
    keys.f32(Keys.LLM.RESIDUAL_SCALE, c.get_float("residual_multiplier", default=None))
    keys.f32(Keys.LLM.LOGIT_SCALE, c.get_float("logits_scaling", default=None))


class Granite(Llama):
    name = "granite"
    hf_classes = ("GraniteForCausalLM",)
    model_types = ("granite",)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        multiplier_keys(keys, self.config)


def _granite_experts(router: str) -> dict[str, T | Split]:
    """Granite MoE's experts: each expert's gate and up fused in one (E, 2F, D) stack
    (`input_linear`, `experts.gate_up_proj` since transformers 5), its down in `output_linear`."""
    gate_up = Split(T("ffn_gate_exps.weight", "n_expert", "n_ff", "n_embd"), T("ffn_up_exps.weight", "n_expert", "n_ff", "n_embd"))
    down = T("ffn_down_exps.weight", "n_expert", "n_embd", "n_ff")
    return {f"block_sparse_moe.{router}.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd"),
            "block_sparse_moe.input_linear.weight": gate_up, "block_sparse_moe.experts.gate_up_proj": gate_up,
            "block_sparse_moe.output_linear.weight": down, "block_sparse_moe.experts.down_proj": down}


class GraniteMoe(Granite):
    """Granite 3.x MoE (`GraniteMoeForCausalLM`) and with a shared expert beside the routed ones
    (`GraniteMoeSharedForCausalLM`, shared_intermediate_size > 0): Granite's multipliers, routing
    by softmax over the top-k router logits (what llama.cpp computes by renormalizing the top-k)."""

    name = "granitemoe"
    hf_classes = ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")
    model_types = ("granitemoe", "granitemoeshared")
    tensor_names = {
        **{hf: spec for hf, spec in llama_decoder(o_bias="optional").items() if ".mlp." not in hf},
        **in_block({
            **_granite_experts("router.layer"), **_granite_experts("router"),
            "shared_mlp.input_linear.weight": Split(T("ffn_gate_shexp.weight", "n_ff_shexp", "n_embd", when=SHARED),
                                                    T("ffn_up_shexp.weight", "n_ff_shexp", "n_embd", when=SHARED)),
            "shared_mlp.output_linear.weight": T("ffn_down_shexp.weight", "n_embd", "n_ff_shexp", when=SHARED),
        }),
    }
    f32_tensors = ROUTER

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        shared = self.config.get_int("shared_intermediate_size", default=0, min=0)
        keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, shared or None)


def _dense_shared_mlp() -> dict[str, T | Split]:
    """Without routed experts, the "shared" MLP is the block's only feed-forward: llama.cpp's ffn_*."""
    return {"shared_mlp.input_linear.weight": Split(T("ffn_gate.weight", "n_ff", "n_embd"), T("ffn_up.weight", "n_ff", "n_embd")),
            "shared_mlp.output_linear.weight": T("ffn_down.weight", "n_embd", "n_ff")}


def _hybrid_table(moe: bool) -> dict[str, T | Split]:
    decoder = {hf: spec for hf, spec in GraniteMoe.tensor_names.items() if ".block_sparse_moe." not in hf
               and ".shared_mlp." not in hf}
    attention = {hf: spec for hf, spec in decoder.items() if ".self_attn." in hf}
    feed_forward = {hf: spec for hf, spec in GraniteMoe.tensor_names.items() if hf not in decoder} if moe else \
        in_block(_dense_shared_mlp())
    return {**decoder, **only_where(attention, ATTENTION_LAYER), **feed_forward,
            **only_where(in_block(mamba2_mixer("mamba.", conv_bias="optional")), RECURRENT_LAYER)}


class GraniteHybrid(GraniteMoe):
    """Granite 4 (`GraniteMoeHybridForCausalLM`): Granite's multipliers; Mamba-2 mixers in the layers
    layer_types names "mamba"/"linear_attention", attention in the others; routed experts with a
    shared one, or (num_local_experts 0) the shared MLP alone as a dense feed-forward. Rope only
    with position_embedding_type "rope" (llama.cpp's rope.scaling.finetuned switch)."""

    name = "granitehybrid"
    hf_classes = ("GraniteMoeHybridForCausalLM",)
    model_types = ("granitemoehybrid",)
    tensor_names = _hybrid_table(moe=True)
    f32_tensors = ROUTER + SSM_CONV_F32

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.n_layer = c.get_int("num_hidden_layers", min=1)
        recurrent = recurrent_layers(c, self.n_layer, default=["linear_attention"] * self.n_layer)
        self.attention_layers = [not r for r in recurrent]
        self.moe = c.get_int("num_local_experts", default=8, min=0) > 0
        if not self.moe:
            self.tensor_names = _hybrid_table(moe=False)

    def _shared_width(self) -> int:
        return self.config.get_int("shared_intermediate_size", default=1024, min=1)

    def feed_forward_length(self) -> int:
        """Without routed experts the shared MLP is the only one: its width is llama.cpp's n_ff."""
        return super().feed_forward_length() if self.moe else self._shared_width()

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_local_experts", default=8) if self.moe else None)
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", default=2, min=1) if self.moe else None)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)
        multiplier_keys(keys, c)
        if self.moe:
            keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, self._shared_width())
        mamba2_keys(keys, c, **MAMBA2)
        rope = c.get_str("position_embedding_type", default=None) == "rope" or all(self.attention_layers)
        keys.bool(Keys.Rope.SCALING_FINETUNED, rope)
        if not rope:
            keys.metadata.replace(arch_key(Keys.LLM.CONTEXT_LENGTH, self.name), NO_ROPE_CONTEXT, GGUFValueType.UINT32)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        tensor = super().transform(name, tensor)
        return mamba2_transform(name, tensor, mamba2_size(self.config, "n_groups", **MAMBA2))
