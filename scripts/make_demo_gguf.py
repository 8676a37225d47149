"""Write a small demo GGUF file (a tiny random llama-shaped model, F32 and F16) to try `inspect` on.

    python scripts/make_demo_gguf.py [OUTPUT.gguf]

The default name follows the GGUF naming convention: Demo-Llama-117K-v1.0-F16.gguf.
"""

from __future__ import annotations

import sys

import numpy as np

from ggufsmith.constants import GGMLType, GGUFValueType, Keys, arch_key
from ggufsmith.gguf_writer import GGUFWriter, Metadata
from ggufsmith.quantize import quantize

ARCH = "llama"
VOCAB, EMBED, FFN, LAYERS, HEADS = 256, 64, 176, 2, 4


def demo_tensors() -> list[tuple[str, tuple[int, ...], GGMLType]]:
    tensors = [("token_embd.weight", (VOCAB, EMBED), GGMLType.F16), ("output_norm.weight", (EMBED,), GGMLType.F32)]
    for i in range(LAYERS):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (EMBED,), GGMLType.F32),
            (f"blk.{i}.attn_q.weight", (EMBED, EMBED), GGMLType.F16),
            (f"blk.{i}.attn_k.weight", (EMBED, EMBED), GGMLType.F16),
            (f"blk.{i}.attn_v.weight", (EMBED, EMBED), GGMLType.F16),
            (f"blk.{i}.attn_output.weight", (EMBED, EMBED), GGMLType.F16),
            (f"blk.{i}.ffn_norm.weight", (EMBED,), GGMLType.F32),
            (f"blk.{i}.ffn_gate.weight", (FFN, EMBED), GGMLType.F16),
            (f"blk.{i}.ffn_up.weight", (FFN, EMBED), GGMLType.F16),
            (f"blk.{i}.ffn_down.weight", (EMBED, FFN), GGMLType.F16),
        ]
    return tensors


def demo_metadata() -> Metadata:
    md = Metadata()
    md.add_string(Keys.General.ARCHITECTURE, ARCH)
    md.add_string(Keys.General.NAME, "Demo Llama")
    md.add_uint32(arch_key(Keys.LLM.CONTEXT_LENGTH, ARCH), 128)
    md.add_uint32(arch_key(Keys.LLM.EMBEDDING_LENGTH, ARCH), EMBED)
    md.add_uint32(arch_key(Keys.LLM.BLOCK_COUNT, ARCH), LAYERS)
    md.add_uint32(arch_key(Keys.LLM.FEED_FORWARD_LENGTH, ARCH), FFN)
    md.add_uint32(arch_key(Keys.Attention.HEAD_COUNT, ARCH), HEADS)
    md.add_float32(arch_key(Keys.Attention.LAYERNORM_RMS_EPS, ARCH), 1e-5)
    md.add_uint32(Keys.General.FILE_TYPE, 1)  # mostly F16
    md.add_string(Keys.Tokenizer.MODEL, "gpt2")
    md.add_array(Keys.Tokenizer.TOKENS, [f"<{i:02x}>" for i in range(VOCAB)], GGUFValueType.STRING)
    return md


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "Demo-Llama-117K-v1.0-F16.gguf"
    rng = np.random.default_rng(0)
    with GGUFWriter(path, demo_metadata()) as writer:
        for name, shape, ggml_type in demo_tensors():
            writer.add_tensor(name, shape, ggml_type)
        for name, shape, ggml_type in demo_tensors():
            writer.write_tensor(name, quantize(rng.standard_normal(shape, dtype=np.float32) * 0.02, ggml_type))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
