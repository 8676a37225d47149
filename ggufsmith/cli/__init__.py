"""The `ggufsmith` command line: subcommands, and one place that turns errors into one-line messages.

Each subcommand lives in the module that does its work; that module provides
`add_arguments(parser)` and `run(args) -> int`. This file only wires them together, and decides
what reaches the terminal:

- an error is one line, `ggufsmith: error: ...`, and the only line (no traceback unless --verbose);
- Ctrl-C, SIGTERM and SIGHUP stop the command at once: the temporary file being written is deleted,
  one line says so, and the exit status is 128 + the signal's number (130 for Ctrl-C, 143 for
  SIGTERM). The handler exits from where it runs rather than raising an exception through the
  code below: an exception raised at an arbitrary point can leave a lock of the conversion's
  thread pool held and the process hung in its clean-up;
- warnings of ggufsmith's own (its loggers: the file will behave differently from the original
  in some way) are held until the command succeeds, then printed one line each, --quiet or not;
  --verbose prints them as they come. Warnings of other libraries (numpy, torch: Python's warnings
  module) are shown only with --verbose. --quiet (each command's) silences everything else but
  errors: progress, summaries, notes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

from ggufsmith import __version__
from ggufsmith.errors import GgufsmithError, one_line
from ggufsmith.gguf_writer.output import delete_own_temp_files
from ggufsmith.logs import WarningLines

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("ggufsmith.cli.convert", "convert a Hugging Face model folder to a GGUF file"),
    "convert-lora": ("ggufsmith.cli.convert_lora", "convert a PEFT LoRA adapter to a GGUF adapter file llama.cpp applies"),
    "quantize": ("ggufsmith.cli.quantize", "quantize a GGUF file with one of llama-quantize's presets (Q4_K_M, ...)"),
    "imatrix": ("ggufsmith.cli.imatrix", "compute an importance matrix (llama-imatrix's) from calibration text with transformers"),
    "batch": ("ggufsmith.cli.batch", "convert many models to many types from a plan file, each source read once; locally or on Ray"),
    "inspect": ("ggufsmith.gguf_writer.inspect", "read and validate a GGUF file, print its metadata and tensors"),
    "split": ("ggufsmith.cli.split", "cut a GGUF model into parts llama.cpp loads (as llama-gguf-split)"),
    "merge": ("ggufsmith.cli.merge", "join the parts of a split GGUF model into one file (as llama-gguf-split --merge)"),
    "set-metadata": ("ggufsmith.cli.set_metadata", "change, add or remove metadata keys of a GGUF file (rewritten safely)"),
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


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parser.parse_args, but for an optional last positional (a command's `optional_last`, as
    convert-lora's OUT) given after an option: argparse matches it, empty, with the positionals before
    the option and leaves it over ("convert-lora ADAPTER --base BASE OUT")."""
    args, extra = parser.parse_known_args(argv)
    late = getattr(args, "optional_last", None)
    if late and len(extra) == 1 and not extra[0].startswith("-") and getattr(args, late) is None:
        setattr(args, late, extra.pop())
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        with _stop_signals(), _held_warnings(args.verbose) as held:
            status = int(args.run(args) or 0)
        for line in held:
            print(f"ggufsmith: warning: {line}", file=sys.stderr)
        return status
    except KeyboardInterrupt:  # main() called from a thread other than the main one: no handler
        print("ggufsmith: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_stop_signal(signum: int, frame) -> None:
    for other in STOP_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(other, signal.SIG_IGN)
    delete_own_temp_files()
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    newline = "\n" if sys.stderr.isatty() else ""  # after a progress bar's unfinished line
    try:
        print(f"{newline}ggufsmith: {what}", file=sys.stderr, flush=True)
    finally:
        os._exit(128 + signum)


@contextmanager
def _stop_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # main() called from a thread
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:  # `nohup ggufsmith ...` keeps ignoring SIGHUP
            signal.signal(sig, _on_stop_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def _held_warnings(verbose: bool) -> Iterator[list[str]]:
    """The warnings to print once the command succeeds (see the module docstring)."""
    ours, foreign = logging.getLogger("ggufsmith"), logging.getLogger("py.warnings")
    saved = [(logger, logger.level, logger.propagate) for logger in (ours, foreign)]
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ggufsmith: %(levelname)s: %(name)s: %(message)s"))
        ours.setLevel(logging.DEBUG)
    else:
        handler = WarningLines()
        ours.setLevel(logging.WARNING)
    foreign_handler = handler if verbose else logging.NullHandler()
    ours.addHandler(handler)
    foreign.addHandler(foreign_handler)
    ours.propagate = foreign.propagate = False
    logging.captureWarnings(True)
    try:
        yield handler.lines if isinstance(handler, WarningLines) else []
    finally:
        logging.captureWarnings(False)
        ours.removeHandler(handler)
        foreign.removeHandler(foreign_handler)
        for logger, level, propagate in saved:
            logger.setLevel(level)
            logger.propagate = propagate


def _one_line(e: BaseException) -> str:
    return one_line(e)
