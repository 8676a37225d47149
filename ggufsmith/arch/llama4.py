"""Llama 4 (`Llama4ForCausalLM`, and the language model of `Llama4ForConditionalGeneration`: Scout,
Maverick): llama.cpp's `llama4`. Sources: transformers' modeling_llama4.py, llama.cpp's
src/models/llama4.cpp and its converter's Llama4Model.

- Every interleave_moe_layer_step-th block is a mixture of experts (feed_forward.router,
  .experts, .shared_expert: top-k by the router's logits, sigmoid of those as the weight, which
  scales the expert's input); the others a dense MLP of intermediate_size_mlp.
- The experts are stored fused, for x @ W: gate_up_proj (E, hidden, 2F) and down_proj (E, F,
  hidden), transposed into the (E, F, hidden) / (E, hidden, F) stacks llama.cpp multiplies by.
- Rope rotates consecutive pairs (transformers' complex rope), as GGML's normal rope: no
  permutation; llama3 scaling as rope_freqs. Every 4th block has no rope (NoPE), full attention
  and, from 8192 tokens on, temperature-scaled queries; the others attend within chunks of 8192
  tokens and L2-normalize queries and keys after rope (use_qk_norm, not in the 128-expert model).
llama.cpp fixes all of that but the MoE step: the NoPE period (4), the chunk size (8192), the
temperature (floor 8192, scale 0.1) and the q/k norm (on unless 128 experts). A config that asks
for something else is refused, as are configs without experts or without chunked attention
(MobileLLM: llama.cpp's graph without chunks leaves the last block, and only it, without rope).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys, LanguageModelOf
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import (LLAMA_NORMS, ROUTER, Decoder, attention, embeddings, expert_keys, experts, in_block, mlp,
                                    norms, shared_expert)
from ggufsmith.arch.tensors import Dim, Split
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

MOE = "(bid + 1) % moe_step == 0"
DENSE = "(bid + 1) % moe_step != 0"
NOPE_PERIOD, CHUNK, TEMPERATURE = 4, 8192, {"floor_scale": 8192, "attn_scale": 0.1}
FUSED_EXPERTS = {hf: spec for hf, spec in experts(prefix="feed_forward.", router="router", when=MOE).items()
                 if ".{xid}." not in hf}  # transformers has only the fused stacks


class Llama4(Decoder):
    name = "llama4"
    hf_classes = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
    model_types = ("llama4", "llama4_text")
    tokenizer_kind = "gpt2"
    language_model = LanguageModelOf(
        prefixes={"language_model.model.": "model.", "language_model.lm_head.": "lm_head."},
        skipped={"vision_model.": "the vision tower", "multi_modal_projector.": "the multimodal projector"})
    # Llama4TextConfig's defaults for what a config.json may leave out.
    config_defaults = {"interleave_moe_layer_step": 1, "no_rope_layer_interval": NOPE_PERIOD, "attention_chunk_size": CHUNK,
                       "attn_temperature_tuning": True, **TEMPERATURE, "use_qk_norm": True, "num_local_experts": 16,
                       "num_experts_per_tok": 1}
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            **attention(biases="none"),
            **mlp(biases="none", when=DENSE, prefix="feed_forward."),
            **FUSED_EXPERTS,
            **shared_expert("feed_forward.shared_expert.", when=MOE),
        }),
    }
    f32_tensors = ROUTER
    dim_names = ("moe_step",)
    feed_forward_keys = ("intermediate_size_mlp",)  # the dense blocks'; intermediate_size is the experts'

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        n_layer = c.get_int("num_hidden_layers", min=1)
        self.moe_step = c.get_int("interleave_moe_layer_step", min=1)
        self.n_expert = c.get_int("num_local_experts", min=0)
        reject(c, self.n_expert == 0, "num_local_experts is 0 (llama.cpp's llama4 needs experts)")
        moe_layers = list(range(self.moe_step - 1, n_layer, self.moe_step))
        reject(c, c.get_list("moe_layers", default=moe_layers) != moe_layers,
               f"moe_layers is not every interleave_moe_layer_step-th layer ({moe_layers})")
        interval = c.get_int("no_rope_layer_interval", min=1)
        rope_layers = [int((i + 1) % NOPE_PERIOD != 0) for i in range(n_layer)]
        no_rope = c.get_list("no_rope_layers", default=None) or [int((i + 1) % interval != 0) for i in range(n_layer)]
        reject(c, no_rope != rope_layers, f"no_rope_layers differ from every {NOPE_PERIOD}th layer without rope")
        chunked = ["chunked_attention" if rope else "full_attention" for rope in rope_layers]
        reject(c, c.get_list("layer_types", default=chunked) != chunked,
               "layer_types are not chunked attention in the layers with rope")
        reject(c, c.get_int("attention_chunk_size", default=0) != CHUNK, f"attention_chunk_size is not {CHUNK}")
        tuning = c.get("attn_temperature_tuning")  # true, or a number, which transformers reads as a truth value
        reject(c, not isinstance(tuning, (bool, int)) or not tuning, "attn_temperature_tuning is off")
        for key, value in TEMPERATURE.items():
            reject(c, c.get_float(key) != value, f"{key} is not {value:g}")
        reject(c, c.get_bool("use_qk_norm") != (self.n_expert != 128),
               f"use_qk_norm is {c.get_bool('use_qk_norm')} (llama.cpp's is on unless there are 128 experts)")
        reject(c, c.get_bool("attention_bias", default=False), "attention_bias is set")

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        expert_keys(keys, c)
        keys.u32(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, self.moe_step)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)

    def dims(self) -> dict:
        return {"moe_step": Dim(self.moe_step, f"{self.config.label} interleave_moe_layer_step"),
                "n_ff_shexp": Dim(self.config.get_int("intermediate_size", min=1), f"{self.config.label} intermediate_size")}

    def split_tensor(self, entry: Split, tensor: LazyTensor) -> list[LazyTensor]:
        return tensor.swap_last_axes().split(2, -2)  # (E, hidden, 2F) -> (E, 2F, hidden) -> gate, up

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return tensor.swap_last_axes() if name.endswith("ffn_down_exps.weight") else tensor
