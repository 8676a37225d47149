"""Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5 (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM` and
the language model of the multimodal `Qwen3_5(Moe)ForConditionalGeneration`): hybrids of gated
attention and gated delta-net (linear attention) blocks, by a per-layer pattern (config.json's
layer_types, else one full-attention block every full_attention_interval, llama.cpp's default).

Gated attention: q_proj gives each head's queries followed by a gate of the same width (llama.cpp
reads attn_q as 2 * n_head * head_dim rows, the same interleaving); q and k are normalized per head;
rope turns a quarter of each head (partial_rotary_factor). Qwen3.5's rope is multimodal (mrope);
for text every section has the same position, which llama.cpp reads from rope.dimension_sections.

Gated delta-net (llama.cpp's ssm_* names: n_group key heads, time_step_rank value heads, state_size
their width, which llama.cpp takes to be one for keys and values):
  * Qwen3-Next fuses q, k, v and the output gate z per key head ([q k v z] x n_k_heads, in_proj_qkvz)
    and beta, alpha likewise (in_proj_ba, kept as it is: llama.cpp's graph splits it per key head);
    llama.cpp wants q, k, v of all heads one after the other (attn_qkv, the conv input's order) and
    z apart (attn_gate).
  * Qwen3.5 stores them apart already; when there are more value heads than key heads, llama.cpp's
    qwen35 graph shares key heads by tiling (value head j uses key head j % n_k_heads) where HF
    groups them (j // ratio), so every value-head axis is reordered from grouped to tiled.
  * A_log -> ssm_a = -exp(A_log); the depthwise conv1d (channels, 1, d_conv) loses its middle axis;
    dt_bias is ssm_dt.bias.
RMSNorms compute x * (1 + w) (Gemma's offset, added here), except the delta-net's gated norm, a
plain weight. Multi-token-prediction layers (mtp.*) are left out with a notice, as llama.cpp's
converter does with --no-mtp.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.arch.base import ArchKeys, LanguageModelOf
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import ROUTER, Decoder, attention, embeddings, expert_keys, in_block, mlp, norms, reject_routing
from ggufsmith.arch.gemma import offset_norm
from ggufsmith.arch.hybrid import SSM_CONV_F32, depthwise_conv, negative_exp, only_where, recurrent_layers
from ggufsmith.arch.qwen_moe import EXPERTS_AND_GATED_SHARED, reject_dense_blocks
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor


FULL, LINEAR = "full_attention", "linear_attention"
ATTENTION = "not is_recurrent[bid]"
DELTA_NET = "is_recurrent[bid]"
KEY_DIM = "n_group * d_state"  # key heads x head width
CONV_CHANNELS = f"2 * {KEY_DIM} + d_inner"  # q, k, v: the conv's input

NORMS = norms(input_layernorm="attn_norm", post_attention_layernorm="post_attention_norm")
GATED_ATTENTION = only_where({
    **attention(biases="none", qk_norm=True),
    "self_attn.q_proj.weight": T("attn_q.weight", "2 * n_head * head_dim", "n_embd"),  # + the gate
}, ATTENTION)
DELTA_NET_STATE = only_where({  # what Qwen3-Next and Qwen3.5 share
    "linear_attn.conv1d.weight": T("ssm_conv1d.weight", CONV_CHANNELS, "d_conv"),
    "linear_attn.dt_bias": T("ssm_dt.bias", "dt_rank"),
    "linear_attn.A_log": T("ssm_a", "dt_rank"),
    "linear_attn.norm.weight": T("ssm_norm.weight", "d_state"),
    "linear_attn.out_proj.weight": T("ssm_out.weight", "n_embd", "d_inner"),
}, DELTA_NET)
QKV = T("attn_qkv.weight", CONV_CHANNELS, "n_embd", when=DELTA_NET)
GATE = T("attn_gate.weight", "d_inner", "n_embd", when=DELTA_NET)
# Qwen3.5's multimodal checkpoints: the vision tower is llama.cpp's mmproj file.
MULTIMODAL_QWEN35 = LanguageModelOf(prefixes={"model.language_model.": "model."},
                                    skipped={"model.visual.": "the vision tower"})


def moe_keys(keys: ArchKeys, c: HFConfig) -> None:
    """The routed experts' count and width, and the shared expert's width."""
    expert_keys(keys, c)
    keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
    keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, c.get_int("shared_expert_intermediate_size", min=1))


class _GatedDeltaNetHybrid(Decoder):
    """What Qwen3-Next and Qwen3.5 share: the layer pattern, the delta-net's keys and layouts."""

    f32_tensors = ROUTER + (r"blk\.\d+\.ffn_gate_inp_shexp\.weight",) + SSM_CONV_F32
    mtp_prefixes = ("mtp.", "model.mtp.")
    dim_names = ("is_recurrent",)
    # Whether llama.cpp's graph shares key heads among value heads by tiling (qwen35: value head j
    # uses key head j % n_k) rather than by HF's grouping (qwen3next: j // (n_v / n_k)).
    tiles_value_heads = False

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.n_layer = c.get_int("num_hidden_layers", min=1)
        self.interval = c.get_int("full_attention_interval", default=4, min=1)
        self.pattern_given = "layer_types" in c  # else llama.cpp derives the same pattern from the interval
        self.recurrent = recurrent_layers(c, self.n_layer, default=[
            LINEAR if (i + 1) % self.interval else FULL for i in range(self.n_layer)])
        self.n_k = c.get_int("linear_num_key_heads", min=1)
        self.n_v = c.get_int("linear_num_value_heads", min=1)
        self.k_dim = c.get_int("linear_key_head_dim", min=1)
        self.v_dim = c.get_int("linear_value_head_dim", min=1)
        reject(c, self.k_dim != self.v_dim, "linear_key_head_dim differs from linear_value_head_dim "
               "(llama.cpp's state_size is both)")
        reject(c, self.n_v % self.n_k != 0, "linear_num_value_heads is not a multiple of linear_num_key_heads")
        reject(c, c.get_bool("attention_bias", default=False), "attention_bias is set")

    def dims(self) -> dict:
        return {"is_recurrent": self.recurrent}

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.SSM.CONV_KERNEL, c.get_int("linear_conv_kernel_dim", min=1))
        keys.u32(Keys.SSM.STATE_SIZE, self.k_dim)
        keys.u32(Keys.SSM.GROUP_COUNT, self.n_k)
        keys.u32(Keys.SSM.TIME_STEP_RANK, self.n_v)
        keys.u32(Keys.SSM.INNER_SIZE, self.v_dim * self.n_v)
        if self.pattern_given:
            keys.array(Keys.Attention.RECURRENT_LAYERS, self.recurrent, GGUFValueType.BOOL)
        keys.u32(Keys.LLM.FULL_ATTENTION_INTERVAL, self.interval)
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.head_dim * self.rope.partial_rotary_factor()))

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith("norm.weight") and not name.endswith(".ssm_norm.weight"):
            return offset_norm(tensor)
        if name.endswith(".ssm_a"):
            tensor = negative_exp(tensor)
        elif name.endswith(".ssm_conv1d.weight"):
            tensor = depthwise_conv(tensor)
        if self.tiles_value_heads and self.n_v != self.n_k:
            return self.value_heads_tiled(name, tensor)
        return tensor

    def value_heads_tiled(self, name: str, tensor: LazyTensor) -> LazyTensor:
        """The value-head axis of a delta-net tensor (rows, or out_proj's columns) from grouped by key
        head to tiled; q and k rows (the first 2 * key_dim of attn_qkv and the conv) stay."""
        parts = name.split(".")  # blk.{bid}.<tensor>[.weight|.bias]
        head = parts[2] if parts[0] == "blk" else None
        width = {"attn_qkv": self.v_dim, "attn_gate": self.v_dim, "ssm_conv1d": self.v_dim, "ssm_out": self.v_dim,
                 "ssm_beta": 1, "ssm_alpha": 1, "ssm_a": 1, "ssm_dt": 1}.get(head)
        if width is None:
            return tensor
        skip = 2 * self.n_k * self.k_dim if head in ("attn_qkv", "ssm_conv1d") else 0
        axis = 1 if head == "ssm_out" else 0
        ratio = self.n_v // self.n_k

        def tile(a: np.ndarray) -> np.ndarray:
            a = np.moveaxis(a, axis, 0)
            v = a[skip:].reshape(self.n_k, ratio, width, *a.shape[1:]).swapaxes(0, 1).reshape(a[skip:].shape)
            return np.ascontiguousarray(np.moveaxis(np.concatenate([a[:skip], v]), 0, axis))

        return tensor.map(tile)


