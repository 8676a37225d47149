"""`ggufsmith set-metadata`: change, add or remove metadata keys of an existing GGUF file."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "examples:\n"
        "  ggufsmith set-metadata model.gguf 'general.name=My Model' general.license=mit\n"
        "  ggufsmith set-metadata model.gguf llama.context_length=8192     (keeps the key's type, uint32)\n"
        "  ggufsmith set-metadata model.gguf 'general.tags:string[]=[\"chat\", \"llama\"]'\n"
        "  ggufsmith set-metadata model.gguf my.key:float32=0.5 --remove general.description\n"
        "types: " + ", ".join(t for t in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                                           "float32", "float64", "bool", "string")) + "; TYPE[] for an array (JSON)\n"
        "refused: general.alignment, general.architecture, split.*, tokenizer.ggml.tokens/scores/token_type")
    parser.add_argument("file", metavar="FILE.gguf", help="GGUF file to change (rewritten whole, then renamed over the old one)")
    parser.add_argument("changes", metavar="KEY=VALUE", nargs="*",
                        help="a key to set: KEY=VALUE takes the type the key has (a new key: string); KEY:TYPE=VALUE "
                             "gives it")
    parser.add_argument("--remove", metavar="KEY", action="append", default=[], help="a key to delete (repeatable)")
    parser.add_argument("--output", "-o", metavar="OUT.gguf", help="write the changed file here and leave FILE as it is")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")


def run(args: argparse.Namespace) -> int:
    from ggufsmith.gguf_writer.edit import set_metadata

    written = set_metadata(args.file, args.changes, args.remove, output=args.output)
    if not args.quiet:
        print(f"wrote {written}: {len(args.changes)} key(s) set, {len(args.remove)} removed", file=sys.stderr)
    return 0
