#!/usr/bin/env python3
"""Peak memory of `ggufsmith convert` on a mixture-of-experts checkpoint with 1 GB expert stacks.

    python scripts/bench_moe_memory.py [--dir /tmp/ggufsmith-bench] [--outtypes f16,q4_k_m] [--skip-reference]

Generates (once, cached in --dir) a Qwen3-MoE-shaped checkpoint with random bf16 weights in two
layouts with the same weights: transformers 5's fused one (`mlp.experts.gate_up_proj`, one
(128, 2048, 2048) tensor of 1.07 GB per layer, and `mlp.experts.down_proj`, 0.54 GB) and the
per-expert one older checkpoints use (128 x 3 tensors per layer). Converts each with ggufsmith to
every --outtype, and the per-expert one with llama.cpp's convert_hf_to_gguf.py (which reads only
that layout) as the reference measured in the same run.

What is counted, sampled every 20 ms over the whole process tree (ggufsmith's quantizer worker
processes included), from /proc (Linux):
  - anon: the sum of the processes' anonymous resident memory (RssAnon): what the converter
    allocates, the number the 400 MB target of issue 15 is about;
  - total: anon plus the resident pages of mapped files (RssFile: the checkpoint's mmap, shared
    libraries), i.e. the processes' whole RSS. Clean file pages are page cache the kernel drops at
    will; ggufsmith returns the checkpoint's pages after each slice (madvise), so they stay small.
Also the largest single process's peak RSS as the kernel reports it (ru_maxrss, as
scripts/bench_convert.py prints), which sampling cannot miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import benchmark_env, random_bf16_pool, reference_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TARGET_MIB = 400

# Qwen3-30B-A3B's attention and expert count, experts 1024 wide so that gate_up is over 1 GB; one
# layer is enough: memory is about the largest tensor, not the number of layers. A small byte-level
# BPE vocabulary of Qwen's pre-tokenizer (the tests' trainer), which llama.cpp's converter recognizes.
CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 1024,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 1508,  # the tokenizer's 1500 + 8 special tokens
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SHARD_BYTES = 2 << 30


def tensor_shapes(c: dict, fused: bool) -> list[tuple[str, tuple[int, ...]]]:
    h, ff, v, n = c["hidden_size"], c["moe_intermediate_size"], c["vocab_size"], c["num_experts"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (c["head_dim"],)),
            (p + "self_attn.k_norm.weight", (c["head_dim"],)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate.weight", (n, h)),
        ]
        if fused:
            shapes += [(p + "mlp.experts.gate_up_proj", (n, 2 * ff, h)), (p + "mlp.experts.down_proj", (n, h, ff))]
        else:
            for e in range(n):
                shapes += [(p + f"mlp.experts.{e}.gate_proj.weight", (ff, h)), (p + f"mlp.experts.{e}.up_proj.weight", (ff, h)),
                           (p + f"mlp.experts.{e}.down_proj.weight", (h, ff))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return shapes


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], pool: np.ndarray, rng) -> None:
    """A safetensors file written tensor by tensor in pieces of the random pool (never a whole
    1 GB tensor in this process's memory): norms are bf16 1.0, matrices random windows of the pool."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, shape in tensors:
            n = int(np.prod(shape))
            if len(shape) == 1:
                f.write(np.full(n, 0x3F80, dtype=np.uint16).tobytes())
                continue
            while n:
                take = min(n, pool.size // 2)
                start = int(rng.integers(0, pool.size - take + 1))
                f.write(pool[start:start + take].tobytes())
                n -= take


def generate_checkpoint(model_dir: Path, fused: bool) -> Path:
    done = model_dir / ".complete"
    if done.is_file():
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pool, rng = random_bf16_pool(1 << 26), np.random.default_rng(1)  # same seed: both layouts hold alike data
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensor_shapes(CONFIG, fused):
        nbytes = int(np.prod(shape)) * 2
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_shard(model_dir / file, tensors, pool, rng)
        weight_map.update({name: file for name, _ in tensors})
    total = sum(int(np.prod(s)) * 2 for _, s in tensor_shapes(CONFIG, fused))
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (model_dir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    from tests.tokenizer_helpers import train_bpe  # REPO is on the path (main)

    train_bpe(model_dir, "qwen2", vocab_size=1500)
    done.write_text("ok")
    print(f"generated {model_dir} ({total / 1e9:.2f} GB, {len(shards)} shards) in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)
    return model_dir


# Runs the command from a fresh, small Python, samples its process tree's memory from /proc and
# reports the child's own ru_maxrss (see bench_convert.py for why not straight from this process).
_LAUNCHER = r"""
import json, os, subprocess, sys, time

def tree(root):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found

def rss_kib(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out.get("RssAnon", 0), out.get("RssFile", 0) + out.get("RssShmem", 0)

start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
peak_anon = peak_total = 0
while True:
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid:
        break
    anon = file = 0
    for member in tree(proc.pid):
        a, f = rss_kib(member)
        anon, file = anon + a, file + f
    peak_anon, peak_total = max(peak_anon, anon), max(peak_total, anon + file)
    time.sleep(0.02)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "wall": time.perf_counter() - start,
                  "anon_kib": peak_anon, "total_kib": peak_total, "maxrss_kib": usage.ru_maxrss}))
"""


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Wall seconds and peak memory (MiB) of one fresh child process and its descendants."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], env=env, cwd=cwd, capture_output=True, text=True)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise SystemExit(f"launcher failed: {proc.stderr[-3000:]}") from None
    if result["code"] != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {result['code']}"}
    return {"wall": result["wall"], **{k[:-4]: v / 1024 for k, v in result.items() if k.endswith("_kib")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--outtypes", default="f16,q4_k_m")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--repo", type=Path, default=REPO, help="ggufsmith source tree to benchmark")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    reference = None if args.skip_reference else reference_script()
    layouts = {layout: generate_checkpoint(args.dir / f"qwen3moe-{layout}-bf16", fused=layout == "fused")
               for layout in ("fused", "per-expert")}
    env = benchmark_env()
    runs = [("ggufsmith", layout, outtype) for outtype in args.outtypes.split(",") for layout in layouts]
    if reference:
        # convert_hf_to_gguf.py quantizes to f16/bf16/q8_0 only (llama-quantize does the rest)
        runs += [("convert_hf_to_gguf.py", "per-expert", t) for t in args.outtypes.split(",") if t in ("f16", "bf16", "q8_0")]
    results = {}
    for tool, layout, outtype in runs:
        out = args.dir / f"moe-out-{tool.split('.')[0]}-{layout}-{outtype}.gguf"
        model_dir = layouts[layout]
        if tool == "ggufsmith":
            cmd = [sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(out), "--outtype", outtype, "--quiet"]
            run_env = {**env, "PYTHONPATH": str(args.repo)}
        else:
            # told the pre-tokenizer of the trained tokenizer, which its hash table cannot know
            from tests.decoder_reference import _RUNNER as FORCED_PRE_RUNNER

            cmd = [sys.executable, "-c", FORCED_PRE_RUNNER, str(reference), str(model_dir), "--outfile", str(out),
                   "--outtype", outtype]
            run_env = {**env, "PYTHONPATH": str(reference / "gguf-py"), "FORCE_PRE": "qwen2"}
        result = results[tool, layout, outtype] = measure(cmd, run_env, args.repo)
        print(f"{tool:22s} {layout:10s} {outtype:7s} {json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()})}",
              file=sys.stderr)
        out.unlink(missing_ok=True)
    print("\n| tool | layout | outtype | wall (s) | peak anon (MiB) | peak total RSS (MiB) | largest ru_maxrss (MiB) | anon vs reference |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (tool, layout, outtype), r in results.items():
        if "failed" in r:
            print(f"| {tool} | {layout} | {outtype} | failed: {r['failed'][:80]} | | | | |")
            continue
        ref = results.get(("convert_hf_to_gguf.py", "per-expert", outtype), {})
        ratio = f"{r['anon'] / ref['anon']:.2f}" if tool == "ggufsmith" and "anon" in ref else "-"
        print(f"| {tool} | {layout} | {outtype} | {r['wall']:.1f} | {r['anon']:.0f} | {r['total']:.0f} | {r['maxrss']:.0f} | {ratio} |")
    print(f"\nlargest expert stack: {2 * CONFIG['num_experts'] * CONFIG['moe_intermediate_size'] * CONFIG['hidden_size'] * 2 / 2**20:.0f} MiB "
          f"(bf16 gate_up_proj); target: ggufsmith's peak anon < {TARGET_MIB} MiB; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
