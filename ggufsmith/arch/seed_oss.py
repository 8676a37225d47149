"""Seed-OSS (`SeedOssForCausalLM`): a llama-layout decoder with q/k/v biases and NeoX-style rope
(no permutation). llama.cpp names its pre-MLP norm (HF post_attention_layernorm) post_attention_norm,
and has no output-projection bias (attention_out_bias, off in the released model, is refused by the
model check)."""

from __future__ import annotations

from ggufsmith.arch.decoder import Decoder, attention, embeddings, in_block, mlp, norms


class SeedOss(Decoder):
    name = "seed_oss"
    hf_classes = ("SeedOssForCausalLM",)
    model_types = ("seed_oss",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(input_layernorm="attn_norm", post_attention_layernorm="post_attention_norm"),
            **attention(biases="optional", o_bias="none"),
            **mlp(biases="none"),
        }),
    }
