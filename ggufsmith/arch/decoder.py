"""Shared pieces of the llama-style decoders: the tensor tables most HF decoders share (with the
shapes llama.cpp loads them with), so that a plugin lists only where its family differs.

The HF names are those of transformers' LlamaForCausalLM and the many models written after it
(Mistral, Qwen2/3, Gemma, OLMo, Granite, ...): `model.embed_tokens`, `model.layers.{bid}.self_attn.
{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`,
`model.norm`, `lm_head`. Shapes are numpy order (rows last) over the names of tensors.model_dims.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import layer_types, reject
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import Dim, Split, T
from ggufsmith.constants import ExpertGatingFunc, GGUFValueType, Keys
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

LAYER = "model.layers.{bid}."
BLOCK = "blk.{bid}."

Q_ROWS = "n_head * head_dim"
KV_ROWS = "n_head_kv * head_dim"
V_ROWS = "n_head_kv * head_dim_v"
O_COLUMNS = "n_head * head_dim_v"


def in_block(table: dict[str, T | Split], hf_prefix: str = LAYER, gguf_prefix: str = BLOCK) -> dict[str, T | Split]:
    """{"self_attn.q_proj.weight": T("attn_q.weight", ...)} with both sides prefixed by the block."""
    return {hf_prefix + hf: spec.at(gguf_prefix) for hf, spec in table.items()}


def embeddings(prefix: str = "model.", *, output: str = "lm_head.weight") -> dict[str, T]:
    """Token embeddings, the final norm and the output head (optional: a tied head is token_embd)."""
    return {
        f"{prefix}embed_tokens.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        f"{prefix}norm.weight": T("output_norm.weight", "n_embd"),
        output: T("output.weight", "n_vocab", "n_embd", optional=True),
    }


def attention(*, biases: str = "optional", qk_norm: bool = False, o_bias: str | None = None) -> dict[str, T]:
    """q/k/v/o projections of one block (relative names). biases: "optional" (llama.cpp loads the
    model either way), "required", or "none" (a bias in the checkpoint is then an unknown tensor).
    o_bias: the same for the output projection's bias (default: as `biases`). qk_norm: per-head
    RMSNorm of queries and keys (Qwen3, OLMo2, Gemma 3...)."""
    table = {
        "self_attn.q_proj.weight": T("attn_q.weight", Q_ROWS, "n_embd"),
        "self_attn.k_proj.weight": T("attn_k.weight", KV_ROWS, "n_embd"),
        "self_attn.v_proj.weight": T("attn_v.weight", V_ROWS, "n_embd"),
        "self_attn.o_proj.weight": T("attn_output.weight", "n_embd", O_COLUMNS),
    }
    table.update(_biases({"self_attn.q_proj.bias": T("attn_q.bias", Q_ROWS),
                          "self_attn.k_proj.bias": T("attn_k.bias", KV_ROWS),
                          "self_attn.v_proj.bias": T("attn_v.bias", V_ROWS)}, biases))
    table.update(_biases({"self_attn.o_proj.bias": T("attn_output.bias", "n_embd")}, o_bias or biases))
    if qk_norm:
        table["self_attn.q_norm.weight"] = T("attn_q_norm.weight", "head_dim")
        table["self_attn.k_norm.weight"] = T("attn_k_norm.weight", "head_dim")
    return table


def mlp(*, biases: str = "optional", when: str | None = "n_expert == 0", prefix: str = "mlp.") -> dict[str, T]:
    """The gated feed-forward (SwiGLU/GeGLU) of one block: gate, up, down."""
    table = {
        f"{prefix}gate_proj.weight": T("ffn_gate.weight", "n_ff", "n_embd", when=when),
        f"{prefix}up_proj.weight": T("ffn_up.weight", "n_ff", "n_embd", when=when),
        f"{prefix}down_proj.weight": T("ffn_down.weight", "n_embd", "n_ff", when=when),
    }
    table.update(_biases({f"{prefix}gate_proj.bias": T("ffn_gate.bias", "n_ff", when=when),
                          f"{prefix}up_proj.bias": T("ffn_up.bias", "n_ff", when=when),
                          f"{prefix}down_proj.bias": T("ffn_down.bias", "n_embd", when=when)}, biases))
    return table


def fused_gate_up_mlp(prefix: str = "mlp.") -> dict[str, T]:
    """A gated feed-forward whose gate and up projections are one matrix, gate rows first (Phi-3,
    GLM-4): llama.cpp loads it as ffn_up of 2 * n_ff rows and splits it itself."""
    return {
        f"{prefix}gate_up_proj.weight": T("ffn_up.weight", "2 * n_ff", "n_embd"),
        f"{prefix}down_proj.weight": T("ffn_down.weight", "n_embd", "n_ff"),
    }


def experts(*, prefix: str = "mlp.", router: str = "gate", when: str | None = None,
            per_expert: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> dict[str, T | Split]:
    """The router and routed experts of one block, in both checkpoint layouts: one tensor per
    expert (`mlp.experts.{xid}.gate_proj.weight`, stacked by the mapper) and the fused stacks of
    transformers 5 (`mlp.experts.gate_up_proj` (E, 2F, D), split in two, and `mlp.experts.down_proj`).
    per_expert: the HF names of each expert's gate, up and down projections."""
    gate = T("ffn_gate_exps.weight", "n_expert", "n_ff_exp", "n_embd", when=when)
    up = T("ffn_up_exps.weight", "n_expert", "n_ff_exp", "n_embd", when=when)
    down = T("ffn_down_exps.weight", "n_expert", "n_embd", "n_ff_exp", when=when)
    gate_name, up_name, down_name = per_expert
    return {
        f"{prefix}{router}.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd", when=when),
        f"{prefix}experts.{{xid}}.{gate_name}.weight": gate,
        f"{prefix}experts.{{xid}}.{up_name}.weight": up,
        f"{prefix}experts.{{xid}}.{down_name}.weight": down,
        f"{prefix}experts.gate_up_proj": Split(gate, up),
        f"{prefix}experts.down_proj": down,
    }


