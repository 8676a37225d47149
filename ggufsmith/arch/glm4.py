"""GLM-4 (`Glm4ForCausalLM`: GLM-4-0414, GLM-Z1): a llama-layout decoder with q/k/v biases, a
fused gate/up projection (llama.cpp's ffn_up of 2 * n_ff rows, gate first), and two more norms per
block: after attention (post_attention_norm) and after the MLP (post_ffw_norm). Its rope rotates
adjacent pairs of the first half of each head (GGML's normal rope: no permutation);
partial_rotary_factor is 0.5 when the config does not say, as in transformers' Glm4Config.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import Decoder, attention, embeddings, fused_gate_up_mlp, in_block, norms
from ggufsmith.constants import Keys

GLM4_PARTIAL_ROTARY = 0.5  # Glm4Config's default


class Glm4(Decoder):
    name = "glm4"
    hf_classes = ("Glm4ForCausalLM",)
    model_types = ("glm4",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(input_layernorm="attn_norm", post_self_attn_layernorm="post_attention_norm",
                    post_attention_layernorm="ffn_norm", post_mlp_layernorm="post_ffw_norm"),
            **attention(biases="optional", o_bias="none"),
            **fused_gate_up_mlp(),
        }),
    }

    def family_keys(self, keys: ArchKeys) -> None:
        rotated = self.rope.partial_rotary_factor(default=GLM4_PARTIAL_ROTARY)
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(rotated * self.head_dim))
