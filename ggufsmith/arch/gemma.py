"""Gemma 1, 2 and 3 (`GemmaForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM` and the language
model of `Gemma3ForConditionalGeneration`). Sources: transformers' modeling_gemma*.py for the
checkpoint, llama.cpp's src/models/gemma*.cpp and its Gemma converter for what the GGUF must hold.

What the three share, and how llama.cpp wants it:
- RMSNorm weights are stored as offsets from 1 (HF computes x * (1 + w)); llama.cpp's norm is
  x * w, so every norm weight is written as 1 + w (computed in float32; norms stay F32).
- Embeddings are scaled by sqrt(hidden_size) in the model; llama.cpp's graph does that itself.
- Rotary embeddings are HF's rotate_half, which llama.cpp runs as NeoX rope: no permutation.
- The MLP is GeGLU with the tanh GELU (`gelu_pytorch_tanh`), llama.cpp's LLM_FFN_GELU.
- Attention scores are scaled by query_pre_attn_scalar**-0.5 (Gemma 2/3); llama.cpp derives the
  scale from the model size instead (1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B
  models), so any other value is refused.
Gemma 1 and 2 always use the token embeddings as output head in llama.cpp; Gemma 3 may have its own.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.arch.base import ArchKeys, HFConfig, LanguageModelOf
from ggufsmith.arch.common import SLIDING, periodic_layer_types, reject, sliding_flags
from ggufsmith.arch.decoder import LLAMA_NORMS, Decoder, attention, embeddings, in_block, mlp, norms
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor

GELU_TANH = "gelu_pytorch_tanh"

# Gemma 2/3 block norms: one before and one after both attention and the MLP.
SANDWICH_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}

# The language model inside Gemma3ForConditionalGeneration, as transformers 5 saves it and as the
# Gemma 3 checkpoints on the Hub (transformers 4.5x) store it; the SigLIP vision tower and the
# projector are llama.cpp's mmproj file, converted separately.
MULTIMODAL_GEMMA3 = LanguageModelOf(
    prefixes={"model.language_model.": "model.", "language_model.model.": "model.",
              "language_model.lm_head.": "lm_head."},
    skipped={"model.vision_tower.": "the vision tower", "vision_tower.": "the vision tower",
             "model.multi_modal_projector.": "the multimodal projector",
             "multi_modal_projector.": "the multimodal projector"},
)


def offset_norm(tensor: LazyTensor) -> LazyTensor:
    """Gemma's RMSNorm weight w (applied as 1 + w) as the plain weight llama.cpp multiplies by."""
    return tensor.map(lambda a: a.astype(np.float32) + np.float32(1.0), dtype="F32")


def without_output(table: dict[str, T]) -> dict[str, T]:
    return {hf: spec for hf, spec in table.items() if spec.name != "output.weight"}


class _GemmaBase(Decoder):
    """What Gemma 1-3 share; subclasses give the name, the table and their generation's keys."""

    tokenizer_kind = "llama"  # SentencePiece (tokenizer.model)
    tied_output_head = r"lm_head\.weight"
    activation_keys: tuple[str, ...] = ("hidden_activation",)
    swa_pattern = 0  # llama.cpp's default sliding-window period for the architecture (0: none)
    layers_of_27b = 0  # the layer count by which llama.cpp recognises the 27B model (its attention scale)
    bidirectional = False  # attention both ways (EmbeddingGemma's use_bidirectional_attention)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.n_layer = c.get_int("num_hidden_layers", min=1)
        self.n_embd = c.get_int("hidden_size", min=1)
        key = next((k for k in self.activation_keys if k in c), self.activation_keys[0])
        activation = c.get_str(key, default=GELU_TANH)
        # Gemma 1's legacy "gelu" means the tanh one (transformers replaces it); later Gemmas' is exact.
        allowed = (GELU_TANH, "gelu") if self.name == "gemma" else (GELU_TANH,)
        reject(c, activation not in allowed, f"{c.key_name(key)} is {activation!r} (llama.cpp runs {GELU_TANH})")
        reject(c, c.get_bool("attention_bias", default=False), "attention_bias is set")
        bidirectional = c.get_bool("use_bidirectional_attention", default=False)
        reject(c, bidirectional != self.bidirectional, f"use_bidirectional_attention is {str(bidirectional).lower()} "
               f"(llama.cpp's {self.name} attends {'both ways' if self.bidirectional else 'causally'})")

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return offset_norm(tensor) if name.endswith("norm.weight") else tensor

    def require_tied_output(self) -> None:
        reject(self.config, not self.config.get_bool("tie_word_embeddings", default=True),
               f"tie_word_embeddings is false (llama.cpp's {self.name} uses the token embeddings as output head)")

    # -- Gemma 2/3 pieces ----------------------------------------------------------------------
    def check_attention_scale(self) -> None:
        """llama.cpp scales queries by 1/sqrt(head_dim), by 1/sqrt(hidden/heads) for the 27B
        models (which it knows by their layer count); HF by query_pre_attn_scalar**-0.5."""
        c = self.config
        scalar = c.get_float("query_pre_attn_scalar", min=0)
        big = self.n_layer == self.layers_of_27b
        expected = self.n_embd // self.n_head if big else self.head_dim
        reject(c, scalar != expected, f"query_pre_attn_scalar is {scalar:g}, not {expected} "
               f"({'hidden_size / num_attention_heads' if big else 'head_dim'})")

    def swa_layer_types(self) -> list[str]:
        """layer_types, else the period of the legacy sliding_window_pattern (transformers' default)."""
        period = self.config.get_int("sliding_window_pattern", default=self.swa_pattern, min=1)
        return self.layer_types(periodic_layer_types(self.n_layer, period))

    def pattern_unless_default(self, types: list[str]) -> list[bool] | None:
        """The per-layer sliding flags when they differ from llama.cpp's default for the arch."""
        pattern = sliding_flags(types)
        return None if pattern == sliding_flags(periodic_layer_types(self.n_layer, self.swa_pattern)) else pattern

    def final_softcap(self, keys: ArchKeys, required: bool) -> None:
        c = self.config
        cap = c.get_float("final_logit_softcapping", default=None, min=0)
        reject(c, required and not cap, f"final_logit_softcapping is not set (llama.cpp's {self.name} always caps)")
        keys.f32(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, cap or None)


