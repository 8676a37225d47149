#!/usr/bin/env python3
"""Benchmark `ggufsmith batch` (one source to five types, read once) against five separate `ggufsmith convert` runs.

    python scripts/bench_batch.py [--dir /tmp/ggufsmith-bench] [--outtypes f16,q8_0,q6_k,q5_k_m,q4_k_m]

The checkpoint is bench_convert.py's TinyLlama-1.1B-shaped bf16 model (generated once, cached in
--dir). Each run is a fresh child process whose wall time and peak RSS are measured (bench_convert's
launcher), in the same run of this script: the five converts one after another, then the batch.
Targets (issue 13): batch wall time <= 0.6x the five converts' sum, batch peak RSS <= 1.5x the
largest convert's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import REPO, benchmark_env, generate_checkpoint, measure  # noqa: E402

TYPES = "f16,q8_0,q6_k,q5_k_m,q4_k_m"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--outtypes", default=TYPES)
    parser.add_argument("--repo", type=Path, default=REPO, help="ggufsmith source tree to benchmark")
    args = parser.parse_args()

    model_dir = generate_checkpoint(args.dir / "tinyllama-shaped-bf16")
    env = {**benchmark_env(), "PYTHONPATH": str(args.repo)}
    outtypes = args.outtypes.split(",")
    out_dir = args.dir / "batch-bench"
    out_dir.mkdir(parents=True, exist_ok=True)

    converts = []
    for outtype in outtypes:
        out = out_dir / f"convert-{outtype}.gguf"
        run = measure([sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(out), "--outtype", outtype,
                       "--quiet"], env, args.repo)
        print(f"convert {outtype:7s} {run[0]:7.1f} s wall {run[2]:7.1f} s CPU {run[1]:7.0f} MiB", file=sys.stderr)
        converts.append((outtype, out, run))

    plan = out_dir / "plan.yaml"
    plan.write_text(f"output_dir: batch\nname_pattern: '{{type}}'\nsources:\n  - path: {model_dir}\n"
                    f"    outtypes: [{', '.join(outtypes)}]\n")
    batch_run = measure([sys.executable, "-m", "ggufsmith", "batch", str(plan), "--force", "--quiet", "--json"], env, args.repo)
    print(f"batch   {'all':7s} {batch_run[0]:7.1f} s wall {batch_run[2]:7.1f} s CPU {batch_run[1]:7.0f} MiB", file=sys.stderr)

    identical = all((out_dir / "batch" / f"{t.upper()}.gguf").read_bytes() == out.read_bytes() for t, out, _ in converts)
    for _, out, _ in converts:
        out.unlink()
    for path in (out_dir / "batch").glob("*.gguf"):
        path.unlink()

    total_wall = sum(r[0] for _, _, r in converts)
    total_cpu = sum(r[2] for _, _, r in converts)
    max_rss = max(r[1] for _, _, r in converts)
    print("\n| run | wall (s) | CPU (s) | peak RSS (MiB) |")
    print("|---|---:|---:|---:|")
    for outtype, _, (wall, rss, cpu) in converts:
        print(f"| convert {outtype} | {wall:.1f} | {cpu:.1f} | {rss:.0f} |")
    print(f"| 5 converts (sum; RSS max) | {total_wall:.1f} | {total_cpu:.1f} | {max_rss:.0f} |")
    print(f"| batch | {batch_run[0]:.1f} | {batch_run[2]:.1f} | {batch_run[1]:.0f} |")
    print(f"\nwall ratio batch/converts {batch_run[0] / total_wall:.2f} (target <= 0.6), CPU ratio "
          f"{batch_run[2] / total_cpu:.2f}, RSS ratio batch/one convert {batch_run[1] / max_rss:.2f} (target <= 1.5); "
          f"outputs byte-identical: {identical}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
