#!/usr/bin/env python3
"""Peak memory converting a Llama 4 checkpoint whose expert stacks are 1 GiB, against llama.cpp's
convert_hf_to_gguf.py on the same folder.

    python scripts/bench_llama4_memory.py [--dir /tmp/ggufsmith-bench-llama4] [--outtypes f16,q8_0]

Generates (once, cached in --dir) one Llama 4 MoE block with random bf16 weights: Scout's 16
experts of 8192, stored as Llama 4 stores them, for x @ W, at hidden 2048 (Scout's is 5120) to
keep the run short: gate_up_proj (16, 2048, 16384) is 1 GiB, down_proj (16, 8192, 2048) 0.5 GiB.
Both are transposed on the way to the GGUF (ggufsmith: a band of columns at a time, see
LazyTensor.swap_last_axes). Each conversion runs in a
fresh child whose peak resident memory is measured (scripts/bench_convert.py's launcher); prints
the table and the ratios ggufsmith / reference. Target (issue 15): ggufsmith under 400 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import REPO, benchmark_env, measure, random_bf16_pool, reference_script, write_safetensors  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.decoder_reference import _RUNNER  # noqa: E402

HIDDEN, EXPERTS, FF, VOCAB = 2048, 16, 8192, 512
CONFIG = {
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": HIDDEN,
    "intermediate_size": FF, "intermediate_size_mlp": 2 * FF, "num_hidden_layers": 1, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": EXPERTS, "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1, "vocab_size": VOCAB, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "attention_chunk_size": 8192, "use_qk_norm": True, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
}


def tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    p, kv = "model.layers.0.", 8 * 128
    return [
        ("model.embed_tokens.weight", (VOCAB, HIDDEN)),
        (p + "input_layernorm.weight", (HIDDEN,)),
        (p + "self_attn.q_proj.weight", (16 * 128, HIDDEN)),
        (p + "self_attn.k_proj.weight", (kv, HIDDEN)),
        (p + "self_attn.v_proj.weight", (kv, HIDDEN)),
        (p + "self_attn.o_proj.weight", (HIDDEN, 16 * 128)),
        (p + "post_attention_layernorm.weight", (HIDDEN,)),
        (p + "feed_forward.router.weight", (EXPERTS, HIDDEN)),
        (p + "feed_forward.experts.gate_up_proj", (EXPERTS, HIDDEN, 2 * FF)),
        (p + "feed_forward.experts.down_proj", (EXPERTS, FF, HIDDEN)),
        (p + "feed_forward.shared_expert.gate_proj.weight", (FF, HIDDEN)),
        (p + "feed_forward.shared_expert.up_proj.weight", (FF, HIDDEN)),
        (p + "feed_forward.shared_expert.down_proj.weight", (HIDDEN, FF)),
        ("model.norm.weight", (HIDDEN,)),
        ("lm_head.weight", (VOCAB, HIDDEN)),
    ]


def write_tokenizer(model_dir: Path) -> None:
    """A byte-level BPE tokenizer.json (the 256 bytes and a few merges), saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|begin_of_text|>", "<|eot|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                            eos_token="<|eot|>").save_pretrained(model_dir)


def generate_checkpoint(model_dir: Path) -> Path:
    if (model_dir / ".complete").is_file():
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    pool, rng = random_bf16_pool(1 << 26), np.random.default_rng(1)
    ones = np.full(HIDDEN, 0x3F80, dtype=np.uint16)  # bf16 1.0
    tensors = []
    for name, shape in tensor_shapes():
        n = int(np.prod(shape))
        if len(shape) == 1:
            data = ones[:n]
        else:
            data = pool[(start := int(rng.integers(0, pool.size - n))):start + n] if n < pool.size else np.resize(pool, n)
        tensors.append((name, shape, data))
    write_safetensors(model_dir / "model.safetensors", tensors)
    (model_dir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    write_tokenizer(model_dir)
    (model_dir / ".complete").write_text("ok")
    return model_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufsmith-bench-llama4")
    parser.add_argument("--outtypes", default="f16,q8_0")
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    model_dir = generate_checkpoint(args.dir / "model")
    env = benchmark_env()
    rows = []
    for outtype in args.outtypes.split(","):
        out = args.dir / f"ours-{outtype}.gguf"
        ours = measure([sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(out), "--outtype", outtype,
                        "--quiet"], env | {"PYTHONPATH": str(REPO)}, REPO)
        out.unlink()
        theirs = None
        if not args.skip_reference:
            ref = reference_script()
            out = args.dir / f"reference-{outtype}.gguf"
            # told the pre-tokenizer's name, which it finds by hashing only published tokenizers
            theirs = measure([sys.executable, "-c", _RUNNER, str(ref), str(model_dir), "--outfile", str(out),
                              "--outtype", outtype], env | {"PYTHONPATH": str(ref / "gguf-py"), "FORCE_PRE": "gpt-2"}, ref)
            out.unlink()
        rows.append((outtype, ours, theirs))
    print(f"{'outtype':8} {'ours s':>8} {'ours MiB':>9} {'ref s':>8} {'ref MiB':>9} {'RSS ratio':>9}")
    for outtype, (wall, rss, _), theirs in rows:
        ref = f"{theirs[0]:8.1f} {theirs[1]:9.0f} {rss / theirs[1]:9.2f}" if theirs else ""
        print(f"{outtype:8} {wall:8.1f} {rss:9.0f} {ref}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
