"""`ggufsmith imatrix`: compute an importance matrix from calibration text, in llama.cpp's format."""

from __future__ import annotations

import argparse
import sys
import time

from ggufsmith.converters.imatrix_compute import DEFAULT_CHUNK_SIZE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC_DIR", help="Hugging Face model folder (config.json, weights, tokenizer)")
    parser.add_argument("text", metavar="CALIB.txt", help="calibration text file (UTF-8)")
    parser.add_argument("dst", metavar="IMATRIX.gguf", help="importance matrix to write (llama.cpp's GGUF imatrix format)")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                        help=f"tokens per chunk, each evaluated from an empty context (default: {DEFAULT_CHUNK_SIZE}, as llama-imatrix)")
    parser.add_argument("--max-chunks", type=int, default=None, metavar="N", help="use at most N chunks (default: all)")
    parser.add_argument("--process-output", action="store_true", help="collect output.weight too (llama-imatrix --process-output)")
    parser.add_argument("--arch", metavar="NAME", help="architecture plugin for the tensor names (default: from config.json)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but warnings and errors")
    from ggufsmith.cli.quantize import add_force_option, add_threads_option

    add_force_option(parser)
    add_threads_option(parser)


def run(args: argparse.Namespace) -> int:
    from ggufsmith.cli.quantize import show_progress
    from ggufsmith.converters.imatrix_compute import compute_imatrix, write_computed_imatrix
    from ggufsmith.gguf_writer.output import check_target, folder_files

    inputs = folder_files(args.src) + [args.text]
    check_target(args.dst, inputs, force=args.force)  # before the model runs for minutes
    with open(args.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if show_progress(args):
            print(f"\rchunk {done}/{total} ({time.perf_counter() - start:.1f} s)", end="" if done < total else "\n",
                  file=sys.stderr, flush=True)

    result = compute_imatrix(args.src, text, chunk_size=args.chunk_size, max_chunks=args.max_chunks,
                             process_output=args.process_output, arch=args.arch, progress=progress,
                             threads=args.threads or None)
    write_computed_imatrix(result, args.dst, args.text, inputs=inputs, force=args.force)
    for name in result.not_collected:
        print(f"ggufsmith: warning: no activations reached {name}; it has no entry", file=sys.stderr)
    for name, (_, counts) in result.entries().items():
        if (counts == 0).any():
            print(f"ggufsmith: warning: {name}: {int((counts == 0).sum())} of {counts.size} experts got no tokens "
                  "(llama-quantize then weighs them uniformly)", file=sys.stderr)
    if not args.quiet:
        print(f"wrote {args.dst}: {len(result.entries())} matrices, {result.chunk_count} chunks of {result.chunk_size} tokens "
              f"(text: {result.n_tokens} tokens)", file=sys.stderr)
    return 0
