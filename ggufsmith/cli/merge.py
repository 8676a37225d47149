"""`ggufsmith merge`: the parts of a split GGUF model joined into one file (llama-gguf-split --merge)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ggufsmith.cli.quantize import add_force_option

    parser.add_argument("first", metavar="FIRST_PART", help="the first part, NAME-00001-of-0000n.gguf")
    parser.add_argument("dst", metavar="OUT.gguf", help="GGUF file to write (written whole or not at all)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    add_force_option(parser)


def run(args: argparse.Namespace) -> int:
    from ggufsmith.cli.quantize import show_progress
    from ggufsmith.converters.split_files import merge_gguf

    merge_gguf(args.first, args.dst, progress=show_progress(args), force=args.force)
    if not args.quiet:
        print(f"wrote {args.dst}", file=sys.stderr)
    return 0
