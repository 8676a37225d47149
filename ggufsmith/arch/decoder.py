"""Shared pieces of the llama-style decoders: the tensor tables most HF decoders share (with the
shapes llama.cpp loads them with), so that a plugin lists only where its family differs.

The HF names are those of transformers' LlamaForCausalLM and the many models written after it
(Mistral, Qwen2/3, Gemma, OLMo, Granite, ...): `model.embed_tokens`, `model.layers.{bid}.self_attn.
{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`,
`model.norm`, `lm_head`. Shapes are numpy order (rows last) over the names of tensors.model_dims.
"""

from __future__ import annotations

from ggufsmith.arch.tensors import T

LAYER = "model.layers.{bid}."
BLOCK = "blk.{bid}."

Q_ROWS = "n_head * head_dim"
KV_ROWS = "n_head_kv * head_dim"
V_ROWS = "n_head_kv * head_dim_v"
O_COLUMNS = "n_head * head_dim_v"


def in_block(table: dict[str, T], hf_prefix: str = LAYER, gguf_prefix: str = BLOCK) -> dict[str, T]:
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


def norms(**names: str) -> dict[str, T]:
    """Per-block norms of width n_embd: norms(input_layernorm="attn_norm", ...) (".weight" added)."""
    return {f"{hf}.weight": T(f"{gguf}.weight", "n_embd") for hf, gguf in names.items()}


LLAMA_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_decoder(*, attention_biases: str = "optional", mlp_biases: str = "optional", qk_norm: bool = False) -> dict[str, T]:
    """The whole table of a Llama-layout decoder: embeddings, and per block two norms, attention
    and the gated MLP."""
    return {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            **attention(biases=attention_biases, qk_norm=qk_norm),
            **mlp(biases=mlp_biases),
        }),
    }


def _biases(table: dict[str, T], mode: str) -> dict[str, T]:
    if mode == "none":
        return {}
    if mode not in ("optional", "required"):
        raise ValueError(f"biases must be 'optional', 'required' or 'none', not {mode!r}")
    return {hf: T(spec.name, *spec.shape, optional=mode == "optional", when=spec.when) for hf, spec in table.items()}
