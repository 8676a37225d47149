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
from ggufsmith.arch.common import reject, weights_and_biases
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata


class MPT(Architecture):
    name = "mpt"
    hf_classes = ("MptForCausalLM", "MPTForCausalLM")
    model_types = ("mpt",)
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    tensor_names = {
        "transformer.wte.weight": "token_embd.weight",
        "transformer.wpe.weight": "position_embd.weight",  # MosaicML's learned_pos_emb without alibi
        "lm_head.weight": "output.weight",
        **weights_and_biases({"transformer.norm_f": "output_norm"}),
        **weights_and_biases(
            {
                "norm_1": "attn_norm",
                "attn.Wqkv": "attn_qkv",
                "attn.q_ln": "attn_q_norm",  # MosaicML's qk_ln
                "attn.k_ln": "attn_k_norm",
                "attn.out_proj": "attn_output",
                "norm_2": "ffn_norm",
                "ffn.up_proj": "ffn_up",
                "ffn.down_proj": "ffn_down",
            },
            hf_prefix="transformer.blocks.{bid}.",
            gguf_prefix="blk.{bid}.",
        ),
    }

    # Position embeddings stay F32 whatever the outtype, as llama.cpp's converter and quantizer keep them.
    f32_tensors = (r"position_embd\.weight",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.attn_config = dict(config.get("attn_config", default={}))
        self.d_model = config.get("d_model", "hidden_size")
        self.n_heads = config.get("n_heads", "num_attention_heads")
        scale = self.attn_config.get("softmax_scale")
        reject(
            config,
            scale is not None and not math.isclose(scale, 1 / math.sqrt(self.d_model // self.n_heads)),
            f"attn_config.softmax_scale is {scale}, not 1/sqrt(head size)",
        )
        reject(config, config.get("logit_scale", default=None) is not None, "logit_scale is set")
        reject(config, self.attn_config.get("prefix_lm", False), "attn_config.prefix_lm is set")

    def metadata(self) -> Metadata:
        c = self.config
        alibi_bias_max = float(self.attn_config.get("alibi_bias_max", 8)) if self.attn_config.get("alibi", True) else 0.0
        clip_qkv = self.attn_config.get("clip_qkv")
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get("max_seq_len", "max_position_embeddings"))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.d_model)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get("n_layers", "num_hidden_layers"))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, int(c.get("expansion_ratio", default=4) * self.d_model))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_heads)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.attn_config.get("kv_n_heads"))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get("layer_norm_epsilon", default=1e-5))
        keys.f32(Keys.Attention.CLAMP_KQV, clip_qkv)
        keys.f32(Keys.Attention.MAX_ALIBI_BIAS, alibi_bias_max)
        keys.f32(Keys.Attention.CLIP_KQV, 0.0 if clip_qkv is None else clip_qkv)
        keys.f32(Keys.Attention.ALIBI_BIAS_MAX, alibi_bias_max)
        return metadata
