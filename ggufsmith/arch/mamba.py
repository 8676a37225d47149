"""Mamba (MambaForCausalLM) and Mamba-2 (Mamba2ForCausalLM): stacks of selective state-space blocks,
no attention.

Layout changes, all dictated by llama.cpp's mamba and mamba2 graphs:
  * A is stored as A_log in HF; llama.cpp's ssm_scan takes A itself, so ssm_a = -exp(A_log).
  * the depthwise conv1d weight is (d_inner, 1, d_conv) in torch; ggml wants {d_conv, d_inner},
    i.e. numpy (d_inner, d_conv): the singleton channel axis is dropped.
ssm_conv and ssm_scan read their inputs as plain float arrays, so the conv weight, A and D stay F32
whatever the output type.
Mamba-2's mixer is shared with the hybrids: see arch/hybrid.py.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.hybrid import (MAMBA1_F32, NO_ROPE_CONTEXT, SSM_CONV_F32, backbone, mamba1_keys, mamba1_mixer,
                                   mamba1_transform, mamba2_keys, mamba2_mixer, mamba2_size,
                                   mamba2_transform)
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata


class Mamba(Architecture):
    name = "mamba"
    hf_classes = ("MambaForCausalLM",)
    model_types = ("mamba",)
    tokenizer_kind = None  # GPT-NeoX BPE (tokenizer.json) in practice; detected from the files
    tied_output_head = r"lm_head\.weight"
    tensor_names = backbone(mamba1_mixer("mixer."))
    f32_tensors = MAMBA1_F32

    def metadata(self) -> Metadata:
        c = self.config
        d_model = c.get_int("hidden_size", "d_model", min=1)
        d_inner = c.get_int("intermediate_size", "d_inner", default=None, min=1)
        if d_inner is None:
            d_inner = c.get_int("expand", default=2, min=1) * d_model
        if d_inner != 2 * d_model:
            raise ConversionError(
                f"{c.path}: intermediate_size {d_inner} is not 2 x hidden_size {d_model}; "
                "llama.cpp's mamba supports only an expansion factor of 2"
            )
        if c.get_bool("use_bias", default=False):
            raise ConversionError(f"{c.path}: use_bias is true; llama.cpp's mamba has no in/out projection biases")
        if not c.get_bool("use_conv_bias", default=True):
            raise ConversionError(f"{c.path}: use_conv_bias is false; llama.cpp's mamba requires the conv1d bias")

        m = Metadata()
        keys = ArchKeys(m, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, NO_ROPE_CONTEXT)
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, d_model)
        # No feed-forward and no attention; llama.cpp's converter writes zeros and so do we.
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, 0)
        keys.u32(Keys.Attention.HEAD_COUNT, 0)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", "n_layer", min=1))
        mamba1_keys(keys, c, d_model, d_inner)
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("layer_norm_epsilon", "rms_norm_eps", default=1e-5, min=0))
        # Plain Mamba normalizes neither dt nor B, C (falcon-mamba does; not claimed here).
        keys.bool(Keys.SSM.DT_B_C_RMS, False)
        return m

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return mamba1_transform(name, tensor)


class Mamba2(Architecture):
    """Mamba-2: the mixer of arch/hybrid.py in every block."""

    name = "mamba2"
    hf_classes = ("Mamba2ForCausalLM",)
    model_types = ("mamba2",)
    tokenizer_kind = None  # SentencePiece (Codestral) or BPE; detected from the files
    tied_output_head = r"lm_head\.weight"
    tensor_names = backbone(mamba2_mixer("mixer."))
    f32_tensors = SSM_CONV_F32

    def metadata(self) -> Metadata:
        c = self.config
        if not c.get_bool("use_conv_bias", default=True):
            raise ConversionError(f"{c.path}: use_conv_bias is false; llama.cpp's mamba2 requires the conv1d bias")
        m = Metadata()
        keys = ArchKeys(m, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, NO_ROPE_CONTEXT)
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, 0)
        keys.u32(Keys.Attention.HEAD_COUNT, 0)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", "n_layer", min=1))
        mamba2_keys(keys, c)
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("layer_norm_epsilon", "rms_norm_eps", default=1e-5, min=0))
        return m

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return mamba2_transform(name, tensor, mamba2_size(self.config, "n_groups"))
