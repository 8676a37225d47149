"""`ggufsmith split`: an existing GGUF model cut into parts llama.cpp loads (llama-gguf-split --split)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ggufsmith.cli.quantize import add_force_option, add_split_options

    parser.add_argument("src", metavar="IN.gguf", help="GGUF model: one file, or the first part of a split model")
    parser.add_argument("prefix", metavar="OUT_PREFIX", help="the parts are written as OUT_PREFIX-00001-of-0000n.gguf ...")
    add_split_options(parser)
    parser.add_argument("--no-tensor-first-split", action="store_true",
                        help="the first part holds the metadata and no tensor (its keys can then be edited and "
                             "uploaded again without the tensors), as llama-gguf-split --no-tensor-first-split")
    parser.add_argument("--dry-run", action="store_true", help="print the parts and write nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    add_force_option(parser)


def run(args: argparse.Namespace) -> int:
    from ggufsmith.cli.quantize import show_progress, split_rule
    from ggufsmith.converters.split_files import split_gguf

    parts = split_gguf(args.src, args.prefix, split_rule(args), metadata_only_first_part=args.no_tensor_first_split,
                       dry_run=args.dry_run, progress=show_progress(args), force=args.force)
    if args.dry_run or not args.quiet:
        verb = "would write" if args.dry_run else "wrote"
        listed = ", ".join(f"{p.path} ({p.tensors} tensors, {p.tensor_bytes} bytes)" for p in parts)
        print(f"{verb} {len(parts)} parts: {listed}", file=sys.stderr)
    return 0
