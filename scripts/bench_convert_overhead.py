#!/usr/bin/env python3
"""What `convert --outtype q4_k_m` costs besides the K-quant kernels, for one or more source trees.

    python scripts/bench_convert_overhead.py [--repo A --repo B] [--repeat 3]

Runs the one-step conversion of scripts/bench_convert.py's bf16 checkpoint with the Q4_K and Q6_K
row functions replaced by a stand-in that returns zeros of the right size (in every process, by a
sitecustomize module in a temporary folder put first on PYTHONPATH): what is left is reading and
widening the checkpoint, the plan and tokenizer export, the worker threads and processes, moving
the rows to them and the bytes back, and writing the file. The output is not a usable model.
Trees run alternately (A, B, A, B...) so that both see the same machine load; prints the median
wall and CPU time (user + system, the quantizer processes included) of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import REPO, benchmark_env, generate_checkpoint, measure  # noqa: E402

STUB = """
import dataclasses
import numpy as np
from ggufsmith.constants import GGMLType
from ggufsmith.quantize import registry


def _zeros(fmt):
    return lambda rows, importance: np.zeros((rows.shape[0], fmt.row_bytes(rows.shape[1])), np.uint8)


for _type in (GGMLType.Q4_K, GGMLType.Q6_K):
    _format = registry._FORMATS[_type]
    registry._FORMATS[_type] = dataclasses.replace(_format, quantize_rows=_zeros(_format))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench")
    parser.add_argument("--repo", type=Path, action="append", help="ggufsmith source tree (repeatable; default: this one)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    repos = args.repo or [REPO]
    model_dir = generate_checkpoint(args.dir / "tinyllama-shaped-bf16")
    out = args.dir / "overhead-q4_k_m.gguf"
    runs: dict[Path, list[tuple[float, float]]] = {repo: [] for repo in repos}
    with tempfile.TemporaryDirectory() as stub_dir:
        (Path(stub_dir) / "sitecustomize.py").write_text(STUB)
        for _ in range(args.repeat):
            for repo in repos:
                env = {**benchmark_env(), "PYTHONPATH": os.pathsep.join([stub_dir, str(repo)])}
                cmd = [sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(out), "--outtype", "q4_k_m", "--quiet"]
                wall, _, cpu = measure(cmd, env, repo)
                out.unlink()
                runs[repo].append((wall, cpu))
                print(f"{repo}: {wall:.1f} s wall, {cpu:.1f} s CPU, load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("\n| source tree | wall (s), median | CPU (s), median |")
    print("|---|---:|---:|")
    for repo, values in runs.items():
        print(f"| {repo} | {statistics.median(w for w, _ in values):.2f} | {statistics.median(c for _, c in values):.2f} |")
    print(f"\n{args.repeat} runs each, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
