"""Apertus (`ApertusForCausalLM`): a llama-layout decoder whose MLP has no gate: down(xIELU(up(x))),
with q/k norms (RMSNorm per head), llama3 rope scaling and NeoX-style rope (no permutation); its
norms are named attention_layernorm and feedforward_layernorm. xIELU has four learned numbers per
block (mlp.act_fn.alpha_p, alpha_n, beta, eps), which llama.cpp reads as the xielu.* array keys:
they are read from the checkpoint before planning (Architecture.scalar_tensors) and written raw, as
llama.cpp applies the softplus to alpha_p and alpha_n itself.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import Decoder, attention, embeddings, in_block, norms
from ggufsmith.arch.tensors import T
from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig

ACT = "model.layers.{bid}.mlp.act_fn."


class Apertus(Decoder):
    name = "apertus"
    hf_classes = ("ApertusForCausalLM",)
    model_types = ("apertus",)
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's apertus requires it
        **in_block({
            **norms(attention_layernorm="attn_norm", feedforward_layernorm="ffn_norm"),
            **attention(biases="optional", qk_norm=True),
            "mlp.up_proj.weight": T("ffn_up.weight", "n_ff", "n_embd"),
            "mlp.down_proj.weight": T("ffn_down.weight", "n_embd", "n_ff"),
        }),
    }
    scalar_tensors = {ACT + "alpha_n": Keys.XIELU.ALPHA_N, ACT + "alpha_p": Keys.XIELU.ALPHA_P,
                      ACT + "beta": Keys.XIELU.BETA, ACT + "eps": Keys.XIELU.EPS}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        activation = config.get_str("hidden_act", default="xielu")
        reject(config, activation != "xielu", f"hidden_act is {activation!r} (llama.cpp's apertus computes xIELU)")

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)
        n_layer = c.get_int("num_hidden_layers", min=1)
        for hf_pattern, key in self.scalar_tensors.items():
            values = self.scalars.get(key, [])
            if len(values) < n_layer:
                raise ConversionError(f"the checkpoint lacks {hf_pattern.format(bid=len(values))}, which llama.cpp "
                                      f"needs ({c.path} num_hidden_layers = {n_layer})")
            if len(values) > n_layer:
                raise ConversionError(f"the checkpoint has {hf_pattern} for {len(values)} blocks, but {c.path} "
                                      f"num_hidden_layers = {n_layer}")
            keys.metadata.add_array(key, values, GGUFValueType.FLOAT32)
