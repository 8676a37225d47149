"""Our tokenizer keys against what llama.cpp's own convert_hf_to_gguf.py writes for the same directory.

The reference converter runs from the llama-cpp-python sdist (with its bundled gguf-py; fetched by
tests/llamacpp_reference.py) on a
tiny LlamaForCausalLM. It names BPE pre-tokenizers by hashing the tokens of a test string, which
knows only published models, so for our freshly trained BPE tokenizers it is told the name; every
other key is its own. The differences that remain are the deliberate ones listed below.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch

from ggufsmith.tokenizer import export_tokenizer
from tests.llamacpp_reference import run_reference_converter
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

pytestmark = pytest.mark.slow

# Keys only we write, and why:
#  eot/eom/fim_*: llama.cpp finds these by text at load time; we write the same ids explicitly.
#  unknown_token_id: the reference looks special tokens up in tokenizer.json only, absent here.
#  add_space_prefix/remove_extra_whitespaces: SentencePiece's normalizer spec, written explicitly.
#  add_eos_token: written whenever known (the reference skips it for some post-processors).
ONLY_OURS = {
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id",
    "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
    "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces", "tokenizer.ggml.add_eos_token",
}
# add_sep_token: the reference derives it from TemplateProcessing's pair template; llama.cpp's
# default for BPE (false) is what it writes there.
ONLY_THEIRS = {"tokenizer.ggml.add_sep_token"}


def _tiny_model(model_dir: Path, vocab_size: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)


def _reference_keys(model_dir: Path, out: Path, pre: str | None) -> dict:
    run_reference_converter(model_dir, out, "f32", pre=pre, timeout=300)
    reader = gguf.GGUFReader(out)
    return {f.name: f.contents() for f in reader.fields.values() if f.name.startswith("tokenizer.")}


@pytest.mark.parametrize("kind", ["sentencepiece", "llama3", "qwen2"])
def test_keys_match_llama_cpp_converter(tmp_path, kind):
    model_dir = tmp_path / kind
    if kind == "sentencepiece":
        train_sentencepiece(model_dir)
    else:
        train_bpe(model_dir, kind)
    n_tokens = len(export_tokenizer(model_dir).get("tokenizer.ggml.tokens"))
    _tiny_model(model_dir, n_tokens + 3)  # padded: the model has more rows than the tokenizer
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    ours = {k: v.plain() for k, v in export_tokenizer(model_dir, vocab_size=vocab_size).items()}
    theirs = _reference_keys(model_dir, tmp_path / "reference.gguf", None if kind == "sentencepiece" else ours["tokenizer.ggml.pre"])

    assert set(ours) - set(theirs) <= ONLY_OURS
    assert set(theirs) - set(ours) <= ONLY_THEIRS
    for key in set(ours) & set(theirs):
        if key == "tokenizer.ggml.token_type" and kind == "sentencepiece":
            continue  # below
        if key == "tokenizer.ggml.scores":
            assert ours[key] == pytest.approx(theirs[key]), key
        else:
            assert ours[key] == theirs[key], key
    if kind == "sentencepiece":
        # SentencePiece user-defined symbols: USER_DEFINED for us (llama.cpp then keeps them whole,
        # as sentencepiece does), NORMAL for the reference. Every other type agrees.
        differing = [t for t, a, b in zip(ours["tokenizer.ggml.tokens"], ours["tokenizer.ggml.token_type"],
                                          theirs["tokenizer.ggml.token_type"]) if a != b]
        assert differing == ["<tool>", "myword"]
