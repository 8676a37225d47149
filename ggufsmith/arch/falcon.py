"""Falcon (`FalconForCausalLM`, and the older remote-code `RWForCausalLM` configs).

Two config styles describe the same weights:
  current (transformers): num_attention_heads, num_kv_heads, new_decoder_architecture, multi_query,
                          parallel_attn, num_hidden_layers
  old RW (model_type RefinedWebModel / RefinedWeb): n_head, n_head_kv, multi_query, n_layer; a
                          config with n_head_kv (or model_type RefinedWeb) is the Falcon-40B decoder.
Key/value heads: the new (40B) decoder has num_kv_heads of them, the 7B one with multi_query has 1,
otherwise every head has its own. The fused query_key_value is regrouped from kv groups to all
queries, all keys, all values (`falcon.tensor_data_layout = jploski`, see common.regroup_qkv).

Norms: the 40B decoder normalizes the attention input (ln_attn) and the MLP input (ln_mlp)
separately. llama.cpp's falcon graph feeds `attn_norm` to the MLP and `attn_norm_2`, when present,
to the attention, so ln_mlp becomes attn_norm and ln_attn attn_norm_2. With one norm
(input_layernorm) both read attn_norm.

llama.cpp's graph is the parallel-attention, rotary, bias-free Falcon; the sequential and ALiBi
variants (falcon-rw) are refused rather than converted into a file that computes something else.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    ATTN_NORM, ATTN_OUTPUT, ATTN_QKV, FFN_DOWN, FFN_UP, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, regroup_qkv, reject,
    weights_and_biases,
)
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata

# The GGUF spec's name for the regrouped qkv layout (after the author of the first GGML Falcon).
JPLOSKI_LAYOUT = "jploski"
# Falcon's configs before transformers added max_position_embeddings: all models were trained on 2048.
DEFAULT_CONTEXT_LENGTH = 2048
_LAYER, _BLOCK = "transformer.h.{bid}.", "blk.{bid}."


class Falcon(Architecture):
    name = "falcon"
    hf_classes = ("FalconForCausalLM", "RWForCausalLM")
    model_types = ("falcon", "RefinedWeb", "RefinedWebModel")
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "transformer.word_embeddings.weight": TOKEN_EMBD,
        "lm_head.weight": OUTPUT,
        **weights_and_biases({"transformer.ln_f": OUTPUT_NORM}),
        **weights_and_biases(
            {"input_layernorm": ATTN_NORM, "ln_mlp": ATTN_NORM, "ln_attn": T("attn_norm_2", "n_embd", optional=True)},
            hf_prefix=_LAYER, gguf_prefix=_BLOCK,
        ),
        # bias-free Linear layers (a config with bias=true is refused)
        **weights_and_biases(
            {"self_attention.query_key_value": ATTN_QKV, "self_attention.dense": ATTN_OUTPUT,
             "mlp.dense_h_to_4h": FFN_UP, "mlp.dense_4h_to_h": FFN_DOWN},
            hf_prefix=_LAYER, gguf_prefix=_BLOCK, biases="none",
        ),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.rope = Rope(config)
        self.rope.require_unscaled()
        self.n_head = config.get_int("num_attention_heads", "n_head", min=1)
        self.hidden_size = config.get_int("hidden_size", "n_embed", min=1)
        self.head_dim = self.hidden_size // self.n_head
        new_decoder = config.get_bool(
            "new_decoder_architecture",
            default=config.model_type == "RefinedWeb" or "n_head_kv" in config,
        )
        if new_decoder:
            self.n_head_kv = config.get_int("num_kv_heads", "n_head_kv", min=1)
        else:
            self.n_head_kv = 1 if config.get_bool("multi_query", default=True) else self.n_head
        reject(config, config.get_bool("alibi", default=False), "alibi is set (a falcon-rw model)")
        reject(config, config.get_bool("bias", default=False), "bias is set (Linear layers with biases)")
        reject(
            config,
            not new_decoder and not config.get_bool("parallel_attn", default=True),
            "parallel_attn is false (attention and MLP in sequence)",
        )

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_position_embeddings", default=DEFAULT_CONTEXT_LENGTH))
        keys.string(Keys.LLM.TENSOR_DATA_LAYOUT, JPLOSKI_LAYOUT)
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.hidden_size)
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("ffn_hidden_size", default=4 * self.hidden_size, min=1))
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", "n_layer", min=1))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.n_head_kv)
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", min=0))
        # Required by the spec, which does not define it, and read by no executor we know of:
        # Falcon layer-normalizes the attention input, so true.
        keys.bool(Keys.Attention.USE_NORM, True)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith("attn_qkv.weight"):
            return regroup_qkv(tensor, self.n_head, self.n_head_kv, self.head_dim)
        return tensor
