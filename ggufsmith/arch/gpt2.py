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
from ggufsmith.arch.common import reject, transposed, weights_and_biases
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata

_NAMES = {
    "wte.weight": "token_embd.weight",
    "wpe.weight": "position_embd.weight",
    **weights_and_biases({"ln_f": "output_norm"}),
    **weights_and_biases(
        {
            "ln_1": "attn_norm",
            "attn.c_attn": "attn_qkv",
            "attn.c_proj": "attn_output",
            "ln_2": "ffn_norm",
            "mlp.c_fc": "ffn_up",
            "mlp.c_proj": "ffn_down",
        },
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
        "lm_head.weight": "output.weight",
        **{f"transformer.{hf}": gguf for hf, gguf in _NAMES.items()},
        **_NAMES,
    }
    # Position embeddings stay F32 whatever the outtype, as llama.cpp's converter and quantizer keep them.
    f32_tensors = (r"position_embd\.weight",)
    # The causal-mask buffers older transformers saved with the weights.
    ignored_tensors = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        reject(config, config.get("scale_attn_by_inverse_layer_idx", default=False), "scale_attn_by_inverse_layer_idx is set")
        reject(config, not config.get("scale_attn_weights", default=True), "scale_attn_weights is false")

    def metadata(self) -> Metadata:
        c = self.config
        n_embd = c.get("n_embd", "hidden_size")
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get("n_layer", "num_hidden_layers"))
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get("n_positions", "n_ctx", "max_position_embeddings"))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, n_embd)
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get("n_inner", default=4 * n_embd))
        keys.u32(Keys.Attention.HEAD_COUNT, c.get("n_head", "num_attention_heads"))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get("layer_norm_epsilon"))
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if _CONV1D_WEIGHTS.fullmatch(name):
            return transposed(tensor)
        return tensor
