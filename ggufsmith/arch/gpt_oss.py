"""gpt-oss (`GptOssForCausalLM`): llama.cpp's `gpt-oss` (LLM_ARCH_OPENAI_MOE).

A decoder with q/k/v/o biases, a learned attention sink per head (a logit the softmax of each head
also normalizes over, then drops: attn_sinks), sliding-window attention on every other layer (the
even ones, llama.cpp's default pattern for the architecture), and in every block a routed mixture
of experts: a router with a bias, top-k softmax over the chosen experts' logits, and experts with
biases whose activation is the clamped SwiGLU (gate clamped above at swiglu_limit, up clamped to
±swiglu_limit, (up + 1) * gate * sigmoid(swiglu_alpha * gate)). llama.cpp's graph fixes alpha and
limit at gpt-oss' 1.702 and 7.0, so a config with others is refused.

Experts come fused over all experts with gate and up interleaved (gate rows 0, 2, 4, ..., up rows
1, 3, 5, ...), in one of two layouts:
- the released checkpoints' MXFP4 (`gate_up_proj_blocks` / `_scales`, `down_proj_blocks` / `_scales`,
  stored (experts, out, in)), read as MXFP4 tensors (readers/quantized.py) whose bytes go into the
  file unchanged whatever the output type, as llama.cpp's converter does;
- the dequantized parameters transformers saves (`gate_up_proj` (experts, in, 2 x out), `down_proj`
  (experts, in, out)), transposed to ggml's (out, in) rows here.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import periodic_layer_types, reject, sliding_flags
from ggufsmith.arch.decoder import ROUTER, Decoder, attention, embeddings, expert_keys, in_block, norms
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import EncodedTensor, LazyTensor

# The clamped SwiGLU constants llama.cpp's graph uses (LLM_FFN_SWIGLU_OAI_MOE).
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0

_GATE = T("ffn_gate_exps.weight", "n_expert", "n_ff_exp", "n_embd")
_UP = T("ffn_up_exps.weight", "n_expert", "n_ff_exp", "n_embd")
_DOWN = T("ffn_down_exps.weight", "n_expert", "n_embd", "n_ff_exp")
_GATE_UP = Split(_GATE, _UP)


class GptOss(Decoder):
    name = "gpt-oss"
    hf_classes = ("GptOssForCausalLM",)
    model_types = ("gpt_oss",)
    tokenizer_kind = "gpt2"
    tensor_names = {
        **embeddings(),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's gpt-oss requires it
        **in_block({
            **norms(input_layernorm="attn_norm", post_attention_layernorm="post_attention_norm"),
            **attention(biases="optional", o_bias="required"),
            "self_attn.sinks": T("attn_sinks.weight", "n_head"),
            "mlp.router.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd"),
            "mlp.router.bias": T("ffn_gate_inp.bias", "n_expert"),
            "mlp.experts.gate_up_proj": _GATE_UP,  # (E, in, 2 x out): transposed in split_tensor
            "mlp.experts.gate_up_proj_blocks": _GATE_UP,  # MXFP4, (E, 2 x out, in)
            "mlp.experts.gate_up_proj_bias": Split(T("ffn_gate_exps.bias", "n_expert", "n_ff_exp"),
                                                   T("ffn_up_exps.bias", "n_expert", "n_ff_exp"), axis=-1),
            "mlp.experts.down_proj": _DOWN,  # (E, in, out): transposed in transform
            "mlp.experts.down_proj_blocks": _DOWN,  # MXFP4, (E, out, in)
            "mlp.experts.down_proj_bias": T("ffn_down_exps.bias", "n_expert", "n_embd"),
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        for name, fixed in (("swiglu_limit", SWIGLU_LIMIT), ("swiglu_alpha", SWIGLU_ALPHA)):
            value = c.get_float(name, default=fixed)
            reject(c, abs(value - fixed) > 1e-6, f"{name} is {value} (llama.cpp's gpt-oss computes with {fixed})")
        self.sliding = sliding_flags(self.layer_types(self.default_layer_types()))

    def default_layer_types(self) -> list[str]:
        """transformers' and llama.cpp's default: sliding window on the even layers."""
        return periodic_layer_types(self.config.get_int("num_hidden_layers", min=1), 2)

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        expert_keys(keys, c)
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        # llama.cpp alternates by itself (period 2, sliding first); the pattern is written only for
        # another one, which it then reads instead
        default = self.sliding == sliding_flags(self.default_layer_types())
        self.sliding_window_keys(keys, None if default else self.sliding)

    def split_tensor(self, entry: Split, tensor: LazyTensor) -> list[LazyTensor]:
        # gate and up alternate along the outputs: the stacked weights' rows, the biases' last axis
        return _out_in(tensor).split(2, entry.axis, interleaved=True)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        return _out_in(tensor) if name.endswith("ffn_down_exps.weight") else tensor


def _out_in(tensor: LazyTensor) -> LazyTensor:
    """A dequantized expert stack (E, in, out) as ggml's rows (E, out, in); MXFP4 stacks and biases
    are already so."""
    if len(tensor.shape) == 3 and not isinstance(tensor, EncodedTensor):
        return tensor.swap_last_axes()
    return tensor
