"""`ggufsmith convert`: a Hugging Face model folder to a GGUF file."""

from __future__ import annotations

import argparse
import sys

from ggufsmith.errors import ConversionError

from ggufsmith.converters.plan import OUTTYPES, all_outtypes, is_preset_outtype, preset_outtypes


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
    parser.add_argument("src", metavar="SRC", help="Hugging Face model folder (config.json and weights), or a repository "
                        "id (Org/Model) found in the local Hugging Face cache (see --download)")
    parser.add_argument("dst", metavar="OUT", help="GGUF file to write (written whole or not at all), or an existing "
                        "folder: the file is then named by the GGUF naming convention (Name-1.1B-Chat-v1.0-F16.gguf)")
    parser.add_argument("--outtype", default="f16", choices=all_outtypes(), type=str.lower, metavar="TYPE",
                        help=f"{', '.join(OUTTYPES)}: type of the 2-D weights, norms and biases stay F32 "
                             "(f32/f16/bf16/q8_0 as convert_hf_to_gguf.py writes them); auto: bf16 or f16, as the "
                             "checkpoint's weights are stored (as convert_hf_to_gguf.py decides); or a llama-quantize "
                             f"preset ({', '.join(preset_outtypes())}): the file llama-quantize makes from the "
                             "F32 conversion, without writing it (default: f16)")
    parser.add_argument("--vocab-only", action="store_true",
                        help="write the tokenizer and the metadata, no tensors (as convert_hf_to_gguf.py --vocab-only)")
    from ggufsmith.cli.quantize import add_force_option, add_metadata_option, add_quantize_options, add_split_options, \
        add_threads_option

    add_metadata_option(parser, "those found in the model card and config")
    parser.add_argument("--bigendian", action="store_true",
                        help="write a big-endian GGUF file, for big-endian machines (as convert_hf_to_gguf.py "
                             "--bigendian; f32, f16, bf16 and auto outtypes only)")
    parser.add_argument("--download", action="store_true",
                        help="when SRC is a repository id not in the local Hugging Face cache, download it "
                             "(the weights, config and tokenizer files) into the cache first")
    parser.add_argument("--arch", metavar="NAME", help="architecture plugin to use (default: from config.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (source, GGUF name, shape, type, bytes) and write nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")

    add_split_options(parser)
    add_force_option(parser)
    add_threads_option(parser)

    group = parser.add_argument_group("preset options (with --outtype PRESET; as llama-quantize's)")
    add_quantize_options(group)
    group.add_argument("--allow-requantize", action="store_true",
                       help="quantize tensors the checkpoint stores already quantized (gpt-oss' MXFP4 experts) to "
                            "the preset's type, as llama-quantize --allow-requantize does to the F32 conversion "
                            "(without it a preset that changes their type is refused; MXFP4_MOE keeps them)")
    parser.add_argument("--model-name", metavar="NAME", help="general.name to write (default: from the model card/config/folder)")
    parser.add_argument("--strict-tokenizer", action="store_true",
                        help="refuse a tokenizer that llama.cpp would apply differently from the Hugging Face one on "
                             "some text (a SentencePiece nmt_nfkc normalization, added tokens that strip spaces, ...); "
                             "by default such a tokenizer converts with one warning")


def run(args: argparse.Namespace) -> int:
    from ggufsmith.cli.quantize import build_request, print_summary, show_progress, split_rule
    from ggufsmith.converters.pipeline import convert

    request = None
    if is_preset_outtype(args.outtype):
        request = build_request(args.outtype, args, allow_requantize=args.allow_requantize)
    elif _preset_options_used(args):
        raise ConversionError(f"--imatrix, --pure, --tensor-type, --prune-layers ... apply to preset outtypes (q4_k_m, ...), not to {args.outtype}")
    plan = convert(args.src, args.dst, args.outtype, args.arch, dry_run=args.dry_run, force=args.force,
                   progress=show_progress(args), model_name=args.model_name, quantize_request=request,
                   strict_tokenizer=args.strict_tokenizer, threads=args.threads or None, split=split_rule(args),
                   vocab_only=args.vocab_only, metadata=args.metadata, download=args.download,
                   bigendian=args.bigendian)
    if args.dry_run:
        print(plan.describe())
        print_summary(plan, plan.output, dry_run=True, split=split_rule(args))
    elif not args.quiet:
        for t in plan.fallbacks:
            print(f"ggufsmith: {t.name}: {t.note}", file=sys.stderr)
        if args.verbose:
            print(plan.describe(), file=sys.stderr)
        print_summary(plan, plan.output, dry_run=False, split=split_rule(args))
    if not args.quiet or args.dry_run:
        for path in plan.adapter_files:
            print(f"{'would write' if args.dry_run else 'wrote'} {path}: a task LoRA adapter (llama.cpp --lora)")
    return 0


def _preset_options_used(args: argparse.Namespace) -> bool:
    return bool(args.imatrix or args.include_weights or args.exclude_weights or args.pure or args.output_tensor_type
                or args.token_embedding_type or args.leave_output_tensor or args.tensor_type or args.override_kv
                or args.prune_layers or args.allow_requantize)
