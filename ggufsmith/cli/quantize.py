"""`ggufsmith quantize`: a GGUF file to another with one of llama-quantize's presets, same options."""

from __future__ import annotations

import argparse
import sys

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError


def ggml_type_arg(text: str) -> GGMLType:
    """A tensor type by name, any case (q4_k, Q8_0, f16), as llama-quantize parses it."""
    try:
        return GGMLType[text.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown tensor type {text!r}") from None


def tensor_type_arg(text: str) -> tuple[str, GGMLType]:
    """PATTERN=TYPE; the pattern is lowercased and searched in tensor names, as llama-quantize does."""
    pattern, sep, type_name = text.partition("=")
    if not sep or not pattern or not type_name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PATTERN=TYPE, e.g. attn_v=q8_0")
    return pattern.lower(), ggml_type_arg(type_name)


def prune_layers_arg(text: str) -> list[int]:
    """--prune-layers 20,21,22: block numbers, sorted and each once, as llama-quantize parses them."""
    from ggufsmith.converters.prune_layers import parse_prune_layers

    try:
        return parse_prune_layers(text)
    except QuantizationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def threads_arg(text: str) -> int:
    """--threads N: a number of threads, 0 for the command's default (every core this process may use,
    or for `batch` the cores shared out between its workers)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of threads, or 0 for the default")
    return value


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", "-t", type=threads_arg, default=0, metavar="N",
                        help="worker threads (default: every core this process may use, from its CPU affinity and "
                             "cgroup quota); the output is the same for any N")


def add_quantize_options(parser: argparse.ArgumentParser) -> None:
    """llama-quantize's options that `convert --outtype PRESET` accepts too."""
    parser.add_argument("--imatrix", metavar="FILE", help="importance matrix (llama.cpp's GGUF or legacy .dat format)")
    parser.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                        help="use the importance matrix only for tensors whose name contains NAME (repeatable)")
    parser.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                        help="do not use the importance matrix for tensors whose name contains NAME (repeatable)")
    parser.add_argument("--pure", action="store_true", help="every quantizable tensor gets the preset's base type (no mixture rules)")
    parser.add_argument("--output-tensor-type", type=ggml_type_arg, metavar="TYPE", help="type of output.weight")
    parser.add_argument("--token-embedding-type", type=ggml_type_arg, metavar="TYPE", help="type of token_embd.weight")
    parser.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight in its input type")
    parser.add_argument("--tensor-type", type=tensor_type_arg, action="append", default=[], metavar="PATTERN=TYPE",
                        help="type of the tensors whose name matches the regular expression PATTERN (repeatable; first match wins)")
    parser.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                        help="set a metadata key in the output (TYPE int, float, bool or str; int is written as uint32)")
    parser.add_argument("--prune-layers", type=prune_layers_arg, default=[], metavar="L0,L1,...",
                        help="leave these blocks out and renumber the others (block_count and per-layer arrays follow)")


def split_size_arg(text: str) -> int:
    from ggufsmith.converters.split import parse_split_size
    from ggufsmith.errors import ConversionError

    try:
        return parse_split_size(text)
    except ConversionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return value


def add_split_options(parser: argparse.ArgumentParser) -> None:
    """llama.cpp's --split-max-size / --split-max-tensors (converters/split.py)."""
    parser.add_argument("--split-max-size", type=split_size_arg, default=0, metavar="N[K|M|G]",
                        help="write the model as parts OUT-00001-of-0000n.gguf ... of at most N bytes of tensor data "
                             "each (K, M, G: powers of 1000), which llama.cpp loads given the first")
    parser.add_argument("--split-max-tensors", type=positive_int_arg, default=0, metavar="N",
                        help="write the model as parts of at most N tensors each")


def split_rule(args: argparse.Namespace):
    from ggufsmith.converters.split import SplitRule

    return SplitRule(args.split_max_size, args.split_max_tensors)


def add_metadata_option(parser: argparse.ArgumentParser, replaced: str) -> None:
    parser.add_argument("--metadata", metavar="FILE.json",
                        help="JSON object of general.* keys (general.name, general.author, general.tags, ...) that "
                             f"replace {replaced}, as convert_hf_to_gguf.py --metadata")


