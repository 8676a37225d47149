"""Granite 3.x (`GraniteForCausalLM`): the llama decoder with four multipliers llama.cpp reads as
keys: the embeddings are scaled (embedding_multiplier), each residual branch (residual_multiplier),
the attention scores (attention_multiplier, in place of 1/sqrt(head_dim)), and the logits divided
(logits_scaling). The rope is llama's (q/k permuted to GGML's pairs)."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import ROUTER, in_block, llama_decoder
from ggufsmith.arch.llama import Llama
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import Keys

SHARED = "n_ff_shexp > 0"


class Granite(Llama):
    name = "granite"
    hf_classes = ("GraniteForCausalLM",)
    model_types = ("granite",)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        c = self.config
        keys.f32(Keys.Attention.SCALE, c.get_float("attention_multiplier", default=None))
        keys.f32(Keys.LLM.EMBEDDING_SCALE, c.get_float("embedding_multiplier", default=None))
        keys.f32(Keys.LLM.RESIDUAL_SCALE, c.get_float("residual_multiplier", default=None))
        keys.f32(Keys.LLM.LOGIT_SCALE, c.get_float("logits_scaling", default=None))


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
