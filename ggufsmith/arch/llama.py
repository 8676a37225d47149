"""The llama family: Llama 1-3, Mistral and Mixtral (the same decoder; Mixtral swaps the MLP for
experts). Sources: the HF modeling code for the checkpoint layout, llama.cpp's loader
(src/models/llama.cpp, llama_model_base::load_hparams) for the keys and tensors it reads."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata

log = logging.getLogger(__name__)

ROPE_FREQS = "rope_freqs.weight"
# What llama.cpp's llama runtime uses for yarn whatever the file says (it reads no beta keys for llama).
_LLAMACPP_YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}

_LAYER = "model.layers.{bid}."
_BLOCK = "blk.{bid}."


class Llama(Architecture):
    name = "llama"
    hf_classes = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
    model_types = ("llama", "mistral", "mixtral")
    tokenizer_kind = None  # tokenizer.model (SentencePiece, llama 1-2, mistral) or tokenizer.json (BPE, llama 3)
    tensor_names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
        **{_LAYER + hf: _BLOCK + gguf for hf, gguf in {
            "input_layernorm.weight": "attn_norm.weight",
            "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight",
            "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight",
            "self_attn.q_proj.bias": "attn_q.bias",  # attention_bias=True
            "self_attn.k_proj.bias": "attn_k.bias",
            "self_attn.v_proj.bias": "attn_v.bias",
            "self_attn.o_proj.bias": "attn_output.bias",
            "post_attention_layernorm.weight": "ffn_norm.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight",
            "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight",
            "mlp.gate_proj.bias": "ffn_gate.bias",  # mlp_bias=True
            "mlp.up_proj.bias": "ffn_up.bias",
            "mlp.down_proj.bias": "ffn_down.bias",
            # Mixtral: the router, and w1/w3/w2 (gate/up/down) of each expert, stacked per block.
            "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
            "block_sparse_moe.experts.{xid}.w1.weight": "ffn_gate_exps.weight",
            "block_sparse_moe.experts.{xid}.w3.weight": "ffn_up_exps.weight",
            "block_sparse_moe.experts.{xid}.w2.weight": "ffn_down_exps.weight",
        }.items()},
    }
    # Old checkpoints store the rotary frequencies; they follow from the config.
    ignored_tensors = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
    # The router is tiny and decides which experts run: llama.cpp keeps it F32 whatever the outtype.
    f32_tensors = (r"blk\.\d+\.ffn_gate_inp\.weight",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.n_head = config.get("num_attention_heads")
        self.n_head_kv = config.get("num_key_value_heads", default=self.n_head)
        self.head_dim = config.get("head_dim", default=None) or config.get("hidden_size") // self.n_head
        self.rope = _rope_parameters(config)
        # Tied embeddings: save_pretrained stores no lm_head, so there is no `output` tensor and
        # llama.cpp reads token_embd in its place. An lm_head stored anyway is kept: transformers
        # (5.x) uses it rather than tying when its values differ from the embeddings.

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get("num_hidden_layers"))
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get("max_position_embeddings", default=None))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get("hidden_size"))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get("intermediate_size"))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.n_head_kv)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.get("rope_theta"))
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get("rms_norm_eps"))
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get("num_local_experts", default=None))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get("num_experts_per_tok", default=None) if "num_local_experts" in c else None)
        if "head_dim" in c:
            keys.u32(Keys.Attention.KEY_LENGTH, self.head_dim)
            keys.u32(Keys.Attention.VALUE_LENGTH, self.head_dim)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get("vocab_size"))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)
        self._rope_scaling_keys(keys)
        return metadata

    def _rope_scaling_keys(self, keys: ArchKeys) -> None:
        rope_type = self.rope.get("rope_type", "default")
        if rope_type == "linear":
            keys.string(Keys.Rope.SCALING_TYPE, "linear")
            keys.f32(Keys.Rope.SCALING_FACTOR, _required(self.config, self.rope, "factor"))
        elif rope_type == "yarn":
            factor = _required(self.config, self.rope, "factor")
            keys.string(Keys.Rope.SCALING_TYPE, "yarn")
            keys.f32(Keys.Rope.SCALING_FACTOR, factor)
            keys.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, _required(self.config, self.rope, "original_max_position_embeddings"))
            keys.f32(Keys.Rope.SCALING_YARN_EXT_FACTOR, self.rope.get("extrapolation_factor"))
            attention_factor = self.rope.get("attention_factor", self.rope.get("attn_factor"))
            keys.f32(Keys.Rope.SCALING_YARN_ATTN_FACTOR, attention_factor)
            if attention_factor is not None:
                # llama.cpp's llama reads only rope.scaling.attn_factor and multiplies it by its own
                # default yarn scale 1 + 0.1 ln(factor); transformers uses attention_factor instead.
                keys.f32(Keys.Rope.SCALING_ATTN_FACTOR, attention_factor / _yarn_default_attention(factor))
            keys.f32(Keys.Rope.SCALING_YARN_BETA_FAST, self.rope.get("beta_fast"))
            keys.f32(Keys.Rope.SCALING_YARN_BETA_SLOW, self.rope.get("beta_slow"))
            unsupported = {name: self.rope[name] for name, value in _LLAMACPP_YARN_BETAS.items()
                           if self.rope.get(name) not in (None, value)}
            unsupported.update({name: self.rope[name] for name in ("mscale", "mscale_all_dim") if self.rope.get(name)})
            if unsupported:
                log.warning("%s: llama.cpp's llama ignores yarn %s; its rope will differ from transformers'",
                            self.config.path, unsupported)
        elif rope_type == "llama3":
            pass  # expressed as the rope_freqs tensor, see extra_tensors()
        elif rope_type == "dynamic":
            # NTK scaling that transformers applies only beyond max_position_embeddings; llama.cpp
            # has no equivalent, so the file runs the same only within the trained context.
            log.warning("%s: llama.cpp has no dynamic NTK rope scaling; the model matches transformers "
                        "only up to max_position_embeddings tokens", self.config.path)
        elif rope_type != "default":
            raise ConversionError(
                f"{self.config.path}: rope type {rope_type!r} is not supported for llama "
                "(supported: default, linear, yarn, llama3, dynamic)"
            )

    def extra_tensors(self) -> dict[str, LazyTensor]:
        if self.rope.get("rope_type") != "llama3":
            return {}
        factors = llama3_rope_factors(self.head_dim, **{
            name: _required(self.config, self.rope, name)
            for name in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        })
        return {ROPE_FREQS: LazyTensor.from_array(factors, source=f"{self.config.path}: rope_parameters (llama3)")}

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(("attn_q.weight", "attn_q.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head)
        if name.endswith(("attn_k.weight", "attn_k.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head_kv)
        return tensor


def rotary_halves_to_pairs(tensor: LazyTensor, n_head: int) -> LazyTensor:
    """Reorder the output rows of a q or k projection for GGML's rotary embedding.

    HF rotates row i of each head with row i + head_dim/2 (rotate_half); GGML's normal rope rotates
    rows 2i and 2i+1. So within each head, rows [first half | second half] become interleaved
    (h0, s0, h1, s1, ...). Works for the weight (rows, cols) and the bias (rows,).
    """
    rows = tensor.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"{tensor.source}: {rows} rows do not split into {n_head} heads of even size")
    half = rows // n_head // 2
    rest = tensor.shape[1:]

    def interleave(a: np.ndarray) -> np.ndarray:
        return a.reshape(n_head, 2, half, *rest).swapaxes(1, 2).reshape(rows, *rest)

    return tensor.map(interleave)


def llama3_rope_factors(head_dim: int, rope_theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: int) -> np.ndarray:
    """Llama 3.1's frequency scaling as the per-dimension divisors llama.cpp applies to its rope
    frequencies (rope_freqs.weight): 1 for short wavelengths, `factor` for long ones, and a smooth
    interpolation in between (Meta's reference implementation, `apply_scaling`)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = np.float32(1.0) / np.power(np.float32(rope_theta), exponent)
    wavelen = np.float32(2 * math.pi) / freqs
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    smooth = (np.float32(original_max_position_embeddings) / wavelen - np.float32(low_freq_factor)) / np.float32(
        high_freq_factor - low_freq_factor
    )
    between = np.float32(1.0) / ((np.float32(1.0) - smooth) / np.float32(factor) + smooth)
    divisors = np.where(wavelen < high_freq_wavelen, np.float32(1.0), np.where(wavelen > low_freq_wavelen, np.float32(factor), between))
    return divisors.astype(np.float32)


def _rope_parameters(config: HFConfig) -> dict[str, Any]:
    """rope theta and scaling from either config layout: transformers >= 5 writes one
    `rope_parameters` dict; older configs have `rope_theta` and `rope_scaling` (type or rope_type)."""
    params = dict(config.get("rope_parameters", "rope_scaling", default=None) or {})
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config.get("rope_theta")
    if "original_max_position_embeddings" not in params and "original_max_position_embeddings" in config:
        params["original_max_position_embeddings"] = config.get("original_max_position_embeddings")
    return params


def _required(config: HFConfig, params: dict[str, Any], name: str) -> Any:
    if params.get(name) is None:
        raise ConversionError(f"{config.path}: rope scaling {params.get('rope_type')!r} needs {name!r}, which is not set")
    return params[name]


def _yarn_default_attention(factor: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
