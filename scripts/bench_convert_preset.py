#!/usr/bin/env python3
"""Benchmark `ggufsmith convert --outtype q4_k_m` against llama.cpp's two steps on a TinyLlama-sized model.

    python scripts/bench_convert_preset.py [--dir /tmp/ggufsmith-bench] [--preset q4_k_m]

The checkpoint is scripts/bench_convert.py's (TinyLlama-1.1B's shape, random bf16 weights, cached
in --dir). llama.cpp's way: convert_hf_to_gguf.py --outtype f16 to an intermediate file, then
llama_model_quantize (llama-cpp-python) to the preset with 2 threads, as llama-quantize does.
Ours: one command from the checkpoint, no intermediate file. Each step runs in a fresh child
process; wall time, CPU time and peak RSS (the child's ru_maxrss) are measured, in the same run.
Target (issue 14): ggufsmith's wall time at most 0.6x the two steps' total, peak memory at most 0.5x.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import REPO, benchmark_env, generate_checkpoint, measure, reference_script  # noqa: E402

QUANTIZE_SNIPPET = """
import sys, llama_cpp
from ggufsmith.quantize.presets import get_preset
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(get_preset(sys.argv[3]).file_type)
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--preset", default="q4_k_m")
    parser.add_argument("--repo", type=Path, default=REPO, help="ggufsmith source tree to benchmark")
    args = parser.parse_args()

    model_dir = generate_checkpoint(args.dir / "tinyllama-shaped-bf16")
    env = benchmark_env()
    ref = reference_script()
    f16 = args.dir / "intermediate-f16.gguf"
    theirs, ours = args.dir / f"llamacpp-{args.preset}.gguf", args.dir / f"ggufsmith-{args.preset}.gguf"
    steps = {
        "convert_hf_to_gguf.py --outtype f16": (
            [sys.executable, str(ref / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(f16), "--outtype", "f16"],
            {**env, "PYTHONPATH": str(ref / "gguf-py")}),
        f"llama_model_quantize {args.preset.upper()} (2 threads)": (
            [sys.executable, "-c", QUANTIZE_SNIPPET, str(f16), str(theirs), args.preset],
            {**env, "PYTHONPATH": str(args.repo)}),
        f"ggufsmith convert --outtype {args.preset}": (
            [sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(ours), "--outtype", args.preset, "--quiet"],
            {**env, "PYTHONPATH": str(args.repo)}),
    }
    results = {}
    for name, (cmd, run_env) in steps.items():
        results[name] = measure(cmd, run_env, args.repo)
        print(f"{name:45s} {results[name][0]:7.1f} s wall {results[name][2]:7.1f} s CPU {results[name][1]:8.0f} MiB",
              file=sys.stderr)
    sizes = {"f16": f16.stat().st_size, "theirs": theirs.stat().st_size, "ours": ours.stat().st_size}
    for path in (f16, theirs, ours):
        path.unlink()
    names = list(steps)
    ref_wall = results[names[0]][0] + results[names[1]][0]
    ref_cpu = results[names[0]][2] + results[names[1]][2]
    ref_rss = max(results[names[0]][1], results[names[1]][1])
    wall, rss, cpu = results[names[2]]
    print("\n| step | wall (s) | CPU (s) | peak RSS (MiB) |")
    print("|---|---:|---:|---:|")
    for name, (w, r, c) in results.items():
        print(f"| {name} | {w:.1f} | {c:.1f} | {r:.0f} |")
    print(f"| llama.cpp total (two steps) | {ref_wall:.1f} | {ref_cpu:.1f} | {ref_rss:.0f} |")
    print(f"\nggufsmith / llama.cpp: wall {wall / ref_wall:.2f}x (target <= 0.6x), CPU {cpu / ref_cpu:.2f}x, "
          f"peak RSS {rss / ref_rss:.2f}x; intermediate file: llama.cpp {sizes['f16'] / 1e9:.2f} GB, ggufsmith none")
    print(f"output sizes: llama.cpp {sizes['theirs'] / 1e6:.1f} MB, ggufsmith {sizes['ours'] / 1e6:.1f} MB "
          f"(values differ: llama.cpp quantizes the f16 rounding of the bf16 weights, ggufsmith the weights themselves); "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