class Gemma(_GemmaBase):
    name = "gemma"
    hf_classes = ("GemmaForCausalLM",)
    model_types = ("gemma",)
    activation_keys = ("hidden_activation", "hidden_act")  # legacy "gelu" means the tanh one, as in transformers
    config_defaults = {"head_dim": 256}  # GemmaConfig's; the key/value length keys are then always written
    tensor_names = {
        **without_output(embeddings()),
        **in_block({**norms(**LLAMA_NORMS), **attention(biases="none"), **mlp(biases="none")}),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.rope.require_unscaled()
        self.require_tied_output()


class Gemma2(_GemmaBase):
    name = "gemma2"
    hf_classes = ("Gemma2ForCausalLM",)
    model_types = ("gemma2",)
    config_defaults = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                       "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
    swa_pattern = 2
    layers_of_27b = 46
    tensor_names = {
        **without_output(embeddings()),
        **in_block({**norms(**SANDWICH_NORMS), **attention(biases="none"), **mlp(biases="none")}),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.rope.require_unscaled()
        self.require_tied_output()
        self.check_attention_scale()

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        attn_cap = c.get_float("attn_logit_softcapping", default=None, min=0)
        reject(c, not attn_cap, "attn_logit_softcapping is not set (llama.cpp's gemma2 always caps)")
        keys.f32(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, attn_cap)
        self.final_softcap(keys, required=True)
        self.sliding_window_keys(keys, self.pattern_unless_default(self.swa_layer_types()))


class Gemma3(_GemmaBase):
    name = "gemma3"
    hf_classes = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    model_types = ("gemma3", "gemma3_text")
    language_model = MULTIMODAL_GEMMA3
    # Gemma3TextConfig's defaults: the Hub's multimodal configs give only what differs from them.
    config_defaults = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                       "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                       "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
                       "sliding_window": 4096, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
    swa_pattern = 6
    layers_of_27b = 62
    tensor_names = {
        **embeddings(),
        **in_block({**norms(**SANDWICH_NORMS), **attention(biases="none", qk_norm=True), **mlp(biases="none")}),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, c.get_float("attn_logit_softcapping", default=None) is not None,
               "attn_logit_softcapping is set (llama.cpp's gemma3 does not cap attention scores)")
        self.check_attention_scale()
        reject(c, self.rope.type not in ("default", "linear"),
               f"full-attention rope scaling {self.rope.type!r} is set (llama.cpp's gemma3 runs linear scaling only)")
        # transformers 5 nests the local layers' rope in rope_parameters.sliding_attention (read by
        # Rope); older configs give rope_local_base_freq, and never scale the local rope.
        sliding = c.sub("rope_parameters").get_dict(SLIDING) if SLIDING in c.get_dict("rope_parameters", default={}) else {}
        reject(c, sliding.get("rope_type", "default") != "default",
               f"sliding-attention rope scaling {sliding.get('rope_type')!r} is set (llama.cpp's gemma3 runs none there)")
        if self.rope.swa_theta is None:
            self.rope.swa_theta = c.get_float("rope_local_base_freq", min=0)

    def family_keys(self, keys: ArchKeys) -> None:
        if not self.multimodal:
            # Gemma3ForConditionalGeneration never applies text_config.final_logit_softcapping
            # (transformers 5.x); the causal LM does.
            self.final_softcap(keys, required=False)
        types = self.swa_layer_types()
        if SLIDING in types:
            self.sliding_window_keys(keys, self.pattern_unless_default(types))
