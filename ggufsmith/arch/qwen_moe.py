"""Qwen MoE: Qwen1.5-MoE / Qwen2-57B (`Qwen2MoeForCausalLM`) and Qwen3-30B-A3B / 235B
(`Qwen3MoeForCausalLM`): the Qwen2 / Qwen3 decoders with a routed mixture of experts in every
block, in both checkpoint layouts (per-expert tensors, transformers 5's fused stacks).

Qwen2-MoE adds a shared expert whose output is scaled by sigmoid(shared_expert_gate(x))
(ffn_gate_inp_shexp, kept F32 like the router). llama.cpp's graphs fix how the top-k routing
weights are used: qwen2moe uses them as they are, qwen3moe renormalizes them to sum to one, so a
config asking for the other (norm_topk_prob) is refused, as are dense layers between the sparse
ones (decoder_sparse_step, mlp_only_layers), which neither graph has.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import (Decoder, embeddings, expert_keys, experts, in_block, llama_decoder, reject_routing,
                                    shared_expert)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig

ATTENTION_AND_NORMS = {hf: spec for hf, spec in llama_decoder(o_bias="none", mlp_biases="none").items() if ".mlp." not in hf}
# The feed-forward of Qwen2-MoE, Qwen3-Next and Qwen3.5-MoE blocks (relative names): routed experts
# and a shared expert scaled by sigmoid(shared_expert_gate(x)).
EXPERTS_AND_GATED_SHARED = {
    **experts(),
    **shared_expert(),
    # Linear(hidden, 1); llama.cpp reads it as a vector, which (n_embd, 1) in ggml's order is
    "mlp.shared_expert_gate.weight": T("ffn_gate_inp_shexp.weight", 1, "n_embd"),
}


def reject_dense_blocks(c: HFConfig) -> None:
    """Dense blocks between the sparse ones, which llama.cpp's Qwen MoE graphs do not have."""
    reject(c, c.get_int("decoder_sparse_step", default=1) != 1 or bool(c.get_list("mlp_only_layers", default=[])),
           "decoder_sparse_step / mlp_only_layers make some blocks dense")


class Qwen2Moe(Decoder):
    name = "qwen2moe"
    hf_classes = ("Qwen2MoeForCausalLM",)
    model_types = ("qwen2_moe",)
    tensor_names = {
        **ATTENTION_AND_NORMS,
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's qwen2moe requires it
        **in_block(EXPERTS_AND_GATED_SHARED),
    }
    f32_tensors = (r"blk\.\d+\.ffn_gate_inp(_shexp)?\.weight",)
    normalizes_top_k = False  # what llama.cpp's graph does with the top-k routing weights

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        reject_routing(config, normalizes_top_k=self.normalizes_top_k, arch=self.name)
        reject_dense_blocks(config)
        reject(config, config.get_bool("use_sliding_window", default=False), "use_sliding_window is set")

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        expert_keys(keys, c)
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, c.get_int("shared_expert_intermediate_size", default=None, min=1))


class Qwen3Moe(Qwen2Moe):
    name = "qwen3moe"
    hf_classes = ("Qwen3MoeForCausalLM",)
    model_types = ("qwen3_moe",)
    tensor_names = {
        **{hf: spec for hf, spec in llama_decoder(o_bias="none", mlp_biases="none", qk_norm=True).items() if ".mlp." not in hf},
        **in_block(experts()),
    }
    normalizes_top_k = True
