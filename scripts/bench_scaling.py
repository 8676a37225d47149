#!/usr/bin/env python3
"""How `ggufsmith quantize` scales with workers, against llama.cpp's llama_model_quantize with the
same number of threads, in the same run.

    python scripts/bench_scaling.py [--dir /tmp/ggufsmith-bench] [--types F16,Q8_0,Q4_K_M,Q6_K]
                                    [--max-workers N] [--input f32|f16] [--small] [--repeat R]

The model is scripts/bench_convert.py's TinyLlama-1.1B-shaped random bf16 checkpoint (--small: the
same with hidden 1024, 8 layers), converted once by ggufsmith to the --input GGUF (F32 by default,
so that F16 is real work for both tools). Each run is a fresh child process (`python -m ggufsmith
quantize IN OUT TYPE --threads n`, and llama_model_quantize with nthread = n through
llama-cpp-python), interleaved so that both see the same machine load; the best of --repeat runs
is kept. Prints per type and worker count: wall time, input MB/s, speed-up over one worker, the
efficiency of the last added core (speed-up gained by it; 1.0 is perfect), CPU time (user +
system of the process and its quantizer processes), and ours/llama.cpp's wall and CPU time. The machine's load average is printed at the start and the end: on a shared machine
only ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import CONFIG, REPO, benchmark_env, generate_checkpoint, measure  # noqa: E402
import bench_convert  # noqa: E402

LLAMA_QUANTIZE = """
import sys, llama_cpp
from ggufsmith.quantize.presets import get_preset
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(get_preset(sys.argv[3]).file_type)
p.nthread = int(sys.argv[4])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""
SMALL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4)


def input_gguf(args, env) -> Path:
    if args.small:
        bench_convert.CONFIG = dict(CONFIG, **SMALL)
    name = "small" if args.small else "tinyllama-shaped"
    model_dir = generate_checkpoint(args.dir / f"{name}-bf16")
    path = args.dir / f"{name}-{args.input}.gguf"
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(path), "--outtype", args.input,
                        "--quiet"], env={**env, "PYTHONPATH": str(args.repo)}, check=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--types", default="F16,Q8_0,Q4_K_M,Q6_K")
    parser.add_argument("--max-workers", type=int, default=None, help="default: every core this process may use")
    parser.add_argument("--input", choices=["f32", "f16"], default="f32")
    parser.add_argument("--small", action="store_true", help="hidden 1024, 8 layers instead of TinyLlama's shape")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the best is kept")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--repo", type=Path, default=REPO, help="ggufsmith source tree to benchmark")
    args = parser.parse_args()

    sys.path.insert(0, str(args.repo))
    from ggufsmith.converters.workers import available_cores

    env = {**benchmark_env(), "PYTHONPATH": str(args.repo)}
    max_workers = args.max_workers or available_cores()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)
    src = input_gguf(args, env)
    input_mb = src.stat().st_size / 1e6
    out = args.dir / "scaling-out.gguf"
    tools = {"ggufsmith": lambda kind, n: [sys.executable, "-m", "ggufsmith", "quantize", str(src), str(out), kind,
                                           "--threads", str(n), "--quiet"]}
    if not args.skip_reference:
        tools["llama.cpp"] = lambda kind, n: [sys.executable, "-c", LLAMA_QUANTIZE, str(src), str(out), kind, str(n)]
    walls: dict[tuple[str, str, int], float] = {}
    cpus: dict[tuple[str, str, int], float] = {}
    for _ in range(args.repeat):
        for kind in args.types.upper().split(","):
            for n in range(1, max_workers + 1):
                for tool, command in tools.items():
                    wall, rss, cpu = measure(command(kind, n), env, args.repo)
                    print(f"{kind:7s} {n:2d} workers {tool:10s} {wall:7.2f} s wall {cpu:7.2f} s CPU {rss:6.0f} MiB",
                          file=sys.stderr)
                    key = (kind, tool, n)
                    walls[key] = min(wall, walls.get(key, wall))
                    cpus[key] = min(cpu, cpus.get(key, cpu))
    out.unlink(missing_ok=True)

    print(f"\n`ggufsmith quantize` of {src.name} ({input_mb:.0f} MB), best of {args.repeat}; "
          f"{os.cpu_count()} CPUs, {available_cores()} available\n")
    columns = ["type", "workers", "ggufsmith (s)", "MB/s", "speed-up", "added core", "CPU (s)"]
    if len(tools) > 1:
        columns += ["llama.cpp (s)", "speed-up", "added core", "CPU (s)", "ours/llama.cpp wall", "CPU"]
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for kind in args.types.upper().split(","):
        for n in range(1, max_workers + 1):
            cells = [kind, str(n)]
            for tool in tools:
                wall = walls[(kind, tool, n)]
                speedup = walls[(kind, tool, 1)] / wall
                added = speedup - walls[(kind, tool, 1)] / walls[(kind, tool, n - 1)] if n > 1 else 1.0
                cells += [f"{wall:.2f}"] + ([f"{input_mb / wall:.0f}"] if tool == "ggufsmith" else [])
                cells += [f"{speedup:.2f}x", f"{added:.2f}", f"{cpus[(kind, tool, n)]:.1f}"]
            if len(tools) > 1:
                cells += [f"{walls[(kind, 'ggufsmith', n)] / walls[(kind, 'llama.cpp', n)]:.2f}x",
                          f"{cpus[(kind, 'ggufsmith', n)] / cpus[(kind, 'llama.cpp', n)]:.2f}x"]
            print("| " + " | ".join(cells) + " |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
