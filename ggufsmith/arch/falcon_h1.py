"""Falcon-H1 (`FalconH1ForCausalLM`, llama.cpp's `falcon-h1`): every block runs attention (NeoX
rope) and a Mamba-2 mixer side by side on the same normed input, adds both to the residual, then a
SwiGLU MLP. The recurrent state is in every layer (llama.cpp marks all layers recurrent).

Its µP multipliers, all applied by transformers to linear maps, are folded into the weights, as
llama.cpp's converter does (llama.cpp reads none of them):
  embeddings x embedding_multiplier; logits x lm_head_multiplier (the output head);
  attention input x attention_in_multiplier (q, k, v) and keys x key_multiplier (k);
  attention output x attention_out_multiplier (o); Mamba input x ssm_in_multiplier and the in_proj's
  five row blocks z, x, B, C, dt x ssm_multipliers (transformers' mup_vector); Mamba output x
  ssm_out_multiplier; the MLP's gate input x mlp_multipliers[0] and its output x mlp_multipliers[1].
Each product is rounded in float32 in llama.cpp's converter's order, so the files are byte-identical.

The gated norm is optional (mamba_rms_norm); llama.cpp gates before normalizing, so
mamba_norm_before_gate with the norm is refused. Also refused: attention biases (llama.cpp's graph
drops the output projection's), a tied output head whose multiplier is not the embeddings'.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import attention, embeddings, in_block, mlp
from ggufsmith.arch.hybrid import SSM_CONV_F32, mamba2_keys, mamba2_mixer, mamba2_size, mamba2_transform
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

MAMBA_NAMES = {"n_heads": ("mamba_n_heads",), "n_groups": ("mamba_n_groups",), "d_conv": ("mamba_d_conv",),
               "d_state": ("mamba_d_state",), "head_dim": ("mamba_d_head",), "proj_bias": ("mamba_proj_bias",),
               "expand": ("mamba_expand",), "inner": ("mamba_d_ssm",)}
MAMBA_DEFAULTS = {"n_groups": 1, "d_state": 256, "d_conv": 4, "expand": 2}
MAMBA2 = {"defaults": MAMBA_DEFAULTS, "names": MAMBA_NAMES}


class FalconH1(Architecture):
    name = "falcon-h1"
    hf_classes = ("FalconH1ForCausalLM",)
    model_types = ("falcon_h1",)
    tokenizer_kind = "gpt2"
    tied_output_head = r"lm_head\.weight"
    config_defaults = {"tie_word_embeddings": False}  # FalconH1Config's default
    tensor_names = {
        **embeddings(),
        "model.final_layernorm.weight": T("output_norm.weight", "n_embd"),
        **in_block({
            "input_layernorm.weight": T("attn_norm.weight", "n_embd"),
            "pre_ff_layernorm.weight": T("ffn_norm", "n_embd"),  # llama.cpp names it without ".weight"
            **attention(biases="none"),
            **mamba2_mixer("mamba.", conv_bias="optional", norm="optional"),
            **mlp(when=None, prefix="feed_forward."),
        }),
    }
    f32_tensors = SSM_CONV_F32

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, c.get_bool("attention_bias", default=False), "attention_bias is true (llama.cpp's falcon-h1 "
               "drops the attention output bias)")
        reject(c, c.get_bool("projectors_bias", default=False), "projectors_bias is true (the Mamba out_proj bias)")
        reject(c, c.get_str("hidden_act", default="silu") != "silu", "hidden_act is not silu")
        reject(c, c.get_bool("mamba_rms_norm", default=False) and c.get_bool("mamba_norm_before_gate", default=True),
               "mamba_norm_before_gate is true (llama.cpp gates the scan output before the grouped norm)")
        self.embedding_multiplier = c.get_float("embedding_multiplier", default=1.0)
        self.lm_head_multiplier = c.get_float("lm_head_multiplier", default=1.0)
        reject(c, c.get_bool("tie_word_embeddings") and self.embedding_multiplier != self.lm_head_multiplier,
               "the output head is tied to the embeddings but lm_head_multiplier is not embedding_multiplier "
               "(one tensor cannot carry both)")
        self.rope = Rope(c)
        self.n_group = mamba2_size(c, "n_groups", **MAMBA2)

    def metadata(self) -> Metadata:
        c = self.config
        m = Metadata()
        keys = ArchKeys(m, self.name)
        n_head = c.get_int("num_attention_heads", min=1)
        head_dim = c.get_int("head_dim", default=None, min=1) or c.get_int("hidden_size", min=1) // n_head
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        keys.u32(Keys.Attention.HEAD_COUNT, n_head)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", min=1))
        mamba2_keys(keys, c, **MAMBA2)
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("rms_norm_eps", default=1e-5, min=0))
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Attention.HEAD_COUNT_KV, c.get_int("num_key_value_heads", default=n_head, min=1))
        keys.u32(Keys.Attention.KEY_LENGTH, head_dim)
        keys.u32(Keys.Attention.VALUE_LENGTH, head_dim)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        self.rope.write_scaling_keys(keys, ())
        return m

    def _factors(self, name: str) -> tuple[float, ...]:
        """The multipliers folded into one GGUF tensor, in the order llama.cpp's converter applies them."""
        c = self.config

        def f(key: str) -> float:
            return c.get_float(key, default=1.0)

        gate, down = c.get_list("mlp_multipliers", default=None) or [1.0, 1.0]
        suffix = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else name.split(".")[0]
        return {
            "token_embd": (self.embedding_multiplier,), "output": (self.lm_head_multiplier,),
            "attn_q": (f("attention_in_multiplier"),), "attn_v": (f("attention_in_multiplier"),),
            "attn_k": (f("key_multiplier"), f("attention_in_multiplier")),
            "attn_output": (f("attention_out_multiplier"),), "ssm_out": (f("ssm_out_multiplier"),),
            "ssm_in": (f("ssm_in_multiplier"),), "ffn_gate": (float(gate),), "ffn_down": (float(down),),
        }.get(suffix, ())

    def _ssm_rows(self, rows: int) -> np.ndarray | None:
        """transformers' mup_vector: one factor per in_proj row, by block (z, x, B, C, dt)."""
        factors = self.config.get_list("ssm_multipliers", default=None)
        if factors is None:
            return None
        d_inner = mamba2_size(self.config, "inner", **MAMBA2)
        bc = self.n_group * mamba2_size(self.config, "d_state", **MAMBA2)
        sizes = [d_inner, d_inner, bc, bc, rows - 2 * d_inner - 2 * bc]
        return np.repeat(np.array([float(v) for v in factors], dtype=np.float32), sizes)[:, None]

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        factors = self._factors(name)
        rows = self._ssm_rows(tensor.shape[0]) if name.endswith("ssm_in.weight") else None
        if any(x != 1.0 for x in factors) or rows is not None:
            def fold(a: np.ndarray) -> np.ndarray:
                a = a.astype(np.float32)
                for factor in factors:
                    a = a * np.float32(factor)
                return a * rows if rows is not None else a

            tensor = tensor.map(fold, dtype="F32")
        return mamba2_transform(name, tensor, self.n_group)
