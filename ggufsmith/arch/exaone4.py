"""EXAONE 4.0 (`Exaone4ForCausalLM`): a llama-layout decoder that normalizes after attention and
after the MLP (post_attention_norm, post_ffw_norm; no pre-norms) and each head of q and k (RMSNorm
over head_dim). NeoX-style rope (no permutation), llama3 scaling as rope_freqs.

With `sliding_window` set, the layers `layer_types` names (default: all but every
`sliding_window_pattern`th) attend to a window and the others attend to everything without rope.
llama.cpp's exaone4 runs that only for the 64-block model (EXAONE 4.0 32B) and otherwise rotates
every layer over the whole context, so other depths with a sliding window are refused.
Multi-token-prediction weights (`mtp.*`, which llama.cpp's dense exaone4 does not run) are left out
with a notice.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import FULL, SLIDING, periodic_layer_types, reject, sliding_flags
from ggufsmith.arch.decoder import Decoder, attention, embeddings, in_block, mlp, norms
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig


LLAMACPP_SWA_BLOCKS = 64  # llama.cpp's exaone4 has sliding-window layers only at this depth


class Exaone4(Decoder):
    name = "exaone4"
    hf_classes = ("Exaone4ForCausalLM",)
    model_types = ("exaone4",)
    mtp_prefixes = ("mtp.",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **attention(biases="none", qk_norm=True),
            **norms(post_attention_layernorm="post_attention_norm", post_feedforward_layernorm="post_ffw_norm"),
            **mlp(biases="none"),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        n_layer = config.get_int("num_hidden_layers", min=1)
        reject(config, "sliding_window" in config and n_layer != LLAMACPP_SWA_BLOCKS,
               f"sliding_window is set in a model of {n_layer} blocks (llama.cpp's exaone4 has sliding-window "
               f"layers, and no rope on the others, only with {LLAMACPP_SWA_BLOCKS} blocks)")

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        if "sliding_window" in c:
            layer_types = self.layer_types(None if "layer_types" in c else self._pattern_layer_types())
            self.sliding_window_keys(keys, sliding_flags(layer_types))

    def _pattern_layer_types(self) -> list[str]:
        """Older configs: sliding_window_pattern, every Nth layer global (4) or letters ("LLLG")."""
        c = self.config
        n_layer = c.get_int("num_hidden_layers", min=1)
        if isinstance(c.get("sliding_window_pattern", default=None), str):
            letters = c.get_str("sliding_window_pattern")
            if not letters or set(letters) - {"L", "G"}:
                raise c.error("sliding_window_pattern", letters, "letters L (local) and G (global)")
            return [SLIDING if letters[i % len(letters)] == "L" else FULL for i in range(n_layer)]
        return periodic_layer_types(n_layer, c.get_int("sliding_window_pattern", default=4, min=1))
