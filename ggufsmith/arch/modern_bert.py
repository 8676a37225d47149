"""ModernBERT encoders (`ModernBertModel`; the encoder of `ModernBertForMaskedLM`, as ModernBERT-base/
-large are published, its prediction head `head.*`/`decoder.*` left out) for llama.cpp's embeddings.

llama.cpp's modern-bert graph runs the tensors as stored: the fused Wqkv as [all q, all k, all v],
NeoX rope (HF's rotate_half), the fused Wi as a GLU with the activated half first, no attention
norm in block 0 (an identity in transformers). Attention is bidirectional, global in the blocks of
layer_types' full_attention and a symmetric window elsewhere, each with its rope base. llama.cpp
loads no biases: a config with any is refused.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    SLIDING, layer_types, periodic_layer_types, reject, sentence_transformers_folder, sliding_flags,
)
from ggufsmith.arch.encoder import GELU, encoder_keys, with_prefixes
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import T
from ggufsmith.constants import GGUFValueType, Keys, arch_key
from ggufsmith.gguf_writer.metadata import Metadata

# The activations llama.cpp's modern-bert runs as a GLU (its hidden_activation key: GeGLU for GELU
# names, which it does not know and falls back on, and for "gelu"; SwiGLU for "silu").
_GLU_ACTIVATIONS = (*GELU, "silu", "swish")
_LAYER, _BLOCK = "layers.{bid}.", "blk.{bid}."
_NAMES = {
    "embeddings.tok_embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd"),
    "embeddings.norm.weight": T("token_embd_norm.weight", "n_embd"),
    _LAYER + "attn_norm.weight": T(_BLOCK + "attn_norm.weight", "n_embd", when="bid > 0"),
    _LAYER + "attn.Wqkv.weight": T(_BLOCK + "attn_qkv.weight", "3 * n_embd", "n_embd"),
    _LAYER + "attn.Wo.weight": T(_BLOCK + "attn_output.weight", "n_embd", "n_embd"),
    _LAYER + "mlp_norm.weight": T(_BLOCK + "ffn_norm.weight", "n_embd"),
    _LAYER + "mlp.Wi.weight": T(_BLOCK + "ffn_up.weight", "2 * n_ff", "n_embd"),
    _LAYER + "mlp.Wo.weight": T(_BLOCK + "ffn_down.weight", "n_embd", "n_ff"),
    "final_norm.weight": T("output_norm.weight", "n_embd"),
}


class ModernBert(Architecture):
    name = "modern-bert"
    hf_classes = ("ModernBertModel", "ModernBertForMaskedLM")
    model_types = ("modernbert",)
    tokenizer_kind = "gpt2"  # a byte-level BPE with a [CLS] $A [SEP] post-processor
    # ModernBertForMaskedLM keeps the encoder under "model."
    tensor_names = with_prefixes(_NAMES, "", "model.")
    ignored_tensors = (r"head\.(dense|norm)\.(weight|bias)", r"decoder\.(weight|bias)")  # the MLM head
    # ModernBertConfig's defaults, for config.json files that leave them out.
    config_defaults = {"hidden_activation": "gelu", "norm_eps": 1e-5, "local_attention": 128,
                       "global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        for flag in ("norm_bias", "attention_bias", "mlp_bias"):
            reject(c, c.get_bool(flag, default=False), f"{flag} is set (llama.cpp's modern-bert loads no biases)")
        activation = c.get_str("hidden_activation")
        reject(c, activation not in _GLU_ACTIVATIONS, f"hidden_activation is {activation!r} (not GELU or SiLU)")
        self.rope = Rope(c, "global_rope_theta")
        self.rope.require_unscaled()
        sliding = c.get_dict("rope_parameters", default={}).get(SLIDING, {})
        reject(c, sliding.get("rope_type", "default") != "default", "sliding-attention rope scaling is set")
        if self.rope.swa_theta is None:
            self.rope.swa_theta = c.get_float("local_rope_theta", min=0)
        # transformers' default: global attention in every third block, from the first.
        period = c.get_int("global_attn_every_n_layers", default=3, min=1)
        self.layer_types = layer_types(c, periodic_layer_types(c.get_int("num_hidden_layers", min=1), period,
                                                               full_first=True))
        self.sentence_transformers = sentence_transformers_folder(c, self.name)

    def metadata(self) -> Metadata:
        c = self.config
        metadata = encoder_keys(self.name, self.sentence_transformers, blocks=c.get_int("num_hidden_layers", min=1),
                                context=c.get_int("max_position_embeddings", min=1),
                                embd=c.get_int("hidden_size", min=1), ff=c.get_int("intermediate_size", min=1),
                                heads=c.get_int("num_attention_heads", min=1), eps=c.get_float("norm_eps", min=0),
                                token_types=None)
        keys = ArchKeys(metadata, self.name)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        keys.f32(Keys.Rope.FREQ_BASE_SWA, self.rope.swa_theta)
        keys.string(Keys.Rope.SCALING_TYPE, "none")
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.string(Keys.LLM.HIDDEN_ACT, c.get_str("hidden_activation"))
        # local_attention is the whole window (half of it each side), llama.cpp's symmetric n_swa.
        keys.u32(Keys.Attention.SLIDING_WINDOW, c.get_int("local_attention", min=2))
        pattern = sliding_flags(self.layer_types)
        if pattern != sliding_flags(periodic_layer_types(len(pattern), 3, full_first=True)):  # llama.cpp's default
            metadata.add_array(arch_key(Keys.Attention.SLIDING_WINDOW_PATTERN, self.name), pattern, GGUFValueType.BOOL)
        return metadata
