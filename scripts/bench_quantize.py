"""Quantization speed of ggufsmith against ggml's C code (one thread) and gguf-py, on the same data.

    python scripts/bench_quantize.py                     # every registered type, 64 MB each
    python scripts/bench_quantize.py --types q6_k,q4_0 --mb 16 --importance

Prints one row per type: MB/s of float32 input for ours, ggml's ggml_quantize_chunk (through
ctypes from llama-cpp-python's libggml-base; single-threaded by construction) and gguf-py where it
implements the type (all measured as CPU time of this one-threaded process), the ratios of the
best runs, the median over the repeats of ours/ggml's ratio within one turn (the contenders run
back to back, so a slow spell of a shared machine falls on both: the steadier figure), and
whether our bytes equal ggml's. Run from the repository root
with llama-cpp-python and gguf installed (the `test` extra). For one core: `taskset -c 0 python ...`.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggufsmith.quantize import get_format, quantize, supported_types  # noqa: E402

ROW_LENGTH = 4096


def _ggml_quantizer():
    try:
        from tests.ggml_oracle import ggml_quantize
    except Exception as exc:  # noqa: BLE001 - any import problem means "not available"
        print(f"ggml C oracle unavailable ({exc}); its column stays empty", file=sys.stderr)
        return None
    return ggml_quantize


def _gguf_py_quantizer(ggml_type):
    try:
        import gguf
    except ImportError:
        return None
    try:
        qtype = gguf.GGMLQuantizationType(int(ggml_type))
    except ValueError:  # a type newer than this gguf-py
        return None
    probe = np.zeros((1, ROW_LENGTH), dtype=np.float32)
    try:
        gguf.quants.quantize(probe, qtype)
    except NotImplementedError:
        return None
    return lambda rows: gguf.quants.quantize(rows, qtype)


def _rates(funcs: list, data: np.ndarray, repeats: int) -> tuple[list[tuple[float, object]], list[list[float]]]:
    """Best MB/s of float32 input over `repeats` runs of each function and its last result, and
    every run's seconds. The functions take turns (a, b, a, b, ...), so that a slow spell of a
    shared machine, which on this 2-core VM moves a function's time by 20% within a minute, falls
    on all of them rather than on whichever ran then. CPU time of this process, not wall time:
    every contender runs on one thread, and on a shared machine CPU time is what stays comparable
    between runs. Each function first quantizes one row untimed: ggml builds the IQ grids' tables
    on first use (IQ1_S's took 14 s here), which is not quantization speed."""
    for func in funcs:
        func(data[:1])
    seconds: list[list[float]] = [[] for _ in funcs]
    results: list[object] = [None] * len(funcs)
    for _ in range(repeats):
        for index, func in enumerate(funcs):
            start = time.process_time()
            results[index] = func(data)
            seconds[index].append(time.process_time() - start)
    return [(data.nbytes / 1e6 / min(runs), result) for runs, result in zip(seconds, results)], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated type names (default: every registered type)")
    parser.add_argument("--mb", type=float, default=64.0, help="MB of float32 input per type (default 64)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per measurement; the best counts")
    parser.add_argument("--importance", action="store_true", help="pass a random imatrix where the type uses one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.types:
        types = [get_format(name).ggml_type for name in args.types.split(",")]
    else:
        types = supported_types()
    n_rows = max(1, int(args.mb * 1e6) // (4 * ROW_LENGTH))
    rng = np.random.default_rng(args.seed)
    data = rng.standard_normal((n_rows, ROW_LENGTH), dtype=np.float32)
    ggml_quantize = _ggml_quantizer()

    header = (f"{'type':<8} {'ours MB/s':>10} {'ggml C MB/s':>12} {'gguf-py MB/s':>13} {'ours/ggml':>10} {'paired':>7}"
              f" {'ours/gguf-py':>13}  bit-exact")
    print(f"{data.nbytes / 1e6:.0f} MB of float32 per type, rows of {ROW_LENGTH}{', with imatrix' if args.importance else ''}"
          " (* always with an imatrix: the type needs one)")
    print(header)
    print("-" * len(header))
    for ggml_type in types:
        fmt = get_format(ggml_type)
        importance = None
        # IQ2_XXS, IQ2_XS and IQ1_S cannot be made without one: they always get one
        if (args.importance and fmt.supports_importance) or fmt.requires_importance:
            importance = rng.lognormal(0.0, 1.0, ROW_LENGTH).astype(np.float32)
        contenders = [lambda rows: quantize(rows, ggml_type, importance)]
        if ggml_quantize is not None:
            contenders.append(lambda rows: ggml_quantize(rows, int(ggml_type), importance))
        # gguf-py "quantizes" F32 by returning a view: no work to compare against.
        gguf_py = _gguf_py_quantizer(ggml_type) if importance is None and ggml_type.name != "F32" else None
        if gguf_py is not None:
            contenders.append(gguf_py)
        with np.errstate(all="ignore"):  # gguf-py's own float warnings
            rates, seconds = _rates(contenders, data, args.repeats)
        ours_rate, ours = rates[0]

        ggml_rate = exact = paired = None
        if ggml_quantize is not None:
            ggml_rate, expected = rates[1]
            paired = float(np.median(np.array(seconds[1]) / np.array(seconds[0])))
            exact = bool(np.array_equal(ours, expected.reshape(-1)))
        gguf_rate = rates[-1][0] if gguf_py is not None else None

        def fmt_rate(rate):
            return f"{rate:.3g}" if rate is not None else "-"  # 3 digits: the grid types make < 1 MB/s

        def fmt_ratio(rate):
            return f"{ours_rate / rate:.2f}x" if rate else "-"

        print(
            f"{ggml_type.name + ('*' if fmt.requires_importance else ''):<8} {fmt_rate(ours_rate):>10} {fmt_rate(ggml_rate):>12} {fmt_rate(gguf_rate):>13} "
            f"{fmt_ratio(ggml_rate):>10} {'-' if paired is None else f'{paired:.2f}x':>7} {fmt_ratio(gguf_rate):>13}  {'-' if exact is None else ('yes' if exact else 'NO')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
