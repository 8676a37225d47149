"""Llama 3's tokenizer.model in a Meta-layout folder: a tiktoken BPE file (tokenizer/tiktoken_file.py).

The test makes a small tiktoken file (a byte-level BPE trained with the `tokenizers` library, its
tokens written in rank order in tiktoken's format) and a Meta folder of the Llama 3.1 layout
around it, then checks the converted vocabulary against two independent readings of that file:
  - transformers' converter of tiktoken files (TikTokenConverter, what its Llama 3 conversion
    script used): the same tokens, ids and merges;
  - tiktoken itself, with Meta's Llama 3 regex and special tokens: llama.cpp tokenizes text with
    the converted file to the ids tiktoken gives.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

import ggufsmith
from tests.damaged_inputs import REPO
from tests.meta_models import LAYOUTS, make_hf_llama, write_meta_folder

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("torch")

# Meta's Llama 3 pre-tokenizer regex (llama-models' tokenizer.py)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3.1's 256 special tokens, as Meta's tokenizer code lists them
NAMED = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
         "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
         "<|eot_id|>", "<|python_tag|>"]
SPECIALS = NAMED + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(NAMED))]
TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnew lines\r\n\n  and trailing   ",
    "Numbers 1234567 and 3.14159, contractions: it's, we'll, THEY'RE.",
    "Unicode: naïve café, Ελληνικά, 日本語のテキスト, emoji 🙂🚀",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
    "def convert(src, dst):\n    return {'a': [1, 2, 3]}  # code\n",
]


def _train_ranks(vocab_size: int) -> dict[bytes, int]:
    """A byte-level BPE trained on the repository's docs, as tiktoken's token -> rank table."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    texts = [p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md"))] + \
        [(REPO / "README.md").read_text(encoding="utf-8")]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab = tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(len(vocab)))
    return {bytes(byte_of[c] for c in token): rank for token, rank in vocab.items()}


@pytest.fixture(scope="session")
def llama3(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("llama3-tokenizer")
    ranks = _train_ranks(1200)
    tiktoken_file = root / "tokenizer.model"  # tiktoken's format (its dump_tiktoken_bpe needs blobfile)
    tiktoken_file.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank
                                       for token, rank in sorted(ranks.items(), key=lambda item: item[1])))
    params, config_changes, axis = LAYOUTS["llama3.1"]
    vocab = len(ranks) + len(SPECIALS)
    hf_dir = make_hf_llama(root / "hf", config_changes, vocab=vocab)
    meta = write_meta_folder(root / "Llama-3.1-Tiny", hf_dir, params | {"vocab_size": vocab}, axis)
    (meta / "tokenizer.model").write_bytes(tiktoken_file.read_bytes())
    gguf_path = root / "llama3.gguf"
    ggufsmith.convert(meta, gguf_path, "f16", strict_tokenizer=True)
    encoding = tiktoken.Encoding("tiny-llama3", pat_str=PATTERN, mergeable_ranks=ranks,
                                 special_tokens={name: len(ranks) + i for i, name in enumerate(SPECIALS)})
    return {"ranks": ranks, "file": tiktoken_file, "gguf": gguf_path, "encoding": encoding}


def _keys(path: Path) -> dict:
    import gguf

    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


def test_vocabulary_and_merges_are_transformers_reading_of_the_file(llama3):
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converted = TikTokenConverter(vocab_file=str(llama3["file"]), extra_special_tokens=SPECIALS).converted()
    model = json.loads(converted.to_str())["model"]
    by_id = {i: token for token, i in converted.get_vocab(with_added_tokens=True).items()}
    keys = _keys(llama3["gguf"])
    assert keys["tokenizer.ggml.tokens"] == [by_id[i] for i in range(len(by_id))]
    assert keys["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    assert (keys["tokenizer.ggml.model"], keys["tokenizer.ggml.pre"]) == ("gpt2", "llama-bpe")


def test_special_tokens(llama3):
    keys, n = _keys(llama3["gguf"]), len(llama3["ranks"])
    assert keys["tokenizer.ggml.bos_token_id"] == n  # <|begin_of_text|>
    assert keys["tokenizer.ggml.eos_token_id"] == n + 1  # <|end_of_text|>
    assert keys["tokenizer.ggml.eot_token_id"] == n + 9  # <|eot_id|>
    assert keys["tokenizer.ggml.add_bos_token"] is True
    control = 3
    assert all(t == control for t in keys["tokenizer.ggml.token_type"][n:])


def test_llamacpp_tokenizes_as_tiktoken(llama3):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(llama3["gguf"]), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            expected = llama3["encoding"].encode(text, allowed_special="all")
            assert llm.tokenize(text.encode(), add_bos=False, special=True) == expected, text
        assert llm.tokenize(b"Hi", add_bos=True, special=True)[0] == len(llama3["ranks"])
    finally:
        llm.close()
