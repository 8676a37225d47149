"""`ggufsmith convert-lora`: a PEFT LoRA adapter folder to a GGUF adapter file for llama.cpp."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ggufsmith.cli.quantize import add_force_option, add_threads_option
    from ggufsmith.converters.lora import LORA_OUTTYPES

    parser.add_argument("src", metavar="ADAPTER_DIR",
                        help="PEFT adapter folder (adapter_config.json and adapter_model.safetensors or .bin)")
    parser.add_argument("dst", metavar="OUT", nargs="?",
                        help="GGUF adapter file to write (written whole or not at all), or an existing folder; "
                             "default: the adapter's folder. In a folder the file is named as convert_lora_to_gguf.py "
                             "names it (Name-F16-LoRA.gguf); {ftype} in a file name is replaced by the type")
    parser.set_defaults(optional_last="dst")  # OUT may come after the options too (cli/__init__.py)
    parser.add_argument("--base", metavar="BASE",
                        help="the base model's folder or repository id (only its config.json is read); default: "
                             "the adapter's base_model_name_or_path, a folder or a repository id in the local "
                             "Hugging Face cache")
    parser.add_argument("--download", action="store_true",
                        help="when the base model is a repository id not in the local Hugging Face cache, download it")
    parser.add_argument("--outtype", default="f16", choices=LORA_OUTTYPES, type=str.lower, metavar="TYPE",
                        help=f"{', '.join(LORA_OUTTYPES)}: type of lora_a and lora_b (auto: the adapter's 16-bit "
                             "type, else f16; default: f16)")
    parser.add_argument("--model-name", metavar="NAME", help="general.name to write (default: from the adapter's "
                        "model card or folder)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (source, GGUF name, shape, type, bytes) and write nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    add_force_option(parser)
    add_threads_option(parser)


def run(args: argparse.Namespace) -> int:
    from ggufsmith.cli.quantize import print_summary, show_progress
    from ggufsmith.converters.lora import convert_lora

    plan = convert_lora(args.src, args.dst, args.outtype, args.base, dry_run=args.dry_run, force=args.force,
                        progress=show_progress(args), threads=args.threads or None, model_name=args.model_name,
                        download=args.download)
    if args.dry_run:
        print(plan.describe())
        print_summary(plan, plan.output, dry_run=True)
    elif not args.quiet:
        if args.verbose:
            print(plan.describe(), file=sys.stderr)
        print_summary(plan, plan.output, dry_run=False)
    return 0
