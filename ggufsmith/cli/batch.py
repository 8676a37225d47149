"""`ggufsmith batch`: many models to many types from a plan file (docs/batch.md), locally or on Ray."""

from __future__ import annotations

import argparse
import sys

from ggufsmith.cli.quantize import threads_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="plan file (.yaml/.yml or .toml): sources, output types, output folder")
    parser.add_argument("--force", action="store_true", help="make every output again, even those recorded as finished")
    parser.add_argument("--jobs", "-j", type=int, metavar="N", help="sources converted at once on this machine "
                        "(default: the plan's `jobs`, else the cores, within --max-memory)")
    parser.add_argument("--max-memory", metavar="SIZE", help="memory budget of the local workers, e.g. 16GiB "
                        "(default: the plan's `max_memory`, else no limit)")
    parser.add_argument("--ray", nargs="?", const=True, default=False, metavar="ADDRESS",
                        help="one task per source on a Ray cluster (ADDRESS, e.g. ray://head:10001; without it a local "
                             "Ray); outputs must be on a path all nodes share. Needs pip install 'ggufsmith[ray]'")
    parser.add_argument("--threads", "-t", type=threads_arg, default=0, metavar="N",
                        help="conversion threads of each source (default: the plan's `threads`, else locally the cores shared out between the "
                             "--jobs workers, which then default to the cores divided by N; on Ray 1, the CPUs each "
                             "task reserves); the files are the same for any N")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout instead of a table")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ggufsmith.batch import batch, load_plan

    plan = load_plan(args.plan)  # a bad plan is one error line before anything runs
    report = batch(plan, force=args.force, jobs=args.jobs, max_memory=args.max_memory, ray=args.ray,
                   progress=not args.quiet and not args.json, threads=args.threads or None)
    print(report.to_json() if args.json else report.table())
    for source, lines in report.warnings().items():
        for line in lines:
            print(f"ggufsmith: warning: {source}: {line}", file=sys.stderr)
    for (source, error), types in report.failures().items():  # one line per failing source
        print(f"ggufsmith: error: {source} ({types}): {error}", file=sys.stderr)
    return 0 if report.ok else 1
