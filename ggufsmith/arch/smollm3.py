"""SmolLM3 (`SmolLM3ForCausalLM`): the llama decoder with no rope in every fourth layer (NoPE).
llama.cpp's smollm3 hard-codes that pattern, so a config whose `no_rope_layers` differs from it is
refused, as is sliding-window attention (llama.cpp's smollm3 has none)."""

from __future__ import annotations

from ggufsmith.arch.common import reject
from ggufsmith.arch.llama import Llama
from ggufsmith.readers.config import HFConfig

LLAMACPP_NOPE_INTERVAL = 4  # llama.cpp: n_no_rope_layer_step


class SmolLM3(Llama):
    name = "smollm3"
    hf_classes = ("SmolLM3ForCausalLM",)
    model_types = ("smollm3",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        n_layer = config.get_int("num_hidden_layers", min=1)
        expected = [int((i + 1) % LLAMACPP_NOPE_INTERVAL != 0) for i in range(n_layer)]
        uses_rope = config.get_list("no_rope_layers", default=expected)
        reject(config, uses_rope != expected, f"no_rope_layers is {uses_rope} (llama.cpp skips the rope in every "
               f"{LLAMACPP_NOPE_INTERVAL}th layer only)")
        reject(config, config.get_bool("use_sliding_window", default=False), "use_sliding_window is set")