class Qwen3Next(_GatedDeltaNetHybrid):
    name = "qwen3next"
    hf_classes = ("Qwen3NextForCausalLM",)
    model_types = ("qwen3_next",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **NORMS, **GATED_ATTENTION, **DELTA_NET_STATE, **EXPERTS_AND_GATED_SHARED,
            "linear_attn.in_proj_qkvz.weight": Split(QKV, GATE),
            "linear_attn.in_proj_ba.weight": T("ssm_ba.weight", "2 * dt_rank", "n_embd", when=DELTA_NET),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject_routing(c, normalizes_top_k=True, arch=self.name)
        reject_dense_blocks(c)

    def family_keys(self, keys: ArchKeys) -> None:
        moe_keys(keys, self.config)
        super().family_keys(keys)

    def split_tensor(self, entry: Split, tensor: LazyTensor) -> list[LazyTensor]:
        """in_proj_qkvz, per key head [q k v z], into attn_qkv (all q, all k, all v) and attn_gate (all z)."""
        widths = [self.k_dim, self.k_dim, self.n_v // self.n_k * self.v_dim, self.n_v // self.n_k * self.v_dim]
        d_in = tensor.shape[-1]

        def parts(a: np.ndarray) -> list[np.ndarray]:
            per_head = np.split(a.reshape(self.n_k, sum(widths), d_in), np.cumsum(widths)[:-1], axis=1)
            return [p.reshape(-1, d_in) for p in per_head]

        qkv_rows = 2 * self.n_k * self.k_dim + self.n_v * self.v_dim
        qkv = tensor.map(lambda a: np.concatenate(parts(a)[:3]), shape=(qkv_rows, d_in))
        gate = tensor.map(lambda a: np.ascontiguousarray(parts(a)[3]), shape=(self.n_v * self.v_dim, d_in))
        return [qkv, gate]


QWEN35_DELTA_NET = {
    **DELTA_NET_STATE,
    "linear_attn.in_proj_qkv.weight": QKV,
    "linear_attn.in_proj_z.weight": GATE,
    **only_where({"linear_attn.in_proj_b.weight": T("ssm_beta.weight", "dt_rank", "n_embd"),
                  "linear_attn.in_proj_a.weight": T("ssm_alpha.weight", "dt_rank", "n_embd")}, DELTA_NET),
}


class Qwen35(_GatedDeltaNetHybrid):
    name = "qwen35"
    hf_classes = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
    model_types = ("qwen3_5_text", "qwen3_5")
    language_model = MULTIMODAL_QWEN35
    tiles_value_heads = True
    tensor_names = {**embeddings(), **in_block({**NORMS, **GATED_ATTENTION, **QWEN35_DELTA_NET, **mlp(biases="none", when=None)})}
    # transformers' (and llama.cpp's converter's) mrope sections when rope_parameters gives none
    default_mrope_section = (11, 11, 10)

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        sections = self.rope.params.get_list("mrope_section", default=list(self.default_mrope_section))
        if len(sections) > 4 or not all(isinstance(s, int) and s >= 0 for s in sections):
            raise self.config.error("rope_parameters.mrope_section", sections, "up to 4 non-negative integers")
        rotary_pairs = int(self.head_dim * self.rope.partial_rotary_factor()) // 2
        reject(self.config, sum(sections) > rotary_pairs, f"rope_parameters.mrope_section {sections} spans more "
               f"than the {rotary_pairs} rotary pairs of a head")
        keys.array(Keys.Rope.DIMENSION_SECTIONS, [*sections, 0, 0, 0][:4], GGUFValueType.INT32)


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    hf_classes = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
    model_types = ("qwen3_5_moe_text", "qwen3_5_moe")
    tensor_names = {**embeddings(), **in_block({**NORMS, **GATED_ATTENTION, **QWEN35_DELTA_NET, **EXPERTS_AND_GATED_SHARED})}

    def family_keys(self, keys: ArchKeys) -> None:
        moe_keys(keys, self.config)
        super().family_keys(keys)
