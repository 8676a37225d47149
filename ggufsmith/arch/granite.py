"""Granite 3.x (`GraniteForCausalLM`): the llama decoder with four multipliers llama.cpp reads as
keys: the embeddings are scaled (embedding_multiplier), each residual branch (residual_multiplier),
the attention scores (attention_multiplier, in place of 1/sqrt(head_dim)), and the logits divided
(logits_scaling). The rope is llama's (q/k permuted to GGML's pairs)."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.llama import Llama
from ggufsmith.constants import Keys


class Granite(Llama):
    name = "granite"
    hf_classes = ("GraniteForCausalLM",)
    model_types = ("granite",)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        c = self.config
        keys.f32(Keys.Attention.SCALE, c.get_float("attention_multiplier", default=None))
        keys.f32(Keys.LLM.EMBEDDING_SCALE, c.get_float("embedding_multiplier", default=None))
        keys.f32(Keys.LLM.RESIDUAL_SCALE, c.get_float("residual_multiplier", default=None))
        keys.f32(Keys.LLM.LOGIT_SCALE, c.get_float("logits_scaling", default=None))
