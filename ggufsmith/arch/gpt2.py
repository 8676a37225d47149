"""GPT-2 (`GPT2LMHeadModel`).

GPT-2's projections are Conv1D modules, whose weight is stored (in_features, out_features): the
transpose of a Linear's. Every 2-D block weight is transposed to the (out, in) layout GGUF uses for
matrices. c_attn already holds all queries, then all keys, then all values, as llama.cpp's fused qkv
expects. Checkpoints saved from GPT2LMHeadModel prefix names with "transformer."; the original
OpenAI ones (GPT2Model) do not: both are accepted.
"""

from __future__ import annotations

import re

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    ATTN_NORM, ATTN_OUTPUT, ATTN_QKV, FFN_DOWN, FFN_NORM, FFN_UP, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, reject, transposed,
    weights_and_biases,
)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata

_NAMES = {
    "wte.weight": TOKEN_EMBD,
    "wpe.weight": T("position_embd.weight", "n_ctx", "n_embd"),
    **weights_and_biases({"ln_f": OUTPUT_NORM}),
    **weights_and_biases(
        {"ln_1": ATTN_NORM, "attn.c_attn": ATTN_QKV, "attn.c_proj": ATTN_OUTPUT,
         "ln_2": FFN_NORM, "mlp.c_fc": FFN_UP, "mlp.c_proj": FFN_DOWN},
        hf_prefix="h.{bid}.",
        gguf_prefix="blk.{bid}.",
    ),
}
_CONV1D_WEIGHTS = re.compile(r"blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight")


class GPT2(Architecture):
    name = "gpt2"
    hf_classes = ("GPT2LMHeadModel",)
    model_types = ("gpt2",)
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "lm_head.weight": OUTPUT,
        **{f"transformer.{hf}": gguf for hf, gguf in _NAMES.items()},
        **_NAMES,
    }
    # Position embeddings stay F32 whatever the outtype, as llama.cpp's converter and quantizer keep them.
    f32_tensors = (r"position_embd\.weight",)
    # The causal-mask buffers older transformers saved with the weights.
    ignored_tensors = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        reject(config, config.get_bool("scale_attn_by_inverse_layer_idx", default=False), "scale_attn_by_inverse_layer_idx is set")
        reject(config, not config.get_bool("scale_attn_weights", default=True), "scale_attn_weights is false")

    def metadata(self) -> Metadata:
        c = self.config
        n_embd = c.get_int("n_embd", "hidden_size", min=1)
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("n_layer", "num_hidden_layers", min=1))
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("n_positions", "n_ctx", "max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, n_embd)
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("n_inner", default=4 * n_embd, min=1))
        keys.u32(Keys.Attention.HEAD_COUNT, c.get_int("n_head", "num_attention_heads", min=1))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", min=0))
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if _CONV1D_WEIGHTS.fullmatch(name):
            return transposed(tensor)
        return tensor
