#!/usr/bin/env python3
"""Quality of every quantization preset on the example model: size, bits per weight, KL divergence.

    python scripts/bench_presets.py [--model examples/tiny-llama] [--dir /tmp/ggufsmith-presets]
                                    [--no-imatrix] [--tokens 1024] [--wide]

Each preset is made by ggufsmith straight from the checkpoint (`ggufsmith.convert(..., outtype=
PRESET)`, what `ggufsmith convert --outtype PRESET` runs), then loaded in llama.cpp
(llama-cpp-python, logits for every position) and run over a fixed evaluation text. The table gives
the file size, bits per weight (tensor data bits / weights, as llama.cpp's model size / n_params)
and the mean over positions of KL(P_f32 || P_preset) of the next-token distributions, against the
F32 file's. With an importance matrix (default), a second KL column (not for Q8_0 and floats) uses one computed by
`ggufsmith imatrix` on calibration text of the same kind but another seed (Q2_K_S, IQ3_XXS, IQ3_XS
and the IQ2/IQ1 presets need one: their first KL column says so). The size and bits per weight are
those of the last file made (with the imatrix, if any: the types are the same but for IQ3_XXS's attn_v
and the imatrix-dependent ffn_down rules of Q4_0, Q5_0, IQ4_NL and IQ4_XS).
The evaluation text, the calibration text and the windows are fixed, so runs are comparable.

The example model's rows (128 and 352 values) are not multiples of 256, so every K-quant and 256-block
IQ type falls back to a legacy type or IQ4_NL there (as llama.cpp's quantizer does), and Q1_0 (blocks of
128, no fallback) is refused. `--wide` benchmarks instead the example model
rebuilt by scripts/make_example_model.py at hidden 256 / feed-forward 768 (same tokenizer, seed and
recipe), where the K-quants are used.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

PRESETS = ["IQ1_S", "IQ1_M", "TQ1_0", "Q1_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "TQ2_0", "Q2_0", "Q2_K", "Q2_K_S",
           "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_0", "Q4_1",
           "Q4_K_S", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16", "F32"]
# No importance matrix for these: floats, and Q8_0, which llama.cpp's quantizer makes without one
# (ggufsmith's q8_0 outtype is that same file). The presets that need one (Q2_K_S, IQ3_XXS, IQ3_XS,
# the IQ2/IQ1 presets) are found by trying: ggufsmith refuses them before writing anything.
NO_IMATRIX = {"F16", "BF16", "F32", "Q8_0"}
WINDOW = 256  # tokens per evaluation window, each from an empty context


def text_lines(seed: int, n: int) -> list[str]:
    """Lines like the example tokenizer's training text (scripts/make_example_model.py), from `seed`."""
    import make_example_model as m

    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 10 == 0:
            lines.append(rng.choice(m._CODE))
        elif i % 2:
            lines.append(m._made_up_sentence(rng))
        else:
            lines.append(f"{rng.choice(m._SUBJECTS)} {rng.choice(m._VERBS)} {rng.choice(m._OBJECTS)}{rng.choice(m._ENDINGS)}")
    return lines


def build_wide_example(example: Path, out: Path) -> Path:
    """The example model's recipe at K-quant-friendly widths, with the example's tokenizer files."""
    import shutil

    import make_example_model as m

    if not (out / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        for f in example.iterdir():
            if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
                shutil.copy(f, out / f.name)
        m.CONFIG = dict(m.CONFIG, hidden_size=256, intermediate_size=768)
        m.write_model(out)
    return out


def bits_per_weight(path: Path) -> float:
    from ggufsmith.gguf_writer.reader import GGUFReader  # gguf-py does not know every type (Q2_0)

    tensors = GGUFReader(path).tensors
    return 8 * sum(t.nbytes for t in tensors) / sum(t.n_elements for t in tensors)


def next_token_logprobs(path: Path, windows: list[list[int]]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=WINDOW, n_batch=WINDOW, logits_all=True, verbose=False,
                          n_threads=2, type_k=0, type_v=0)  # F32 KV cache: measure the weights only
    try:
        out = []
        for window in windows:
            llm.reset()
            llm.eval(window)
            logits = np.array(llm.scores[: len(window)], dtype=np.float64)
            logits -= logits.max(axis=-1, keepdims=True)
            out.append(logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True)))
        return np.concatenate(out)
    finally:
        llm.close()


