"""dots.llm1 (`Dots1ForCausalLM`): a Qwen3-style decoder (per-head q/k RMSNorm, NeoX rope) whose
first `first_k_dense_replace` blocks have a dense MLP and the others a routed mixture of experts
beside shared experts. Routing as DeepSeek V3's: sigmoid scores, a per-expert bias that only
chooses (`e_score_correction_bias`, llama.cpp's exp_probs_b), the chosen scores optionally
renormalized (norm_topk_prob) and scaled (routed_scaling_factor), the experts chosen among the
topk_group best of n_group groups (llama.cpp's expert_group keys, the same group score: the sum of
each group's two best).

llama.cpp's dots1 has neither grouped-query attention (it loads keys and values as wide as the
queries) nor sliding-window layers: such configs are refused. expert_gating_func (sigmoid) is
written: llama.cpp's converter leaves it out, and llama.cpp aborts on such a file's first MoE layer.
"""

from __future__ import annotations

from typing import Any

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import DENSE, ROUTER, SPARSE, Decoder, experts, in_block, llama_decoder, mlp, shared_expert
from ggufsmith.arch.tensors import T
from ggufsmith.constants import ExpertGatingFunc, Keys
from ggufsmith.readers.config import HFConfig


class Dots1(Decoder):
    name = "dots1"
    hf_classes = ("Dots1ForCausalLM",)
    model_types = ("dots1",)
    tensor_names = {
        **{hf: spec for hf, spec in llama_decoder(o_bias="none", qk_norm=True).items() if ".mlp." not in hf},
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's dots1 requires it
        **in_block({
            **mlp(biases="none", when=DENSE),
            **experts(when=SPARSE),
            "mlp.gate.e_score_correction_bias": T("exp_probs_b.bias", "n_expert", when=SPARSE),
            **shared_expert("mlp.shared_experts.", when=SPARSE),
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, self.n_head_kv != self.n_head, "num_key_value_heads differs from num_attention_heads")
        n_layer = c.get_int("num_hidden_layers", min=1)
        reject(c, "sliding_attention" in self.layer_types(["full_attention"] * n_layer), "layer_types has sliding_attention layers")
        self.n_dense = c.get_int("first_k_dense_replace", default=0)
        self.n_shared = c.get_int("n_shared_experts", min=1)

    def dims(self) -> dict[str, Any]:
        return {"n_layer_dense_lead": self.n_dense,
                "n_ff_shexp": self.config.get_int("moe_intermediate_size", min=1) * self.n_shared}

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, self.n_dense)
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("n_routed_experts", "num_local_experts", min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1))
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_COUNT, self.n_shared)
        keys.u32(Keys.LLM.EXPERT_GROUP_COUNT, c.get_int("n_group", default=None, min=1))
        keys.u32(Keys.LLM.EXPERT_GROUP_USED_COUNT, c.get_int("topk_group", default=None, min=1))
        keys.f32(Keys.LLM.EXPERT_WEIGHTS_SCALE, c.get_float("routed_scaling_factor", default=1.0))
        keys.bool(Keys.LLM.EXPERT_WEIGHTS_NORM, c.get_bool("norm_topk_prob", default=False))
        keys.u32(Keys.LLM.EXPERT_GATING_FUNC, int(ExpertGatingFunc.SIGMOID))
