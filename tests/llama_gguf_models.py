"""Tiny llama-architecture F32 GGUF files written directly with our writer, with random weights.

They are inputs for llama.cpp's own quantizer (llama_model_quantize), which needs only the
architecture keys and tensors, not a tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggufsmith.constants import GGMLType, Keys, arch_key
from ggufsmith.gguf_writer import GGUFWriter, Metadata


def llama_tensor_shapes(n_layer=8, hidden=256, ff=512, n_head=8, n_kv=2, vocab=512, n_expert=0, tied=False,
                        fused_qkv=False, shared_expert=False):
    """(name, numpy shape) of every tensor of a llama / mixtral model, as llama.cpp names them;
    with `fused_qkv` one attn_qkv per block (phi3, falcon, bloom...) instead of attn_q/k/v, with
    `shared_expert` a shared expert beside the routed ones (qwen2moe, deepseek2...)."""
    head_dim = hidden // n_head
    shapes = [("token_embd.weight", (vocab, hidden)), ("output_norm.weight", (hidden,))]
    if not tied:
        shapes.append(("output.weight", (vocab, hidden)))
    for i in range(n_layer):
        b = f"blk.{i}."
        shapes.append((b + "attn_norm.weight", (hidden,)))
        if fused_qkv:
            shapes.append((b + "attn_qkv.weight", (hidden + 2 * n_kv * head_dim, hidden)))
        else:
            shapes += [
                (b + "attn_q.weight", (hidden, hidden)),
                (b + "attn_k.weight", (n_kv * head_dim, hidden)),
                (b + "attn_v.weight", (n_kv * head_dim, hidden)),
            ]
        shapes += [
            (b + "attn_output.weight", (hidden, hidden)),
            (b + "ffn_norm.weight", (hidden,)),
        ]
        if n_expert:
            shapes += [
                (b + "ffn_gate_inp.weight", (n_expert, hidden)),
                (b + "ffn_gate_exps.weight", (n_expert, ff, hidden)),
                (b + "ffn_up_exps.weight", (n_expert, ff, hidden)),
                (b + "ffn_down_exps.weight", (n_expert, hidden, ff)),
            ]
            if shared_expert:
                shapes += [
                    (b + "ffn_gate_shexp.weight", (ff, hidden)),
                    (b + "ffn_up_shexp.weight", (ff, hidden)),
                    (b + "ffn_down_shexp.weight", (hidden, ff)),
                ]
        else:
            shapes += [
                (b + "ffn_gate.weight", (ff, hidden)),
                (b + "ffn_up.weight", (ff, hidden)),
                (b + "ffn_down.weight", (hidden, ff)),
            ]
    return shapes


def write_llama_gguf(path: Path, *, seed=0, n_layer=8, hidden=256, ff=512, n_head=8, n_kv=2, vocab=512,
                     n_expert=0, tied=False, fused_qkv=False, shared_expert=False, arch="llama"
                     ) -> list[tuple[str, tuple[int, ...]]]:
    """`arch`: the architecture llama.cpp's quantizer sees (its rules differ for falcon); the tensors
    stay llama's, which the quantizer does not check."""
    rng = np.random.default_rng(seed)
    md = Metadata()
    md.add_string(Keys.General.ARCHITECTURE, arch)
    for key, value in [
        (Keys.LLM.CONTEXT_LENGTH, 256),
        (Keys.LLM.EMBEDDING_LENGTH, hidden),
        (Keys.LLM.BLOCK_COUNT, n_layer),
        (Keys.LLM.FEED_FORWARD_LENGTH, ff),
        (Keys.Rope.DIMENSION_COUNT, hidden // n_head),
        (Keys.Attention.HEAD_COUNT, n_head),
        (Keys.Attention.HEAD_COUNT_KV, n_kv),
    ]:
        md.add_uint32(arch_key(key, arch), value)
    md.add_float32(arch_key(Keys.Attention.LAYERNORM_RMS_EPS, arch), 1e-5)
    if arch == "falcon":
        md.add_float32(arch_key(Keys.Attention.LAYERNORM_EPS, arch), 1e-5)  # what its loader reads
    if n_expert:
        md.add_uint32(arch_key(Keys.LLM.EXPERT_COUNT, arch), n_expert)
        md.add_uint32(arch_key(Keys.LLM.EXPERT_USED_COUNT, arch), 2)
    shapes = llama_tensor_shapes(n_layer, hidden, ff, n_head, n_kv, vocab, n_expert, tied, fused_qkv, shared_expert)
    with GGUFWriter(path, md) as writer:
        for name, shape in shapes:
            writer.add_tensor(name, shape, GGMLType.F32)
        for name, shape in shapes:
            # heavy-ish tails so that the quantizers' searches have work to do
            writer.write_tensor(name, (rng.standard_t(5, size=shape) * 0.02).astype(np.float32))
    return shapes
