"""GLM-4 (`Glm4ForCausalLM`: GLM-4-0414, GLM-Z1): a llama-layout decoder with q/k/v biases, a
fused gate/up projection (llama.cpp's ffn_up of 2 * n_ff rows, gate first), and two more norms per
block: after attention (post_attention_norm) and after the MLP (post_ffw_norm). Its rope rotates
adjacent pairs of the first part of each head (GGML's normal rope: no permutation). A config that
leaves out head_dim or partial_rotary_factor gets Glm4Config's defaults (128, a half).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import Decoder, attention, embeddings, fused_gate_up_mlp, in_block, norms
from ggufsmith.constants import Keys


class Glm4(Decoder):
    name = "glm4"
    hf_classes = ("Glm4ForCausalLM",)
    model_types = ("glm4",)
    config_defaults = {"head_dim": 128, "partial_rotary_factor": 0.5}  # Glm4Config's
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
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.rope.partial_rotary_factor() * self.head_dim))
