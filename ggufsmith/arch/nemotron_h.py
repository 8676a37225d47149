"""Nemotron-H (`NemotronHForCausalLM`): a stack of one-mixer blocks, each a pre-RMSNorm and one of
three kinds, by the per-layer pattern (transformers 5's `layers_block_type`, or the published
configs' `hybrid_override_pattern`, one letter a layer): a Mamba-2 mixer ("M", "mamba" /
"linear_attention"), attention without rope ("*", "attention" / "full_attention"), or a
feed-forward with squared ReLU and no gate: a plain MLP ("-", "mlp"; llama.cpp's `nemotron_h`) or
a mixture of experts ("E", "moe"; `nemotron_h_moe`: sigmoid routing with a selection bias,
optional latent projections around the experts, and a shared expert).

llama.cpp knows a block's kind from two per-layer arrays: attention.head_count_kv (0 but for
attention) and feed_forward_length (0 but for the feed-forward blocks); a block with both 0 is
recurrent. With experts, every feed-forward block is a MoE, so a pattern mixing "-" and "E" is
refused. The Mamba-2 inner size is mamba_num_heads x mamba_head_dim (transformers ignores `expand`).

Not reproduced: transformers clamps each Mamba step dt below at time_step_min (default 1e-3),
which llama.cpp (and its converter) do not; it only changes steps where softplus(dt) < 1e-3.
Multi-token-prediction layers (`mtp.*`) are left out with a notice (their export is a later feature).
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import ROUTER, attention
from ggufsmith.arch.hybrid import (ATTENTION_LAYER, NO_ROPE_CONTEXT, SSM_CONV_F32, backbone, mamba2_keys, mamba2_mixer,
                                   mamba2_size, mamba2_transform, only_where)
from ggufsmith.arch.rope import rotary_halves_to_pairs
from ggufsmith.arch.tensors import T
from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor


# One letter per layer kind, as hybrid_override_pattern writes them; the names of layers_block_type.
KIND_OF_NAME = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
RECURRENT = "n_head_kv == 0 and n_ff == 0"
FEED_FORWARD = "n_ff > 0"
MAMBA_NAMES = {"n_heads": ("mamba_num_heads",), "head_dim": ("mamba_head_dim",),
               "n_groups": ("n_groups", "mamba_n_groups"), "d_state": ("ssm_state_size",),
               "d_conv": ("conv_kernel", "mamba_d_conv"), "proj_bias": ("mamba_proj_bias", "use_bias")}
# transformers 5 loads the published "backbone." checkpoints as "model." (and may save them so)
PREFIXES = ("backbone.", "model.")


def layer_kinds(c: HFConfig) -> str:
    """The pattern, one letter (M * - E) per layer, from whichever of the two namings config.json uses."""
    if "layers_block_type" in c or "layer_types" in c:
        names = c.get_list("layers_block_type", "layer_types")
        if not names or not all(name in KIND_OF_NAME for name in names):
            raise c.error("layers_block_type", names, f"a list of {', '.join(map(repr, KIND_OF_NAME))}")
        return "".join(KIND_OF_NAME[name] for name in names)
    pattern = c.get_str("hybrid_override_pattern")
    if not pattern or set(pattern) - set("M*-E"):
        raise c.error("hybrid_override_pattern", pattern, "letters M (Mamba-2), * (attention), - (MLP), E (experts)")
    return pattern


def _block(moe: bool) -> dict[str, T]:
    mixer = {hf.replace("self_attn.", "mixer."): spec for hf, spec in attention(biases="none").items()}
    table = {**only_where(mixer, ATTENTION_LAYER),
             **only_where(mamba2_mixer("mixer.", conv_bias="optional"), RECURRENT)}
    if not moe:
        ffn = {"mixer.up_proj.weight": T("ffn_up.weight", "n_ff", "n_embd"),
               "mixer.down_proj.weight": T("ffn_down.weight", "n_embd", "n_ff"),
               "mixer.up_proj.bias": T("ffn_up.bias", "n_ff", optional=True),
               "mixer.down_proj.bias": T("ffn_down.bias", "n_embd", optional=True)}
        return {**table, **only_where(ffn, FEED_FORWARD)}
    up = T("ffn_up_exps.weight", "n_expert", "n_ff_exp", "moe_n_embd")
    down = T("ffn_down_exps.weight", "n_expert", "moe_n_embd", "n_ff_exp")
    experts = {
        "mixer.gate.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd"),
        "mixer.gate.e_score_correction_bias": T("exp_probs_b.bias", "n_expert"),
        "mixer.fc1_latent_proj.weight": T("ffn_latent_down.weight", "moe_n_embd", "n_embd", optional=True),
        "mixer.fc2_latent_proj.weight": T("ffn_latent_up.weight", "n_embd", "moe_n_embd", optional=True),
        "mixer.experts.{xid}.up_proj.weight": up, "mixer.experts.up_proj": up,  # per expert, or stacked
        "mixer.experts.{xid}.down_proj.weight": down, "mixer.experts.down_proj": down,
        "mixer.shared_experts.up_proj.weight": T("ffn_up_shexp.weight", "n_ff_shexp", "n_embd"),
        "mixer.shared_experts.down_proj.weight": T("ffn_down_shexp.weight", "n_embd", "n_ff_shexp"),
    }
    return {**table, **only_where(experts, FEED_FORWARD)}


def _table(moe: bool) -> dict[str, T]:
    return {hf: spec for prefix in PREFIXES for hf, spec in backbone(_block(moe), prefix).items()}


class NemotronH(Architecture):
    name = "nemotron_h"
    hf_classes = ("NemotronHForCausalLM",)
    model_types = ("nemotron_h",)
    tokenizer_kind = None  # byte-level BPE (tokenizer.json) in the published models; detected from the files
    tied_output_head = r"lm_head\.weight"
    config_defaults = {"tie_word_embeddings": False}  # NemotronHConfig's default
    tensor_names = _table(moe=False)
    f32_tensors = SSM_CONV_F32
    mtp_prefixes = ("mtp.",)
    dim_names = ("moe_n_embd",)
    moe = False

    @classmethod
    def claims(cls, config: HFConfig) -> bool:
        return super().claims(config) and ("E" in layer_kinds(config)) == cls.moe

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.kinds = layer_kinds(c)
        reject(c, "-" in self.kinds and "E" in self.kinds,
               "the layer pattern mixes plain MLP (-) and expert (E) layers (with experts, llama.cpp runs every "
               "feed-forward layer as experts)")
        reject(c, c.get_str("mlp_hidden_act", default="relu2") != "relu2", "mlp_hidden_act is not relu2")
        reject(c, c.get_str("mamba_hidden_act", default="silu") != "silu", "mamba_hidden_act is not silu")
        self.n_group = mamba2_size(c, "n_groups", names=MAMBA_NAMES)

    def metadata(self) -> Metadata:
        c = self.config
        m = Metadata()
        keys = ArchKeys(m, self.name)
        n_layer = len(self.kinds)
        head_dim = c.get_int("head_dim", "attention_head_dim", min=1)
        keys.u32(Keys.LLM.BLOCK_COUNT, n_layer)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, NO_ROPE_CONTEXT)  # no rope: not limited by the training context
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        n_ff = c.get_int("moe_intermediate_size" if self.moe else "intermediate_size", min=1)
        keys.array(Keys.LLM.FEED_FORWARD_LENGTH, [n_ff if k in "-E" else 0 for k in self.kinds], GGUFValueType.UINT32)
        keys.u32(Keys.Attention.HEAD_COUNT, c.get_int("num_attention_heads", min=1))
        n_head_kv = c.get_int("num_key_value_heads", min=1)
        keys.array(Keys.Attention.HEAD_COUNT_KV, [n_head_kv if k == "*" else 0 for k in self.kinds], GGUFValueType.UINT32)
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", "rms_norm_eps", default=1e-5, min=0))
        if self.moe:
            self.expert_keys(keys)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, head_dim)  # unused (no rope), as llama.cpp's converter writes it
        mamba2_keys(keys, c, names=MAMBA_NAMES, inner_from_heads=True)
        keys.bool(Keys.Rope.SCALING_FINETUNED, False)
        keys.u32(Keys.Attention.KEY_LENGTH, head_dim)
        keys.u32(Keys.Attention.VALUE_LENGTH, head_dim)
        if self.moe:
            self.shared_expert_keys(keys)
        return m

    def expert_keys(self, keys: ArchKeys) -> None:
        """The routing: sigmoid scores, the top-k of score + selection bias within the best groups."""

    def shared_expert_keys(self, keys: ArchKeys) -> None:
        """The experts' and the shared expert's sizes and the routing weights' normalization."""

    def dims(self) -> dict[str, int]:
        return {"moe_n_embd": self.config.get_int("moe_latent_size", default=None, min=1)
                or self.config.get_int("hidden_size", min=1)}

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        # No rope here, so the rotary row order changes nothing (queries and keys are reordered alike
        # within each head); it is applied as llama.cpp's converter does, for byte-identical files.
        if name.endswith("attn_q.weight"):
            return rotary_halves_to_pairs(tensor, self.config.get_int("num_attention_heads", min=1))
        if name.endswith("attn_k.weight"):
            return rotary_halves_to_pairs(tensor, self.config.get_int("num_key_value_heads", min=1))
        return mamba2_transform(name, tensor, self.n_group)