def add_force_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="if the output is an existing device or FIFO, write into it (it is never replaced; "
                             "an error then leaves what was written so far in it). An input or a directory is "
                             "refused even so")


def show_progress(args: argparse.Namespace) -> bool:
    """A progress bar only on a terminal: in a log file or a pipe it would be lines of noise."""
    return not args.quiet and sys.stderr.isatty()


def build_request(preset: str, args: argparse.Namespace, allow_requantize: bool = False):
    from ggufsmith.converters.quantize_plan import QuantizeRequest, parse_kv_override
    from ggufsmith.quantize.imatrix import read_imatrix
    from ggufsmith.quantize.presets import get_preset

    get_preset(preset)
    if args.include_weights and args.exclude_weights:
        raise QuantizationError("--include-weights and --exclude-weights cannot be used together")
    imatrix = None
    if args.imatrix:
        imatrix = read_imatrix(args.imatrix).select(args.include_weights, args.exclude_weights)
    elif args.include_weights or args.exclude_weights:
        raise QuantizationError("--include-weights/--exclude-weights select entries of an importance matrix; give --imatrix FILE")
    return QuantizeRequest(
        preset, pure=args.pure, output_tensor_type=args.output_tensor_type, token_embedding_type=args.token_embedding_type,
        leave_output_tensor=args.leave_output_tensor, tensor_types=list(args.tensor_type),
        kv_overrides=[parse_kv_override(text) for text in args.override_kv], imatrix=imatrix, allow_requantize=allow_requantize,
        prune_layers=list(args.prune_layers),
    )


def print_summary(plan, dst: str, dry_run: bool, split=None) -> None:
    from ggufsmith.converters.split import split_plan

    print(plan.type_summary(), file=sys.stderr)
    verb = "would write" if dry_run else "wrote"
    parts = split_plan(plan, dst, split) if split is not None and split.active else []
    if len(parts) > 1:
        dst = f"{len(parts)} parts {parts[0][0]} ... {parts[-1][0].name}"
    print(f"{verb} {dst}: {len(plan.tensors)} tensors, {plan.total_bytes / 2**20:.2f} MiB of tensor data, "
          f"{plan.bits_per_weight:.2f} bits per weight, {plan.arch_name}, {plan.outtype}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ggufsmith.quantize.presets import PRESETS

    parser.add_argument("src", metavar="IN.gguf", help="GGUF model (F32/F16/BF16, or quantized with --allow-requantize); "
                        "the first file of a split model")
    parser.add_argument("dst", metavar="OUT.gguf", help="GGUF file to write (written whole or not at all)")
    parser.add_argument("preset", metavar="PRESET", type=str.upper, choices=list(PRESETS),
                        help=f"llama-quantize's preset: {', '.join(PRESETS)}")
    add_quantize_options(parser)
    parser.add_argument("--allow-requantize", action="store_true", help="allow quantizing tensors that are already quantized")
    parser.add_argument("--keep-split", action="store_true", help="for a split input: one output file per input part, OUT-0000i-of-0000n.gguf")
    add_split_options(parser)
    add_metadata_option(parser, "the input's")
    parser.add_argument("--bigendian", action="store_true",
                        help="write a big-endian GGUF file (F32, F16 and BF16 presets only; the input is little-endian)")
    parser.add_argument("--dry-run", action="store_true", help="print each tensor's type and size and write nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors (and the --dry-run plan)")
    add_force_option(parser)
    add_threads_option(parser)


def run(args: argparse.Namespace) -> int:
    from ggufsmith.converters.requantize import quantize_gguf

    request = build_request(args.preset, args, allow_requantize=args.allow_requantize)
    plan = quantize_gguf(args.src, args.dst, request, dry_run=args.dry_run, progress=show_progress(args),
                         keep_split=args.keep_split, split=split_rule(args), force=args.force,
                         threads=args.threads or None, metadata=args.metadata,
                         bigendian=args.bigendian)
    if args.dry_run:
        print(plan.describe())
    if not args.quiet or args.dry_run:
        print_summary(plan, args.dst, args.dry_run, None if args.keep_split else split_rule(args))
    return 0
