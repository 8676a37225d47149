"""StableLM 2 (`StableLmForCausalLM`): LayerNorms with biases, a partial rotary (NeoX style: no
permutation), optional q/k/v biases and, in the 12B model, a LayerNorm per head of q and k
(stacked into one (heads, head_dim) tensor each) with attention and MLP in parallel (no
post-attention norm, which llama.cpp takes as the parallel form)."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import ATTN_NORM, OUTPUT_NORM, weights_and_biases
from ggufsmith.arch.decoder import BLOCK, LAYER, Decoder, attention, embeddings, in_block, mlp
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys


class StableLM(Decoder):
    name = "stablelm"
    hf_classes = ("StableLmForCausalLM",)
    model_types = ("stablelm",)
    layer_norm = True
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's stablelm requires it
        **weights_and_biases({"model.norm": OUTPUT_NORM}),
        **weights_and_biases({"input_layernorm": ATTN_NORM}, LAYER, BLOCK),
        # absent in the parallel form (use_parallel_residual)
        **weights_and_biases({"post_attention_layernorm": T("ffn_norm", "n_embd", optional=True)}, LAYER, BLOCK),
        **in_block({
            **attention(biases="optional", o_bias="none"),
            "self_attn.q_layernorm.norms.{xid}.weight": T("attn_q_norm.weight", "n_head", "head_dim", optional=True),
            "self_attn.k_layernorm.norms.{xid}.weight": T("attn_k_norm.weight", "n_head_kv", "head_dim", optional=True),
            **mlp(biases="none"),
        }),
    }

    def family_keys(self, keys: ArchKeys) -> None:
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.rope.partial_rotary_factor() * self.head_dim))
        keys.bool(Keys.LLM.USE_PARALLEL_RESIDUAL, self.config.get_bool("use_parallel_residual", default=False))
