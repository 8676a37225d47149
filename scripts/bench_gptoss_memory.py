#!/usr/bin/env python3
"""Peak memory of converting gpt-oss checkpoints whose expert stacks are about 1 GB each.

    python scripts/bench_gptoss_memory.py [--dir /tmp/ggufsmith-gptoss-bench] [--threads 2]

Generates (once, cached in --dir) two one-block gpt-oss checkpoints of gpt-oss-20b's widths (hidden
2880, expert width 2880) with random weights: "float", 32 experts in bf16 as transformers saves them
((experts, in, out) stacks: gate_up 1.06 GB, transposed while converting), and "mxfp4", 128 experts
in the released checkpoints' MXFP4 blocks and scales (gate_up blocks 1.06 GB, passed through). Each
is converted to f16 in a fresh child process, whose peak resident memory (its own ru_maxrss) is
printed next to the size of the largest expert stack in the checkpoint; the target is a peak under
400 MB, a fraction of one stack.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
HIDDEN, FF, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2880, 2880, 64, 8, 64, 1024
EXPERTS = {"float": 32, "mxfp4": 128}


def config(n_experts: int, mxfp4: bool) -> dict:
    c = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": HIDDEN,
         "intermediate_size": FF, "num_hidden_layers": 1, "num_attention_heads": HEADS,
         "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_local_experts": n_experts,
         "num_experts_per_tok": 4, "vocab_size": VOCAB, "sliding_window": 128, "max_position_embeddings": 131072,
         "rms_norm_eps": 1e-5, "layer_types": ["sliding_attention"], "swiglu_limit": 7.0,
         "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}}
    if mxfp4:
        c["quantization_config"] = {"quant_method": "mxfp4"}
    return c


def shapes(n_experts: int, mxfp4: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of every tensor, in file order."""
    p = "model.layers.0."
    out = [("lm_head.weight", "BF16", (VOCAB, HIDDEN)), ("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)),
           ("model.norm.weight", "BF16", (HIDDEN,)), (p + "input_layernorm.weight", "BF16", (HIDDEN,)),
           (p + "post_attention_layernorm.weight", "BF16", (HIDDEN,)),
           (p + "mlp.router.weight", "BF16", (n_experts, HIDDEN)), (p + "mlp.router.bias", "BF16", (n_experts,)),
           (p + "mlp.experts.gate_up_proj_bias", "BF16", (n_experts, 2 * FF)),
           (p + "mlp.experts.down_proj_bias", "BF16", (n_experts, HIDDEN)),
           (p + "self_attn.sinks", "BF16", (HEADS,))]
    for proj, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
        out += [(p + f"self_attn.{proj}_proj.weight", "BF16", (rows, HIDDEN)), (p + f"self_attn.{proj}_proj.bias", "BF16", (rows,))]
    out += [(p + "self_attn.o_proj.weight", "BF16", (HIDDEN, HEADS * HEAD_DIM)), (p + "self_attn.o_proj.bias", "BF16", (HIDDEN,))]
    if mxfp4:  # (experts, out, in / 32, 16) codes and (experts, out, in / 32) exponents
        out += [(p + "mlp.experts.gate_up_proj_blocks", "U8", (n_experts, 2 * FF, HIDDEN // 32, 16)),
                (p + "mlp.experts.gate_up_proj_scales", "U8", (n_experts, 2 * FF, HIDDEN // 32)),
                (p + "mlp.experts.down_proj_blocks", "U8", (n_experts, HIDDEN, FF // 32, 16)),
                (p + "mlp.experts.down_proj_scales", "U8", (n_experts, HIDDEN, FF // 32))]
    else:  # (experts, in, out)
        out += [(p + "mlp.experts.gate_up_proj", "BF16", (n_experts, HIDDEN, 2 * FF)),
                (p + "mlp.experts.down_proj", "BF16", (n_experts, FF, HIDDEN))]
    return out


def write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]]) -> None:
    """Random data written piece by piece (bf16 ~N(0, 0.02); MXFP4 exponents around 2^-7)."""
    rng = np.random.default_rng(0)
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        size = int(np.prod(shape)) * (2 if dtype == "BF16" else 1)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, dtype, shape in tensors:
            n = int(np.prod(shape))
            for start in range(0, n, 1 << 26):
                count = min(1 << 26, n - start)
                if dtype == "BF16":
                    values = (rng.standard_normal(count, dtype=np.float32) * 0.02).view(np.uint32) >> 16
                    f.write(values.astype("<u2").tobytes())
                elif name.endswith("_scales"):
                    f.write(rng.integers(118, 124, count, dtype=np.uint8).tobytes())
                else:
                    f.write(rng.integers(0, 256, count, dtype=np.uint8).tobytes())


def make(folder: Path, layout: str) -> Path:
    model_dir = folder / layout
    if (model_dir / "config.json").exists():
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    mxfp4 = layout == "mxfp4"
    write_safetensors(model_dir / "model.safetensors", shapes(EXPERTS[layout], mxfp4))
    (model_dir / "config.json").write_text(json.dumps(config(EXPERTS[layout], mxfp4)))
    return model_dir


CHILD = """
import resource, sys, time
import ggufsmith
start = time.perf_counter()
ggufsmith.convert(sys.argv[1], sys.argv[2], outtype="f16", with_tokenizer=False, threads=int(sys.argv[3]))
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ggufsmith-gptoss-bench"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"{'layout':8} {'largest stack':>14} {'output':>10} {'seconds':>8} {'peak RSS':>10} {'RSS / stack':>12}")
    for layout in ("float", "mxfp4"):
        model_dir = make(args.dir, layout)
        stack = max(int(np.prod(s)) * (2 if d == "BF16" else 1) for _, d, s in shapes(EXPERTS[layout], layout == "mxfp4"))
        out = args.dir / f"{layout}.gguf"
        done = subprocess.run([sys.executable, "-c", CHILD, str(model_dir), str(out), str(args.threads)],
                              cwd=REPO, capture_output=True, text=True, check=True)
        seconds, peak = (float(x) for x in done.stdout.split())
        print(f"{layout:8} {stack / 2**20:11.0f} MiB {out.stat().st_size / 2**20:7.0f} MiB {seconds:8.1f} "
              f"{peak / 2**20:7.0f} MiB {peak / stack:12.2f}")
        out.unlink()


if __name__ == "__main__":
    main()
