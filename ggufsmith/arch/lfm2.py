"""LFM2 (`Lfm2ForCausalLM`, Liquid AI): a decoder whose layers are either attention (q/k norms,
NeoX-style rope: no permutation) or a gated short convolution (layer_types "conv": in_proj gives
B, C and x; y = C * conv(B * x); out_proj), every layer with a SwiGLU MLP. llama.cpp tells the conv
layers by a head_count_kv of 0, reads the conv kernel as {L, hidden} (numpy (hidden, L): the
depthwise conv's channel axis dropped) and kept F32, and names the final norm token_embd_norm."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import DENSE, ROUTER, SPARSE, Decoder, attention, expert_keys, experts, in_block, mlp
from ggufsmith.arch.hybrid import ATTENTION_LAYER, RECURRENT_LAYER, depthwise_conv, only_where, recurrent_layers
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import ExpertGatingFunc, Keys
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor


def _renamed(table: dict[str, T], names: dict[str, str]) -> dict[str, T]:
    """The same specs under the family's own HF names (w1 for gate_proj, ...)."""
    return {names.get(hf, hf): spec for hf, spec in table.items()}


def _swiglu(when: str | None) -> dict[str, T]:
    return _renamed(mlp(biases="none", when=when), {"mlp.gate_proj.weight": "feed_forward.w1.weight",
                                                    "mlp.up_proj.weight": "feed_forward.w3.weight",
                                                    "mlp.down_proj.weight": "feed_forward.w2.weight"})


def _lfm2_table(feed_forward: dict[str, T | Split]) -> dict[str, T | Split]:
    return {
        "model.embed_tokens.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        "model.embedding_norm.weight": T("token_embd_norm.weight", "n_embd"),  # the final norm
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd", optional=True),
        **in_block({
            "operator_norm.weight": T("attn_norm.weight", "n_embd"),
            "ffn_norm.weight": T("ffn_norm.weight", "n_embd"),
            **feed_forward,
            **only_where(_renamed(attention(biases="none", qk_norm=True), {
                "self_attn.o_proj.weight": "self_attn.out_proj.weight",
                "self_attn.q_norm.weight": "self_attn.q_layernorm.weight",
                "self_attn.k_norm.weight": "self_attn.k_layernorm.weight"}), ATTENTION_LAYER),
            **only_where({
                "conv.conv.weight": T("shortconv.conv.weight", "n_embd", "l_cache"),
                "conv.in_proj.weight": T("shortconv.in_proj.weight", "3 * n_embd", "n_embd"),
                "conv.out_proj.weight": T("shortconv.out_proj.weight", "n_embd", "n_embd"),
            }, RECURRENT_LAYER),
        }),
    }


class Lfm2(Decoder):
    name = "lfm2"
    hf_classes = ("Lfm2ForCausalLM",)
    model_types = ("lfm2",)
    tied_output_head = r"lm_head\.weight"
    tensor_names = _lfm2_table(_swiglu(when=None))
    f32_tensors = (r"blk\.\d+\.shortconv\.conv\.weight",)
    dim_names = ("l_cache",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        conv_layers = recurrent_layers(c, c.get_int("num_hidden_layers", min=1), recurrent=("conv",))
        self.attention_layers = [not conv for conv in conv_layers]
        if c.get_bool("conv_bias", default=False):
            raise ConversionError(f"{c.label}: conv_bias is true; llama.cpp's lfm2 has no short-convolution biases")

    def dims(self) -> dict[str, int]:
        return {"l_cache": self.config.get_int("conv_L_cache", min=1)}

    def feed_forward_length(self) -> int:
        """What transformers' Lfm2MLP makes of intermediate_size (block_auto_adjust_ff_dim)."""
        c = self.config
        size = c.get_int("intermediate_size", "block_ff_dim", min=1)
        if c.get_bool("block_auto_adjust_ff_dim", default=True):
            size = int(2 * size / 3)
            multiplier = c.get_float("block_ffn_dim_multiplier", default=1.0)
            if multiplier is not None:
                multiple_of = c.get_int("block_multiple_of", default=256, min=1)
                size = multiple_of * ((int(multiplier * size) + multiple_of - 1) // multiple_of)
        return size

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.LLM.SHORTCONV_L_CACHE, c.get_int("conv_L_cache", min=1))

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith("shortconv.conv.weight"):
            return depthwise_conv(tensor)
        return tensor


class Lfm2Moe(Lfm2):
    """LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2 with routed experts after `num_dense_layers` dense
    blocks, chosen by sigmoid scores plus a selection bias (expert_bias -> exp_probs_b) and
    weighted by their renormalized sigmoid scores, which is all llama.cpp's lfm2moe computes."""

    name = "lfm2moe"
    hf_classes = ("Lfm2MoeForCausalLM",)
    model_types = ("lfm2_moe",)
    tensor_names = _lfm2_table({
        **_swiglu(when=DENSE),
        **experts(prefix="feed_forward.", per_expert=("w1", "w3", "w2"), when=SPARSE),
        "feed_forward.expert_bias": T("exp_probs_b.bias", "n_expert", when=SPARSE),
    })
    f32_tensors = Lfm2.f32_tensors + ROUTER
    dim_names = ("l_cache", "n_layer_dense_lead")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        if not c.get_bool("use_expert_bias", default=True) or not c.get_bool("norm_topk_prob", default=True) \
                or c.get_float("routed_scaling_factor", default=1.0) != 1.0:
            raise ConversionError(f"{c.label}: llama.cpp's lfm2moe always uses the expert bias and renormalizes the "
                                  "chosen experts' weights, unscaled: use_expert_bias and norm_topk_prob must be true "
                                  "and routed_scaling_factor 1")

    def dims(self) -> dict[str, int]:
        return {**super().dims(), "n_layer_dense_lead": self.config.get_int("num_dense_layers", default=2, min=0)}

    def feed_forward_length(self) -> int:
        return self.config.get_int("intermediate_size", min=1)  # the dense blocks' MLP, not adjusted

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        c = self.config
        expert_keys(keys, c)
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        keys.u32(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, c.get_int("num_dense_layers", default=2, min=0))
        keys.u32(Keys.LLM.EXPERT_GATING_FUNC, int(ExpertGatingFunc.SIGMOID))
