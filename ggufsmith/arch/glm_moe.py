"""GLM-4.5 / 4.6 (`Glm4MoeForCausalLM`): llama.cpp's `glm4moe`. Grouped-query attention with
optional q/k/v biases and per-head q/k norms, NeoX-style rope on the first half of each head
(partial_rotary_factor, 0.5 by default), the normalization after attention named
post_attention_norm, and DeepSeek V3's feed-forward: dense leading blocks, then sigmoid routing with
a selection bias over routed experts, plus shared experts (decoder.sparse_blocks, as deepseek2's).

The next-token-prediction layer(s) (model.layers.<num_hidden_layers>...) are kept, as llama.cpp's
converter keeps them: a whole block (attention, experts) plus eh_proj, enorm, hnorm and its optional
shared_head and embeddings, counted in block_count and named by nextn_predict_layers. llama.cpp's
normal graph runs the first num_hidden_layers blocks only; its speculative decoding runs the rest.
A checkpoint without them (transformers does not save them) converts to the trunk alone, with a notice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ggufsmith.arch.base import ArchKeys, MappedTensor
from ggufsmith.arch.decoder import ROUTER, Decoder, attention, embeddings, in_block, norms, routing_keys, sparse_blocks, sparse_dims
from ggufsmith.arch.tensors import Dim, T
from ggufsmith.constants import GGUFValueType, Keys, arch_key
from ggufsmith.readers.lazy_tensor import LazyTensor

NEXTN = "bid >= n_layer - n_nextn"
_BLOCK = re.compile(r"model\.layers\.(\d+)\.")


class Glm4Moe(Decoder):
    name = "glm4moe"
    hf_classes = ("Glm4MoeForCausalLM",)
    model_types = ("glm4_moe",)
    # Glm4MoeConfig's defaults for the keys a config.json may leave out.
    config_defaults = {"partial_rotary_factor": 0.5, "first_k_dense_replace": 1, "n_shared_experts": 1,
                       "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True}
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(input_layernorm="attn_norm", post_attention_layernorm="post_attention_norm"),
            **attention(biases="optional", o_bias="none"),
            "self_attn.q_norm.weight": T("attn_q_norm.weight", "head_dim", optional=True),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", "head_dim", optional=True),
            **sparse_blocks(bias_optional=False),
            "eh_proj.weight": T("nextn.eh_proj.weight", "n_embd", "2 * n_embd", when=NEXTN),
            "enorm.weight": T("nextn.enorm.weight", "n_embd", when=NEXTN),
            "hnorm.weight": T("nextn.hnorm.weight", "n_embd", when=NEXTN),
            "embed_tokens.weight": T("nextn.embed_tokens.weight", "n_vocab", "n_embd", optional=True, when=NEXTN),
            "shared_head.head.weight": T("nextn.shared_head_head.weight", "n_vocab", "n_embd", optional=True, when=NEXTN),
            "shared_head.norm.weight": T("nextn.shared_head_norm.weight", "n_embd", optional=True, when=NEXTN),
        }),
    }
    f32_tensors = ROUTER
    dim_names = ("n_layer_dense_lead", "n_nextn")

    def __init__(self, config) -> None:
        super().__init__(config)
        # The next-token-prediction layers written: those of config.json, unless the checkpoint
        # has none (map_tensors, which runs before metadata and the check, finds out).
        self.n_nextn = self.config.get_int("num_nextn_predict_layers", default=0, min=0)

    def map_tensors(self, source: Mapping[str, LazyTensor]) -> list[MappedTensor]:
        n_layer = self.config.get_int("num_hidden_layers", min=1)
        self.n_nextn = self.config.get_int("num_nextn_predict_layers", default=0, min=0)
        if self.n_nextn and not any(int(m.group(1)) >= n_layer for m in map(_BLOCK.match, source) if m):
            self._skipped_notice = (f"{self.config.path}: num_nextn_predict_layers is {self.n_nextn} but the checkpoint "
                                    "has no next-token-prediction layer; converted without it")
            self.n_nextn = 0
        return super().map_tensors(source)

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        n_nextn = self.n_nextn
        if n_nextn:
            blocks = c.get_int("num_hidden_layers", min=1) + n_nextn
            keys.metadata.replace(arch_key(Keys.LLM.BLOCK_COUNT, self.name), blocks, GGUFValueType.UINT32)
            keys.u32(Keys.LLM.NEXTN_PREDICT_LAYERS, n_nextn)
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.head_dim * self.rope.partial_rotary_factor()))
        routing_keys(keys, c, scoring="sigmoid", grouped=True)

    def dims(self) -> dict:
        return {**sparse_dims(self.config), "n_nextn": Dim(self.n_nextn, f"{self.config.label} num_nextn_predict_layers")}