def mixtral_experts(*, fused_router: str = "gate", when: str | None = None) -> dict[str, T | Split]:
    """Mixtral-style experts (Mixtral, PhiMoE, MiniMax-M2) in both layouts: the original checkpoints'
    `block_sparse_moe.gate` and `block_sparse_moe.experts.{xid}.w1/w3/w2` (gate, up, down), and
    transformers 5's `mlp.<fused_router>` with the fused `mlp.experts.*` stacks."""
    return {**experts(prefix="block_sparse_moe.", per_expert=("w1", "w3", "w2"), when=when),
            **experts(router=fused_router, when=when)}


def shared_expert(prefix: str = "mlp.shared_expert.", *, when: str | None = None) -> dict[str, T]:
    """A shared expert: an MLP every token goes through beside the routed ones."""
    return {
        f"{prefix}gate_proj.weight": T("ffn_gate_shexp.weight", "n_ff_shexp", "n_embd", when=when),
        f"{prefix}up_proj.weight": T("ffn_up_shexp.weight", "n_ff_shexp", "n_embd", when=when),
        f"{prefix}down_proj.weight": T("ffn_down_shexp.weight", "n_embd", "n_ff_shexp", when=when),
    }


# Models whose first blocks are dense (n_layer_dense_lead: a plugin's dims()) and the rest sparse.
DENSE = "bid < n_layer_dense_lead"
SPARSE = "bid >= n_layer_dense_lead"

# The router is tiny and decides which experts run: llama.cpp keeps it F32 whatever the outtype.
ROUTER = (r"blk\.\d+\.ffn_gate_inp\.weight",)


GATING = {"softmax": ExpertGatingFunc.SOFTMAX, "sigmoid": ExpertGatingFunc.SIGMOID}


def sparse_blocks(*, shared_prefix: str = "mlp.shared_experts.", bias_optional: bool = True) -> dict[str, T | Split]:
    """The feed-forward of DeepSeek-style blocks (relative names; DeepSeek V2/V3, GLM-4.5, dots1):
    a dense MLP in the leading blocks, then router, selection bias (e_score_correction_bias,
    llama.cpp's exp_probs_b), routed experts (both checkpoint layouts) and shared ones."""
    return {
        **mlp(biases="none", when=DENSE),
        **experts(when=SPARSE),
        "mlp.gate.e_score_correction_bias": T("exp_probs_b.bias", "n_expert", optional=bias_optional, when=SPARSE),
        **shared_expert(shared_prefix, when=SPARSE),
    }


