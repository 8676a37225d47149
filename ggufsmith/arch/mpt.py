"""MPT (`MptForCausalLM` in transformers, `MPTForCausalLM` in MosaicML's own code: same weights).

ALiBi with a configurable maximum bias, an optional clamp of q, k and v (clip_qkv), and no biases
(no_bias: the layer norms have weights only). Wqkv already holds all queries, then all keys, then
all values. The spec and llama.cpp name two keys differently; both names are written:
  spec: mpt.attention.alibi_bias_max, mpt.attention.clip_kqv
  llama.cpp reads: mpt.attention.max_alibi_bias, mpt.attention.clamp_kqv
clip_kqv is required by the spec; 0 stands for "no clamp", which is also what llama.cpp does with 0.
"""

from __future__ import annotations

import math

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import (
    ATTN_NORM, ATTN_OUTPUT, ATTN_QKV, FFN_DOWN, FFN_NORM, FFN_UP, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, reject,
    weights_and_biases,
)
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata


class MPT(Architecture):
    name = "mpt"
    hf_classes = ("MptForCausalLM", "MPTForCausalLM")
    model_types = ("mpt",)
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "transformer.wte.weight": TOKEN_EMBD,
        # MosaicML's learned_pos_emb without alibi
        "transformer.wpe.weight": T("position_embd.weight", "n_ctx", "n_embd", optional=True),
        "lm_head.weight": OUTPUT,
        **weights_and_biases({"transformer.norm_f": OUTPUT_NORM}, biases="optional"),
        **weights_and_biases(
            {"norm_1": ATTN_NORM, "attn.Wqkv": ATTN_QKV, "attn.out_proj": ATTN_OUTPUT,
             "norm_2": FFN_NORM, "ffn.up_proj": FFN_UP, "ffn.down_proj": FFN_DOWN,
             # MosaicML's qk_ln
             "attn.q_ln": T("attn_q_norm", "n_embd", optional=True),
             "attn.k_ln": T("attn_k_norm", "n_embd", optional=True)},
            hf_prefix="transformer.blocks.{bid}.",
            gguf_prefix="blk.{bid}.",
            biases="optional",
        ),
    }

    # Position embeddings stay F32 whatever the outtype, as llama.cpp's converter and quantizer keep them.
    f32_tensors = (r"position_embd\.weight",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.attn_config = config.sub("attn_config", config.get_dict("attn_config", default={}))
        self.d_model = config.get_int("d_model", "hidden_size", min=1)
        self.n_heads = config.get_int("n_heads", "num_attention_heads", min=1)
        scale = self.attn_config.get_float("softmax_scale", default=None)
        reject(
            config,
            scale is not None and not math.isclose(scale, 1 / math.sqrt(self.d_model // self.n_heads)),
            f"attn_config.softmax_scale is {scale}, not 1/sqrt(head size)",
        )
        reject(config, "logit_scale" in config, "logit_scale is set")
        reject(config, self.attn_config.get_bool("prefix_lm", default=False), "attn_config.prefix_lm is set")

    def metadata(self) -> Metadata:
        c = self.config
        alibi_bias_max = self.attn_config.get_float("alibi_bias_max", default=8.0) if self.attn_config.get_bool("alibi", default=True) else 0.0
        clip_qkv = self.attn_config.get_float("clip_qkv", default=None, min=0)
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_seq_len", "max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.d_model)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("n_layers", "num_hidden_layers", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, int(c.get_float("expansion_ratio", default=4, min=0) * self.d_model))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_heads)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.attn_config.get_int("kv_n_heads", default=None, min=1))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", default=1e-5, min=0))
        keys.f32(Keys.Attention.CLAMP_KQV, clip_qkv)
        keys.f32(Keys.Attention.MAX_ALIBI_BIAS, alibi_bias_max)
        keys.f32(Keys.Attention.CLIP_KQV, 0.0 if clip_qkv is None else clip_qkv)
        keys.f32(Keys.Attention.ALIBI_BIAS_MAX, alibi_bias_max)
        return metadata
