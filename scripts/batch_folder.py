#!/usr/bin/env python3
"""Every model folder under a folder, to the same types (ggufsmith.batch): one source per subfolder with a config.json.

    python scripts/batch_folder.py MODELS_DIR OUT_DIR [--types f16,q8_0,q4_k_m] [--jobs N] [--max-memory 16GiB] [--ray [ADDRESS]]

Each model is read once for all its types; models run side by side within the memory budget (or
one Ray task each); a model that fails does not stop the others. A rerun skips finished files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ggufsmith.batch import batch
from ggufsmith.batch.plan import plan_from_dict
from ggufsmith.cli.quantize import threads_arg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--types", default="f16,q8_0,q4_k_m")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--max-memory")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--ray", nargs="?", const=True, default=False)
    parser.add_argument("--threads", type=threads_arg, default=0, help="conversion threads per source (default: "
                        "the cores shared out locally, 1 per Ray task; see docs/batch.md)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    folders = sorted(p for p in args.models_dir.resolve().iterdir() if (p / "config.json").is_file())
    if not folders:
        print(f"{args.models_dir}: no model folders (subfolders with a config.json)", file=sys.stderr)
        return 1
    plan = plan_from_dict({"output_dir": str(args.out_dir.resolve()), "defaults": {"outtypes": args.types.split(",")},
                           "sources": [{"path": str(p)} for p in folders]}, args.models_dir.resolve() / "(folder)")
    report = batch(plan, force=args.force, jobs=args.jobs, max_memory=args.max_memory, ray=args.ray, progress=not args.json,
                   threads=args.threads or None)
    print(report.to_json() if args.json else report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
