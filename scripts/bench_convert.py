#!/usr/bin/env python3
"""Benchmark `ggufsmith convert` against llama.cpp's convert_hf_to_gguf.py on a TinyLlama-sized model.

    python scripts/bench_convert.py [--dir /tmp/ggufsmith-bench] [--outtypes f16,q8_0]

Generates (once, cached in --dir) a llama checkpoint of TinyLlama-1.1B's shape with random bf16
weights in sharded safetensors and a synthetic 32000-piece SentencePiece tokenizer, then converts
it with both tools to each output type, each run in a fresh child process whose wall time and peak
resident memory (the child's own ru_maxrss, from wait4) are measured. Prints a table and the ratios
ggufsmith/reference; the targets are wall time <= 0.5x and peak RSS <= 0.6x.
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

REPO = Path(__file__).resolve().parent.parent

# TinyLlama-1.1B's configuration (the weights are random).
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SHARD_BYTES = 1 << 30


def tensor_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, ff, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (ff, h)),
            (p + "mlp.up_proj.weight", (ff, h)),
            (p + "mlp.down_proj.weight", (h, ff)),
        ]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return shapes


def random_bf16_pool(n: int, seed: int = 0) -> np.ndarray:
    """n random bf16 bit patterns of magnitude ~0.002-0.03 (like trained weights), generated fast."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent = (118 + (bits >> 7) % 5).astype(np.uint16)  # 2^-9 .. 2^-5
    return (bits & np.uint16(0x807F)) | (exponent << np.uint16(7))


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...], np.ndarray]]) -> None:
    """The safetensors format directly: header length, JSON header, raw bf16 bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _, _, data in tensors:
            f.write(data.tobytes())


def write_sentencepiece_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """A valid SentencePiece BPE model with exactly `vocab_size` pieces: <unk>, <s>, </s>, the 256
    byte pieces, then synthetic word pieces (distinct letter strings, with and without '▁')."""
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2

    model = spm_pb2.ModelProto()
    model.trainer_spec.model_type = spm_pb2.TrainerSpec.BPE
    model.trainer_spec.vocab_size = vocab_size
    model.trainer_spec.byte_fallback = True
    model.trainer_spec.unk_id, model.trainer_spec.bos_id, model.trainer_spec.eos_id = 0, 1, 2
    model.trainer_spec.pad_id = -1
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = True
    model.normalizer_spec.remove_extra_whitespaces = False
    Piece = spm_pb2.ModelProto.SentencePiece
    for text, kind in (("<unk>", Piece.UNKNOWN), ("<s>", Piece.CONTROL), ("</s>", Piece.CONTROL)):
        model.pieces.add(piece=text, score=0.0, type=kind)
    for b in range(256):
        model.pieces.add(piece=f"<0x{b:02X}>", score=0.0, type=Piece.BYTE)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: list[str] = list(letters)
    i = 0
    while len(words) < vocab_size:  # all strings of 1, 2, 3... letters, shortest first
        words += [words[i] + c for c in letters]
        i += 1
    score, n = 0.0, len(model.pieces)
    for word in words:
        for piece in ("\u2581" + word, word):
            if n == vocab_size:
                break
            model.pieces.add(piece=piece, score=score, type=Piece.NORMAL)
            score -= 1.0
            n += 1
        if n == vocab_size:
            break
    (model_dir / "tokenizer.model").write_bytes(model.SerializeToString())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "legacy": True,
    }))


def generate_checkpoint(model_dir: Path) -> Path:
    done = model_dir / ".complete"
    if done.is_file():
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    shapes = tensor_shapes(CONFIG)
    pool = random_bf16_pool(1 << 26)
    ones = np.full(CONFIG["hidden_size"], 0x3F80, dtype=np.uint16)  # bf16 1.0, as norms start
    shards: list[list[tuple[str, tuple[int, ...], np.ndarray]]] = [[]]
    shard_bytes, rng = 0, np.random.default_rng(1)
    for name, shape in shapes:
        n = int(np.prod(shape))
        if len(shape) == 1:
            data = ones[:n]
        else:  # a random window of the pool, so tensors differ without generating 1.1e9 numbers
            start_at = int(rng.integers(0, pool.size - n)) if n < pool.size else 0
            data = pool[start_at:start_at + n] if n <= pool.size else np.resize(pool, n)
        if shard_bytes + data.nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((name, shape, data))
        shard_bytes += data.nbytes
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(model_dir / file, tensors)
        weight_map.update({name: file for name, _, _ in tensors})
    total = sum(int(np.prod(s)) * 2 for _, s in shapes)
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (model_dir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (model_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    write_sentencepiece_tokenizer(model_dir, CONFIG["vocab_size"])
    done.write_text("ok")
    print(f"generated {model_dir} ({total / 1e9:.2f} GB, {len(shards)} shards) in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)
    return model_dir


# Runs the command from a fresh, small Python and reports the child's own usage. (A child's ru_maxrss
# starts at its parent's resident size at fork time, so measuring straight from this process, which
# may hold the generated weights, would inflate it.)
_LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "wall": time.perf_counter() - start,
                  "rss_kib": usage.ru_maxrss, "cpu": usage.ru_utime + usage.ru_stime}))
"""


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MiB, CPU seconds user+system) of one fresh child process."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], env=env, cwd=cwd, capture_output=True, text=True)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise SystemExit(f"launcher failed: {proc.stderr[-3000:]}") from None
    if result["code"] != 0:
        raise SystemExit(f"failed ({result['code']}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return result["wall"], result["rss_kib"] / 1024, result["cpu"]


def benchmark_env() -> dict[str, str]:
    """This process's environment without the old-CPU workarounds that slow current numpy (see the
    environment notes): off for every tool alike."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def reference_script() -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from llamacpp_reference import reference_dir  # fetches llama-cpp-python's sdist once

    return reference_dir()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--outtypes", default="f16,q8_0")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool and type (the best is kept)")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--repo", type=Path, default=REPO, help="ggufsmith source tree to benchmark")
    args = parser.parse_args()

    model_dir = generate_checkpoint(args.dir / "tinyllama-shaped-bf16")
    env = benchmark_env()
    tools = {"ggufsmith": lambda out, t: ([sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(out),
                                           "--outtype", t, "--quiet"], {**env, "PYTHONPATH": str(args.repo)})}
    if not args.skip_reference:
        ref = reference_script()
        tools["convert_hf_to_gguf.py"] = lambda out, t: (
            [sys.executable, str(ref / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(out), "--outtype", t],
            {**env, "PYTHONPATH": str(ref / "gguf-py")},
        )
    # Runs are interleaved (tool A, tool B, A, B...) so that both see the same machine load; the
    # best of --repeat is kept. CPU time is printed too: on a shared machine it varies less than wall time.
    results: dict[tuple[str, str], tuple[float, float, float]] = {}
    for _ in range(args.repeat):
        for outtype in args.outtypes.split(","):
            for tool, make in tools.items():
                out = args.dir / f"out-{tool.split('.')[0]}-{outtype}.gguf"
                cmd, run_env = make(out, outtype)
                run = measure(cmd, run_env, args.repo)
                print(f"{outtype:5s} {tool:22s} {run[0]:7.1f} s wall {run[2]:7.1f} s CPU {run[1]:8.0f} MiB  "
                      f"{out.stat().st_size / 1e9:.3f} GB", file=sys.stderr)
                out.unlink()
                best = results.get((outtype, tool))
                results[(outtype, tool)] = run if best is None else tuple(min(a, b) for a, b in zip(best, run))
    print("\n| outtype | tool | wall (s) | CPU (s) | peak RSS (MiB) | wall ratio | RSS ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (outtype, tool), (wall, rss, cpu) in results.items():
        ref = results.get((outtype, "convert_hf_to_gguf.py"))
        ratios = f"{wall / ref[0]:.2f} | {rss / ref[1]:.2f}" if ref and tool == "ggufsmith" else "- | -"
        print(f"| {outtype} | {tool} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {ratios} |")
    load = os.getloadavg()[0]
    print(f"\ntargets: ggufsmith wall <= 0.5x and peak RSS <= 0.6x the reference's; "
          f"{os.cpu_count()} CPUs, load average {load:.1f} at the end, numpy {np.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
