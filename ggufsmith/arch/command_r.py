"""Command R / R+ / Aya (`CohereForCausalLM`) and Command R7B / A (`Cohere2ForCausalLM`).

Cohere's decoder runs attention and MLP in parallel from one LayerNorm (weights only), ties the
output head to the embeddings (llama.cpp always reads token_embd) and scales the logits
(logit_scale). Its rope already rotates adjacent pairs: no permutation. Command R+ normalizes each
head of q and k; llama.cpp loads those norms exactly when the model has 64 or more blocks, so
other combinations are refused. Cohere2 adds sliding-window attention on the layers `layer_types`
names and no rope on the others (written as the per-layer sliding_window_pattern).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import periodic_layer_types, reject, sliding_flags
from ggufsmith.arch.decoder import Decoder, attention, in_block, mlp, norms
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig

QK_NORM = "n_layer >= 64"  # llama.cpp's command-r: q/k norms are Command R+'s, recognised by its depth


class CommandR(Decoder):
    name = "command-r"
    hf_classes = ("CohereForCausalLM",)
    model_types = ("cohere",)
    layer_norm = True
    context_keys = ("model_max_length", "max_position_embeddings")  # Command R's config understates it
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "model.embed_tokens.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        "model.norm.weight": T("output_norm.weight", "n_embd"),
        **in_block({
            **norms(input_layernorm="attn_norm"),
            **attention(biases="none"),
            "self_attn.q_norm.weight": T("attn_q_norm.weight", "n_head", "head_dim", when=QK_NORM),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", "n_head_kv", "head_dim", when=QK_NORM),
            **mlp(biases="none"),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        deep = config.get_int("num_hidden_layers", min=1) >= 64
        reject(config, config.get_bool("use_qk_norm", default=False) != deep,
               "use_qk_norm does not match the depth (llama.cpp reads q/k norms exactly for 64+ blocks)")
        reject(config, config.get_bool("attention_bias", default=False), "attention_bias is set")

    def family_keys(self, keys: ArchKeys) -> None:
        keys.f32(Keys.LLM.LOGIT_SCALE, self.config.get_float("logit_scale"))
        keys.string(Keys.Rope.SCALING_TYPE, "none")


class Cohere2(CommandR):
    name = "cohere2"
    hf_classes = ("Cohere2ForCausalLM",)
    model_types = ("cohere2",)
    context_keys = ("max_position_embeddings",)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        c = self.config
        default = periodic_layer_types(c.get_int("num_hidden_layers", min=1), 4)
        self.sliding_window_keys(keys, sliding_flags(self.layer_types(default)))
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.rope.partial_rotary_factor("rotary_pct") * self.head_dim))