class NemotronHMoe(NemotronH):
    """Nemotron-H with experts ("E" layers): Nemotron 3 Nano / Super."""

    name = "nemotron_h_moe"
    tensor_names = _table(moe=True)
    f32_tensors = ROUTER + SSM_CONV_F32
    moe = True

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, c.get_bool("mlp_bias", default=False), "mlp_bias is true (llama.cpp's experts have no biases)")

    def expert_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("n_routed_experts", "num_local_experts", min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1))
        keys.u32(Keys.LLM.EXPERT_GROUP_COUNT, c.get_int("n_group", default=1, min=1))
        keys.u32(Keys.LLM.EXPERT_GROUP_USED_COUNT, c.get_int("topk_group", default=1, min=1))

    def shared_expert_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, c.get_int("moe_shared_expert_intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_COUNT, c.get_int("n_shared_experts", default=1, min=1))
        keys.bool(Keys.LLM.EXPERT_WEIGHTS_NORM, c.get_bool("norm_topk_prob", default=True))
        keys.f32(Keys.LLM.EXPERT_WEIGHTS_SCALE, c.get_float("routed_scaling_factor", default=1.0))
        keys.u32(Keys.LLM.MOE_LATENT_SIZE, c.get_int("moe_latent_size", default=None, min=1))