def sparse_dims(c: HFConfig) -> dict[str, Dim]:
    """The dimensions sparse_blocks' shapes use beyond the metadata's: the number of leading dense
    blocks (first_k_dense_replace) and the width of the shared experts (llama.cpp: n_ff_exp x
    n_expert_shared)."""
    return {
        "n_layer_dense_lead": Dim(c.get_int("first_k_dense_replace", min=0), f"{c.label} first_k_dense_replace"),
        "n_ff_shexp": Dim(c.get_int("moe_intermediate_size", min=1) * c.get_int("n_shared_experts", min=1),
                          f"{c.label} moe_intermediate_size x n_shared_experts"),
    }


def routing_keys(keys: ArchKeys, c: HFConfig, *, scoring: str, grouped: bool) -> None:
    """The MoE keys of DeepSeek-style routing (sparse_blocks' models). scoring: the score function
    when config.json names none (scoring_func); grouped: whether the family's router searches only
    the best topk_group groups of n_group (else groups are not written: llama.cpp would apply them)."""
    n_expert = c.get_int("n_routed_experts", min=1)
    keys.u32(Keys.LLM.EXPERT_COUNT, n_expert)
    keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1, max=n_expert))
    keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
    keys.u32(Keys.LLM.EXPERT_SHARED_COUNT, c.get_int("n_shared_experts", min=1))
    keys.u32(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, c.get_int("first_k_dense_replace", min=0))
    function = c.get_str("scoring_func", default=scoring)
    if function not in GATING:
        raise c.error("scoring_func", function, "'softmax' or 'sigmoid'")
    keys.u32(Keys.LLM.EXPERT_GATING_FUNC, int(GATING[function]))
    keys.f32(Keys.LLM.EXPERT_WEIGHTS_SCALE, c.get_float("routed_scaling_factor", default=None, min=0))
    if c.get_bool("norm_topk_prob"):
        keys.bool(Keys.LLM.EXPERT_WEIGHTS_NORM, True)
    n_group = c.get_int("n_group", default=None, min=1)
    if not grouped or n_group is None:
        return
    topk_group = c.get_int("topk_group", default=n_group, min=1, max=n_group)
    if n_group > 1 and n_expert % n_group:
        raise c.error("n_group", n_group, f"a divisor of n_routed_experts ({n_expert})")
    # Searching all groups is no grouping, which llama.cpp asserts against (topk_group < n_group).
    if n_group == 1 or topk_group < n_group:
        keys.u32(Keys.LLM.EXPERT_GROUP_COUNT, n_group)
        keys.u32(Keys.LLM.EXPERT_GROUP_USED_COUNT, topk_group)


def expert_keys(keys: ArchKeys, c: HFConfig) -> None:
    """expert_count and expert_used_count, under the config names transformers' MoE families use."""
    keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_experts", "num_local_experts", min=1))
    keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1))


def reject_routing(c: HFConfig, *, normalizes_top_k: bool, arch: str) -> None:
    """Refuse a config whose norm_topk_prob asks for what llama.cpp's graph for `arch` does not do
    with the top-k routing weights (renormalize them to sum to one, or use them as they are)."""
    reject(c, c.get_bool("norm_topk_prob", default=False) != normalizes_top_k,
           f"norm_topk_prob is {not normalizes_top_k} (llama.cpp's {arch} "
           f"{'always' if normalizes_top_k else 'never'} renormalizes the routing weights)")


def norms(**names: str) -> dict[str, T]:
    """Per-block norms of width n_embd: norms(input_layernorm="attn_norm", ...) (".weight" added)."""
    return {f"{hf}.weight": T(f"{gguf}.weight", "n_embd") for hf, gguf in names.items()}


LLAMA_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_decoder(*, attention_biases: str = "optional", o_bias: str | None = None, mlp_biases: str = "optional",
                  qk_norm: bool = False, dense_mlp: bool = True) -> dict[str, T]:
    """The whole table of a Llama-layout decoder: embeddings, and per block two norms, attention
    and (unless dense_mlp is False: a mixture of experts the plugin adds instead) the gated MLP."""
    return {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            **attention(biases=attention_biases, o_bias=o_bias, qk_norm=qk_norm),
            **(mlp(biases=mlp_biases) if dense_mlp else {}),
        }),
    }


