"""OLMo 2 and OLMo 3 (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`): a llama-layout decoder that
normalizes after attention and after the MLP (post_attention_norm, post_ffw_norm) instead of before,
and normalizes all queries (width n_head * head_dim) and all keys (n_head_kv * head_dim) with one
RMSNorm each. NeoX-style rope (no permutation). OLMo 3 adds sliding-window attention on the layers
`layer_types` names (default: all but every fourth), written as llama.cpp's sliding_window keys.
OLMoE: see its class.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import (LLAMA_NORMS, Q_ROWS, KV_ROWS, ROUTER, Decoder, attention, embeddings, expert_keys,
                                    experts, in_block, mlp, norms, reject_routing)
from ggufsmith.arch.tensors import T
from ggufsmith.readers.config import HFConfig


class Olmo2(Decoder):
    name = "olmo2"
    hf_classes = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
    model_types = ("olmo2", "olmo3")
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's olmo2 requires it
        **in_block({
            **attention(biases="none"),
            "self_attn.q_norm.weight": T("attn_q_norm.weight", Q_ROWS),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", KV_ROWS),
            **norms(post_attention_layernorm="post_attention_norm", post_feedforward_layernorm="post_ffw_norm"),
            **mlp(biases="none"),
        }),
    }

    def family_keys(self, keys: ArchKeys) -> None:
        if "sliding_window" in self.config:  # OLMo 3
            n_layer = self.config.get_int("num_hidden_layers", min=1)
            default = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layer)]
            self.sliding_window_keys(keys, [t == "sliding_attention" for t in self.layer_types(default)])


class Olmoe(Decoder):
    """OLMoE (`OlmoeForCausalLM`): the llama-layout decoder with a routed mixture of experts in
    every block and one RMSNorm over all queries and one over all keys (NeoX-style rope). llama.cpp
    reads both norms at width n_embd, so it runs only configs whose keys are as wide as the queries
    (no grouped-query attention), and uses the top-k routing weights as softmax gives them."""

    name = "olmoe"
    hf_classes = ("OlmoeForCausalLM",)
    model_types = ("olmoe",)
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's olmoe requires it
        **in_block({
            **norms(**LLAMA_NORMS),
            **attention(o_bias="none"),
            "self_attn.q_norm.weight": T("attn_q_norm.weight", "n_embd"),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", "n_embd"),
            **experts(),
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        reject(config, self.n_head_kv != self.n_head, "num_key_value_heads differs from num_attention_heads "
               "(llama.cpp's olmoe normalizes the keys with a norm as wide as the queries)")
        reject_routing(config, normalizes_top_k=False, arch=self.name)

    def family_keys(self, keys: ArchKeys) -> None:
        expert_keys(keys, self.config)
