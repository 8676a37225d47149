"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, GPT-NeoX-20B, ...).

The fused query_key_value interleaves heads: for each head its query, key and value rows. llama.cpp
splits a fused qkv into all queries, all keys, all values, so the rows are regrouped (one query per
group in common.regroup_qkv). Rotary embeddings cover the first rotary_pct of each head (NeoX-style
rotation, which is llama.cpp's rope type for gptneox, so q and k need no permutation).
`use_parallel_residual` selects x + attn(ln1 x) + mlp(ln2 x) over the sequential form.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    ATTN_NORM, ATTN_OUTPUT, ATTN_QKV, FFN_DOWN, FFN_NORM, FFN_UP, OUTPUT_NORM, TOKEN_EMBD, regroup_qkv, reject,
    weights_and_biases,
)
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata


class GPTNeoX(Architecture):
    name = "gptneox"
    hf_classes = ("GPTNeoXForCausalLM",)
    model_types = ("gpt_neox",)
    tokenizer_kind = "gpt2"
    tensor_names = {
        "gpt_neox.embed_in.weight": TOKEN_EMBD,
        "embed_out.weight": T("output.weight", "n_vocab", "n_embd"),  # required: llama.cpp has no tied gptneox
        **weights_and_biases({"gpt_neox.final_layer_norm": OUTPUT_NORM}),
        **weights_and_biases(
            {"input_layernorm": ATTN_NORM, "attention.query_key_value": ATTN_QKV, "attention.dense": ATTN_OUTPUT,
             "post_attention_layernorm": FFN_NORM, "mlp.dense_h_to_4h": FFN_UP, "mlp.dense_4h_to_h": FFN_DOWN},
            hf_prefix="gpt_neox.layers.{bid}.",
            gguf_prefix="blk.{bid}.",
        ),
    }
    # Buffers older checkpoints saved: the causal mask and the rotary frequencies (from the config).
    ignored_tensors = (r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.rope = Rope(config, "rotary_emb_base")
        self.rope.require_unscaled()
        self.n_head = config.get_int("num_attention_heads", min=1)
        self.hidden_size = config.get_int("hidden_size", min=1)
        self.head_dim = self.hidden_size // self.n_head
        # llama.cpp's gptneox always reads an `output` tensor; a tied model has none to give it.
        reject(config, config.get_bool("tie_word_embeddings", default=False), "tie_word_embeddings is set")
        reject(config, not config.get_bool("attention_bias", default=True), "attention_bias is false")

    def metadata(self) -> Metadata:
        c = self.config
        rotary_fraction = self.rope.partial_rotary_factor("rotary_pct")
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.hidden_size)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(rotary_fraction * self.head_dim))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        keys.bool(Keys.LLM.USE_PARALLEL_RESIDUAL, c.get_bool("use_parallel_residual", default=True))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_eps", min=0))
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(("attn_qkv.weight", "attn_qkv.bias")):
            return regroup_qkv(tensor, self.n_head, self.n_head, self.head_dim)
        return tensor
