"""StarCoder2 (`Starcoder2ForCausalLM`): a decoder with LayerNorms and biases everywhere, a plain
GELU MLP (c_fc, c_proj) and NeoX-style rope (llama.cpp's rope type for it: no permutation).
llama.cpp requires every bias but those of q, k and v, so a checkpoint without them
(use_bias=false) is refused by the model check, naming the first missing bias."""

from __future__ import annotations

from ggufsmith.arch.common import ATTN_NORM, FFN_DOWN, FFN_NORM, FFN_UP, OUTPUT_NORM, weights_and_biases
from ggufsmith.arch.decoder import BLOCK, LAYER, Decoder, attention, embeddings, in_block


class StarCoder2(Decoder):
    name = "starcoder2"
    hf_classes = ("Starcoder2ForCausalLM",)
    model_types = ("starcoder2",)
    tokenizer_kind = "gpt2"
    layer_norm = True
    tensor_names = {
        **embeddings(),
        **weights_and_biases({"model.norm": OUTPUT_NORM}),  # LayerNorm: its bias too
        **in_block(attention(biases="optional", o_bias="required")),
        **weights_and_biases({"input_layernorm": ATTN_NORM, "post_attention_layernorm": FFN_NORM,
                              "mlp.c_fc": FFN_UP, "mlp.c_proj": FFN_DOWN}, LAYER, BLOCK),
    }
