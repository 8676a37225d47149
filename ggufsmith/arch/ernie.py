"""ERNIE 4.5 dense (`Ernie4_5ForCausalLM`): a llama-layout decoder whose rope already rotates
adjacent pairs (GGML's normal rope: no permutation), with a SentencePiece tokenizer. Some
checkpoints name the model `ernie.` instead of `model.`; both are read."""

from __future__ import annotations

from ggufsmith.arch.decoder import Decoder, llama_decoder


class Ernie4_5(Decoder):
    name = "ernie4_5"
    hf_classes = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM")
    model_types = ("ernie4_5",)
    tensor_names = {
        **llama_decoder(o_bias="optional", mlp_biases="none"),
        **{hf.replace("model.", "ernie.", 1): spec for hf, spec in llama_decoder(o_bias="optional", mlp_biases="none").items()
           if hf.startswith("model.")},
    }
