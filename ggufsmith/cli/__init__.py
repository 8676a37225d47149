"""The `ggufsmith` command line: subcommands, and one place that turns errors into one-line messages.

Each subcommand lives in the module that does its work; that module provides
`add_arguments(parser)` and `run(args) -> int`. This file only wires them together.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from importlib import import_module

from ggufsmith import __version__
from ggufsmith.errors import GgufsmithError, one_line

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("ggufsmith.cli.convert", "convert a Hugging Face model folder to a GGUF file"),
    "quantize": ("ggufsmith.cli.quantize", "quantize a GGUF file with one of llama-quantize's presets (Q4_K_M, ...)"),
    "imatrix": ("ggufsmith.cli.imatrix", "compute an importance matrix (llama-imatrix's) from calibration text with transformers"),
    "batch": ("ggufsmith.cli.batch", "convert many models to many types from a plan file, each source read once; locally or on Ray"),
    "inspect": ("ggufsmith.gguf_writer.inspect", "read and validate a GGUF file, print its metadata and tensors"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggufsmith",
        description="Convert Hugging Face / PyTorch / safetensors checkpoints to GGUF, quantize and inspect GGUF files.",
    )
    parser.add_argument("--version", action="version", version=f"ggufsmith {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and debug detail")
        module = import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("ggufsmith: interrupted", file=sys.stderr)
        return 130
    except (GgufsmithError, OSError, MemoryError) as e:
        if args.verbose:
            traceback.print_exc()
        print(f"ggufsmith: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug in ggufsmith: still one line, with a hint to get the traceback
        if args.verbose:
            traceback.print_exc()
        else:
            print(f"ggufsmith: internal error: {type(e).__name__}: {_one_line(e)} (run with --verbose for the traceback)", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    return one_line(e)
