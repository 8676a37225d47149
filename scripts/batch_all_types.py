#!/usr/bin/env python3
"""Every standard type of one model, in one pass over its weights (ggufsmith.batch).

    python scripts/batch_all_types.py MODEL_DIR_OR_REPO_ID OUT_DIR [--types f16,q8_0,...] [--imatrix FILE] [--ray [ADDRESS]]

Writes <BaseName>-<SizeLabel>-...-<Type>.gguf files into OUT_DIR; a rerun skips the finished ones
(--force redoes them). Presets other than --types' default need --imatrix when llama.cpp requires
one (IQ types, Q2_K). Prints the report; exit status 1 if any output failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ggufsmith.batch import batch
from ggufsmith.batch.plan import plan_from_dict
from ggufsmith.cli.quantize import threads_arg

# What model publishers usually put up: full precision, 8 bits, and the usual k-quant mixes.
STANDARD_TYPES = "f16,bf16,q8_0,q6_k,q5_k_m,q5_k_s,q4_k_m,q4_k_s,q3_k_m,q4_0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="model folder, or a Hugging Face repo id in the local cache")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--types", default=STANDARD_TYPES)
    parser.add_argument("--imatrix", type=Path)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--ray", nargs="?", const=True, default=False)
    parser.add_argument("--threads", type=threads_arg, default=0, help="conversion threads per source (default: "
                        "the cores shared out locally, 1 per Ray task; see docs/batch.md)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    source = {"path": str(Path(args.source).resolve())} if Path(args.source).is_dir() else {"repo": args.source}
    if args.imatrix:
        source["imatrix"] = str(args.imatrix.resolve())
    source["outtypes"] = args.types.split(",")
    plan = plan_from_dict({"output_dir": str(args.out_dir.resolve()), "sources": [source]}, Path.cwd() / "(command line)")
    report = batch(plan, force=args.force, ray=args.ray, progress=not args.json, threads=args.threads or None)
    print(report.to_json() if args.json else report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
