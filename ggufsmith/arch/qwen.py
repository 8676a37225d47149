"""Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`) and Qwen3 (`Qwen3ForCausalLM`): llama-layout decoders.

Qwen2 has biases on q, k and v (none on the output projection); Qwen3 drops them and normalizes
each head of q and k (RMSNorm over head_dim) before the rope. Both rotate with NeoX-style halves,
which is llama.cpp's rope type for them, so q and k keep HF's layout (no llama permutation).
Qwen2's sliding-window option (use_sliding_window, off in every released model) is refused:
llama.cpp's qwen2 attends to the whole context.
"""

from __future__ import annotations

from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import Decoder, llama_decoder
from ggufsmith.readers.config import HFConfig


class Qwen2(Decoder):
    name = "qwen2"
    hf_classes = ("Qwen2ForCausalLM",)
    model_types = ("qwen2",)
    tensor_names = llama_decoder(o_bias="none", mlp_biases="none")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        reject(config, config.get_bool("use_sliding_window", default=False), "use_sliding_window is set")


class Qwen3(Qwen2):
    name = "qwen3"
    hf_classes = ("Qwen3ForCausalLM",)
    model_types = ("qwen3",)
    tensor_names = llama_decoder(o_bias="none", mlp_biases="none", qk_norm=True)
