"""`ggufsmith convert`: a Hugging Face model folder to a GGUF file."""

from __future__ import annotations

import argparse
import sys

from ggufsmith.converters.plan import OUTTYPES


def _architectures_epilog() -> str:
    from ggufsmith.arch.registry import all_architectures

    try:
        plugins = all_architectures()
    except Exception as e:  # a broken third-party plugin must not hide --help
        return f"supported architectures: unavailable ({e})"
    if not plugins:
        return "supported architectures: none installed"
    lines = ["supported architectures (--arch NAME: Hugging Face classes):"]
    for name in sorted(plugins):
        classes = ", ".join(plugins[name].hf_classes) or ", ".join(plugins[name].model_types) or "-"
        lines.append(f"  {name}: {classes}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _architectures_epilog()
    parser.add_argument("src", metavar="SRC_DIR", help="Hugging Face model folder (config.json and weights)")
    parser.add_argument("dst", metavar="OUT.gguf", help="GGUF file to write (written whole or not at all)")
    parser.add_argument("--outtype", default="f16", choices=list(OUTTYPES), type=str.lower,
                        help="type of the 2-D weights; norms and biases stay F32 (default: f16)")
    parser.add_argument("--arch", metavar="NAME", help="architecture plugin to use (default: from config.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (source, GGUF name, shape, type, bytes) and write nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    parser.add_argument("--model-name", metavar="NAME", help="general.name to write (default: from the model card/config/folder)")


def run(args: argparse.Namespace) -> int:
    from ggufsmith.converters.pipeline import convert

    plan = convert(args.src, args.dst, args.outtype, args.arch, dry_run=args.dry_run,
                   progress=not args.quiet, model_name=args.model_name)
    if args.dry_run:
        print(plan.describe())
    else:
        for t in plan.fallbacks:
            print(f"ggufsmith: {t.name}: {t.note}", file=sys.stderr)
        if args.verbose:
            print(plan.describe(), file=sys.stderr)
        if not args.quiet:
            print(f"wrote {args.dst}: {len(plan.tensors)} tensors, {plan.total_bytes} bytes of tensor data, "
                  f"{plan.architecture.name}, {plan.outtype}", file=sys.stderr)
    return 0
