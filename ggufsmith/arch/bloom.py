"""BLOOM (`BloomForCausalLM`).

ALiBi instead of position embeddings (llama.cpp's bloom uses a max bias of 8, as BLOOM does, and
reads no key for it), a layer norm right after the token embeddings (token_embd_norm), and a fused
query_key_value that interleaves heads (each head's query, key, value rows), regrouped into all
queries, all keys, all values as llama.cpp's fused qkv expects. BloomForCausalLM checkpoints prefix
names with "transformer."; BloomModel ones (bigscience/bloom-560m) do not: both are accepted.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    ATTN_NORM, ATTN_OUTPUT, ATTN_QKV, FFN_DOWN, FFN_NORM, FFN_UP, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, regroup_qkv, reject,
    weights_and_biases,
)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata

# BLOOM's training context; its config.json (seq_length) does not always say.
DEFAULT_CONTEXT_LENGTH = 2048

_NAMES = {
    "word_embeddings.weight": TOKEN_EMBD,
    **weights_and_biases({"word_embeddings_layernorm": T("token_embd_norm", "n_embd"), "ln_f": OUTPUT_NORM}),
    **weights_and_biases(
        {"input_layernorm": ATTN_NORM, "self_attention.query_key_value": ATTN_QKV, "self_attention.dense": ATTN_OUTPUT,
         "post_attention_layernorm": FFN_NORM, "mlp.dense_h_to_4h": FFN_UP, "mlp.dense_4h_to_h": FFN_DOWN},
        hf_prefix="h.{bid}.",
        gguf_prefix="blk.{bid}.",
    ),
}


class Bloom(Architecture):
    name = "bloom"
    hf_classes = ("BloomForCausalLM", "BloomModel")
    model_types = ("bloom",)
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "lm_head.weight": OUTPUT,
        **{f"transformer.{hf}": gguf for hf, gguf in _NAMES.items()},
        **_NAMES,
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.n_head = config.get_int("n_head", "num_attention_heads", min=1)
        self.hidden_size = config.get_int("hidden_size", "n_embed", min=1)
        reject(
            config,
            config.get_bool("apply_residual_connection_post_layernorm", default=False),
            "apply_residual_connection_post_layernorm is set",
        )

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("seq_length", default=DEFAULT_CONTEXT_LENGTH, min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.hidden_size)
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, 4 * self.hidden_size)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("n_layer", "num_hidden_layers", min=1))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.n_head)
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", min=0))
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(("attn_qkv.weight", "attn_qkv.bias")):
            return regroup_qkv(tensor, self.n_head, self.n_head, self.hidden_size // self.n_head)
        return tensor