def _biases(table: dict[str, T], mode: str) -> dict[str, T]:
    if mode == "none":
        return {}
    if mode not in ("optional", "required"):
        raise ValueError(f"biases must be 'optional', 'required' or 'none', not {mode!r}")
    return {hf: T(spec.name, *spec.shape, optional=mode == "optional", when=spec.when) for hf, spec in table.items()}


class Decoder(Architecture):
    """Base of the llama-style decoder plugins: reads heads, head size and rope from config.json,
    writes the keys every such decoder has (`decoder_keys`) and computes rope_freqs for llama3
    scaling. A plugin adds its own keys in `family_keys` and its layout changes in `transform`."""

    tensor_names = llama_decoder()
    layer_norm = False  # LayerNorm (layer_norm_epsilon) instead of RMSNorm (rms_norm_eps)
    context_keys: tuple[str, ...] = ("max_position_embeddings",)  # config names of the training context
    # Hybrids: per layer, whether it has attention (the others are recurrent); None: every layer.
    attention_layers: list[bool] | None = None
    feed_forward_keys: tuple[str, ...] = ("intermediate_size",)  # config names of the (dense) MLP's width
    yarn_handled: tuple[str, ...] = ()  # yarn parameters the plugin writes itself (Rope.write_scaling_keys)
    yarn_log_multiplier = False  # llama.cpp reads rope.scaling.yarn_log_multiplier for the architecture
    # Old checkpoints store the rotary frequencies; they follow from the config.
    ignored_tensors = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config  # the text model's config (text_config of a multimodal checkpoint), with defaults
        self.n_head = c.get_int("num_attention_heads", min=1)
        self.n_head_kv = c.get_int("num_key_value_heads", default=self.n_head, min=1)
        self.head_dim = c.get_int("head_dim", default=None, min=1) or c.get_int("hidden_size", min=1) // self.n_head
        self.rope = Rope(c)

    def metadata(self) -> Metadata:
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        self.decoder_keys(keys)
        self.family_keys(keys)
        return metadata

    def decoder_keys(self, keys: ArchKeys) -> None:
        """The keys llama.cpp reads for every decoder (llama_model_base::load_hparams), from the
        config names transformers uses."""
        c = self.config
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", min=1))
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int(*self.context_keys, default=None, min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, self.feed_forward_length())
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        if self.attention_layers is None:
            keys.u32(Keys.Attention.HEAD_COUNT_KV, self.n_head_kv)
        else:  # llama.cpp's hybrids take a layer with no key/value heads for a recurrent one
            keys.array(Keys.Attention.HEAD_COUNT_KV, [int(self.n_head_kv) if a else 0 for a in self.attention_layers],
                       GGUFValueType.UINT32)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        keys.f32(Keys.Rope.FREQ_BASE_SWA, self.rope.swa_theta)
        if self.layer_norm:
            keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", min=0))
        else:
            keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("rms_norm_eps", "norm_eps", min=0))
        if "head_dim" in c:
            keys.u32(Keys.Attention.KEY_LENGTH, self.head_dim)
            keys.u32(Keys.Attention.VALUE_LENGTH, self.head_dim)
        self.rope.write_scaling_keys(keys, self.yarn_handled, yarn_log_multiplier=self.yarn_log_multiplier)

    def feed_forward_length(self) -> int:
        """The (dense) MLP's width: the first of `feed_forward_keys` in the config."""
        return self.config.get_int(*self.feed_forward_keys, min=1)

    def family_keys(self, keys: ArchKeys) -> None:
        """The keys that are this family's own. Default: none."""

    def sliding_window_keys(self, keys: ArchKeys, pattern: list[bool] | None) -> None:
        """attention.sliding_window and, per layer, whether it is a sliding-window layer."""
        keys.u32(Keys.Attention.SLIDING_WINDOW, self.config.get_int("sliding_window", min=1))
        if pattern is not None:
            keys.array(Keys.Attention.SLIDING_WINDOW_PATTERN, pattern, GGUFValueType.BOOL)

    def layer_types(self, default: list[str]) -> list[str]:
        """config.json layer_types ("sliding_attention" / "full_attention" per layer), checked."""
        return layer_types(self.config, default)

    def extra_tensors(self) -> dict[str, LazyTensor]:
        return self.rope.rope_freqs(int(self.rope.partial_rotary_factor() * self.head_dim))
