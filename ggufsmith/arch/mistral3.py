"""Ministral 3 (`Ministral3ForCausalLM`): the llama decoder (q/k permuted to GGML's pairs) with
yarn rope and Llama 4's attention temperature: queries are scaled by 1 + beta ln(1 + floor(pos /
original_max_position_embeddings)) (rope_parameters' llama_4_scaling_beta, llama.cpp's
attention.temperature_scale, over rope.scaling.original_context_length). yarn's mscale_all_dim is
llama.cpp's rope.scaling.yarn_log_multiplier.

`Mistral3ForConditionalGeneration` (Mistral Small 3.1 and later, Ministral 3 with vision): its
language model (text_config: Mistral or Ministral 3), as llama.cpp's converter does; the Pixtral
vision tower and the projector are left out with one notice (llama.cpp loads them from an mmproj).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.gemma import MULTIMODAL_GEMMA3 as LLAVA_STYLE  # the same layout: language_model, vision_tower, projector
from ggufsmith.arch.llama import Llama
from ggufsmith.constants import Keys


class Mistral3(Llama):
    name = "mistral3"
    hf_classes = ("Ministral3ForCausalLM", "Mistral3ForConditionalGeneration")
    model_types = ("ministral3",)
    language_model = LLAVA_STYLE
    yarn_log_multiplier = True

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        keys.f32(Keys.Attention.TEMPERATURE_SCALE, self.rope.params.get_float("llama_4_scaling_beta", default=None))
