"""OLMo 2 and OLMo 3 (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`): a llama-layout decoder that
normalizes after attention and after the MLP (post_attention_norm, post_ffw_norm) instead of before,
and normalizes all queries (width n_head * head_dim) and all keys (n_head_kv * head_dim) with one
RMSNorm each. NeoX-style rope (no permutation). OLMo 3 adds sliding-window attention on the layers
`layer_types` names (default: all but every fourth), written as llama.cpp's sliding_window keys.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import Q_ROWS, KV_ROWS, Decoder, attention, embeddings, in_block, mlp, norms
from ggufsmith.arch.tensors import T


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
