#!/usr/bin/env python3
"""Threads or processes: how the quantizer scales with workers of each kind, on the same data.

    python scripts/bench_gil.py [--types q4_k,q6_k,q8_0,f16] [--mb 32] [--max-workers N]

Quantizes --mb MB of random float32 rows (rows of 4096, pieces of 1M values) with 1..N threads of
this process, then with 1..N of the pipeline's quantizer processes (converters/processes.py, fed
by as many threads), and prints MB/s and the speed-up over one worker. Threads stop scaling where
the quantizer holds the interpreter lock; processes do not share it. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggufsmith.converters.processes import QuantizerProcesses  # noqa: E402
from ggufsmith.converters.workers import available_cores  # noqa: E402
from ggufsmith.quantize import get_format, quantize  # noqa: E402

PIECE_ROWS = 256  # 256 rows of 4096: 1M values, 4 MiB of float32


def _rate(pieces: list[np.ndarray], workers: int, quantize_piece) -> float:
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(quantize_piece, pieces[:workers]))  # warm up (and start processes)
        start = time.perf_counter()
        list(pool.map(quantize_piece, pieces))
        wall = time.perf_counter() - start
    return sum(p.nbytes for p in pieces) / 1e6 / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="q4_k,q6_k,q8_0,f16")
    parser.add_argument("--mb", type=float, default=32.0, help="MB of float32 input per measurement")
    parser.add_argument("--max-workers", type=int, default=None, help="default: every core this process may use")
    args = parser.parse_args()

    max_workers = args.max_workers or available_cores()
    n_rows = max(PIECE_ROWS, int(args.mb * 1e6) // (4 * 4096) // PIECE_ROWS * PIECE_ROWS)
    data = np.random.default_rng(0).standard_normal((n_rows, 4096), dtype=np.float32)
    pieces = [data[i:i + PIECE_ROWS] for i in range(0, n_rows, PIECE_ROWS)]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{data.nbytes / 1e6:.0f} MB per measurement\n")
    print("| type | workers | threads MB/s | speed-up | processes MB/s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.types.split(","):
        ggml_type = get_format(name).ggml_type
        base = {}
        for n in range(1, max_workers + 1):
            processes = QuantizerProcesses(n)
            try:
                rates = {"threads": _rate(pieces, n, lambda p: quantize(p, ggml_type)),
                         "processes": _rate(pieces, n, lambda p: processes.quantize(p, ggml_type, None))}
            finally:
                processes.close()
            base = base or rates
            print(f"| {ggml_type.name} | {n} | {rates['threads']:.0f} | {rates['threads'] / base['threads']:.2f}x | "
                  f"{rates['processes']:.0f} | {rates['processes'] / base['processes']:.2f}x |", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