def mean_kl(reference: np.ndarray, other: np.ndarray) -> float:
    return float((np.exp(reference) * (reference - other)).sum(axis=-1).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "examples" / "tiny-llama")
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-presets")
    parser.add_argument("--tokens", type=int, default=1024, help="evaluation tokens (whole windows of 256)")
    parser.add_argument("--no-imatrix", action="store_true", help="skip the importance-matrix column")
    parser.add_argument("--presets", nargs="*", default=PRESETS)
    parser.add_argument("--wide", action="store_true", help="the example model at hidden 256 / ff 768 (K-quants without fallback)")
    args = parser.parse_args()
    if args.wide:
        args.model = build_wide_example(args.model, args.dir / "tiny-llama-wide")

    import llama_cpp

    import ggufsmith
    from ggufsmith.errors import QuantizationError

    args.dir.mkdir(parents=True, exist_ok=True)
    timings = {}
    imatrix_path = None
    if not args.no_imatrix:
        from ggufsmith.converters.imatrix_compute import compute_imatrix, write_computed_imatrix

        calib = args.dir / "calibration.txt"
        calib.write_text("\n".join(text_lines(seed=101, n=1500)), encoding="utf-8")
        start = time.perf_counter()
        result = compute_imatrix(args.model, calib.read_text(encoding="utf-8"), chunk_size=512)
        imatrix_path = write_computed_imatrix(result, args.dir / "imatrix.gguf", str(calib))
        timings["imatrix"] = time.perf_counter() - start
        print(f"imatrix: {result.chunk_count} chunks of 512 tokens in {timings['imatrix']:.1f} s", file=sys.stderr)

    f32 = args.dir / "F32.gguf"
    ggufsmith.convert(args.model, f32, outtype="f32")
    vocab = llama_cpp.Llama(model_path=str(f32), vocab_only=True, verbose=False)
    eval_text = "\n".join(text_lines(seed=202, n=600))
    ids = vocab.tokenize(eval_text.encode("utf-8"), add_bos=False)
    bos = vocab.token_bos()
    vocab.close()
    n_windows = max(1, args.tokens // WINDOW)
    if len(ids) < n_windows * (WINDOW - 1):
        raise SystemExit(f"the evaluation text has only {len(ids)} tokens")
    windows = [[bos, *ids[i * (WINDOW - 1):(i + 1) * (WINDOW - 1)]] for i in range(n_windows)]
    reference = next_token_logprobs(f32, windows)

    rows = []
    for preset in args.presets:
        row = {"preset": preset}
        variants = [("", None)]
        if imatrix_path is not None and preset not in NO_IMATRIX:
            variants.append(("imatrix", imatrix_path))
        for suffix, imatrix in variants:
            out = args.dir / f"{preset}{'-' + suffix if suffix else ''}.gguf"
            start = time.perf_counter()
            if preset != "F32" or suffix:
                try:
                    ggufsmith.convert(args.model, out, outtype=preset.lower(), imatrix=imatrix)
                except QuantizationError as e:  # as llama-quantize: needs an imatrix, or rows its blocks do not fit
                    row[f"refused{suffix}"] = "needs imatrix" if "importance matrix" in str(e) else "refused"
                    print(f"{preset}{' with imatrix' if suffix else ''}: {e}", file=sys.stderr)
                    continue
            row[f"convert_s{suffix}"] = time.perf_counter() - start
            row[f"kl{suffix}"] = mean_kl(reference, next_token_logprobs(out, windows))
            row["size"] = out.stat().st_size  # with an imatrix where the preset needs one: same types
            row["bpw"] = bits_per_weight(out)
        rows.append(row)
        print(f"{preset}: done", file=sys.stderr)

    print(f"Example model {args.model.name}: {len(windows)} windows of {WINDOW} tokens, KL(F32 || preset) "
          "in nats per token, mean over positions.\n")
    header = "| preset | file size (bytes) | bits/weight | mean KL | mean KL with imatrix | convert (s) |"
    print(header)
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "size" not in r:
            print(f"| {r['preset']} | {r.get('refused', '-')} | | | | |")
            continue
        kl = f"{r['kl']:.4g}" if "kl" in r else r.get("refused", "-")
        kl_i = f"{r['klimatrix']:.4g}" if "klimatrix" in r else r.get("refusedimatrix", "-")
        seconds = r.get("convert_s", r.get("convert_simatrix", 0.0))
        print(f"| {r['preset']} | {r['size']:,} | {r['bpw']:.3f} | {kl} | {kl_i} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
