"""Byte-level BPE folders that ship only the slow tokenizer files (vocab.json + merges.txt with
added_tokens.json, special_tokens_map.json, tokenizer_config.json), as many GPT-2, GPT-J, CodeGen,
RoBERTa and Whisper folders are published.

The folder is written as transformers 4 saved a GPT2Tokenizer (transformers 5 only writes
tokenizer.json): the vocabulary and merges of a BPE trained here, and the config files. The oracle is
transformers loading that folder (it builds its tokenizer from vocab.json + merges.txt); llama.cpp
loads our export.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.errors import TokenizerError
from ggufsmith.tokenizer import detect_kind, export_tokenizer
from tests.tokenizer_helpers import CHECK_TEXT, load_llama_vocab, training_text, write_vocab_gguf

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

EOS = "<|endoftext|>"
EXTRA_SPECIAL = "<|im_start|>"  # in added_tokens.json and named special by special_tokens_map.json
USER_WORD = "myword"  # in added_tokens.json only: a non-special added token


def write_slow_gpt2_folder(model_dir: Path, tokenizer_class: str = "GPT2Tokenizer", **config) -> Path:
    """vocab.json + merges.txt of a trained byte-level BPE, and the config files beside them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer)
    model_dir.mkdir(parents=True)
    tokenizer.model.save(str(model_dir))  # vocab.json and merges.txt ("#version: 0.2" header)
    assert (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file()
    n_vocab = tokenizer.get_vocab_size()
    added = {EXTRA_SPECIAL: n_vocab, USER_WORD: n_vocab + 1}
    (model_dir / "added_tokens.json").write_text(json.dumps(added))
    (model_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "additional_special_tokens": [EXTRA_SPECIAL]}))
    tokenizer_config = {"tokenizer_class": tokenizer_class, "add_prefix_space": False, "bos_token": EOS,
                        "eos_token": EOS, "unk_token": EOS, "model_max_length": 1024, "errors": "replace"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | config))
    return model_dir


@pytest.fixture(scope="module")
def slow_gpt2(tmp_path_factory):
    model_dir = write_slow_gpt2_folder(tmp_path_factory.mktemp("slow") / "gpt2")
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, model_dir.parent / "vocab.gguf", arch="gpt2"))
    return model_dir, hf, llm, metadata


def _tokenize(llm, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def test_the_folder_has_no_tokenizer_json_and_transformers_reads_it(slow_gpt2):
    model_dir, hf, _, _ = slow_gpt2
    assert not (model_dir / "tokenizer.json").exists()
    assert type(hf).__name__ == "GPT2Tokenizer"
    assert hf.convert_tokens_to_ids(EXTRA_SPECIAL) == hf.vocab_size  # added_tokens.json was read
    assert detect_kind(model_dir) == "gpt2"


def test_slow_files_tokenize_like_transformers(slow_gpt2):
    _, hf, llm, metadata = slow_gpt2
    assert metadata.get("tokenizer.ggml.model") == "gpt2"
    assert metadata.get("tokenizer.ggml.pre") == "gpt-2"
    tokens = _tokenize(llm, CHECK_TEXT)
    assert tokens == hf.encode(CHECK_TEXT, add_special_tokens=False)
    assert llm.detokenize(tokens).decode("utf-8") == CHECK_TEXT


def test_slow_files_added_and_special_tokens_like_transformers(slow_gpt2):
    _, hf, llm, metadata = slow_gpt2
    text = f"{EXTRA_SPECIAL}user Grüße {USER_WORD}s 你好{EOS}\nmore{USER_WORD}"
    ids = hf.encode(text, add_special_tokens=False)
    assert hf.convert_tokens_to_ids(USER_WORD) in ids and hf.convert_tokens_to_ids(EXTRA_SPECIAL) in ids
    assert _tokenize(llm, text, special=True) == ids
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")  # GPT-2 adds no bos
    assert metadata.get("tokenizer.ggml.eos_token_id") == hf.eos_token_id
    assert metadata.get("tokenizer.ggml.bos_token_id") == hf.bos_token_id
    assert llama_cpp.llama_vocab_is_eog(llm._model.vocab, hf.eos_token_id)


@pytest.mark.parametrize("tokenizer_class", ["CodeGenTokenizer", "WhisperTokenizer"])
def test_other_gpt2_style_classes_tokenize_like_transformers(tmp_path, tokenizer_class):
    model_dir = write_slow_gpt2_folder(tmp_path / "tok", tokenizer_class=tokenizer_class)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert type(hf).__name__ == tokenizer_class
    llm = load_llama_vocab(write_vocab_gguf(export_tokenizer(model_dir), tmp_path / "v.gguf", arch="gpt2"))
    text = f"{CHECK_TEXT}{EOS}{USER_WORD}"
    assert _tokenize(llm, text, special=True) == hf.encode(text, add_special_tokens=False)


def test_add_bos_token_flag_is_followed_like_transformers(tmp_path):
    model_dir = write_slow_gpt2_folder(tmp_path / "bos", add_bos_token=True)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(export_tokenizer(model_dir), tmp_path / "v.gguf", arch="gpt2"))
    expected = hf.encode("Hello world")
    assert expected[0] == hf.bos_token_id
    assert _tokenize(llm, "Hello world", add_bos=True) == expected


def test_add_prefix_space_is_refused_naming_the_folder(tmp_path):
    model_dir = write_slow_gpt2_folder(tmp_path / "prefix", add_prefix_space=True)
    with pytest.raises(TokenizerError, match="add_prefix_space"):
        export_tokenizer(model_dir)


def test_unknown_tokenizer_class_is_refused_naming_tokenizer_config(tmp_path):
    model_dir = write_slow_gpt2_folder(tmp_path / "other", tokenizer_class="RobertaTokenizer")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json.*RobertaTokenizer"):
        export_tokenizer(model_dir)


def test_damaged_merges_line_is_refused_naming_the_line(tmp_path):
    model_dir = write_slow_gpt2_folder(tmp_path / "bad")
    with open(model_dir / "merges.txt", "a", encoding="utf-8") as f:
        f.write("a b c\n")
    with pytest.raises(TokenizerError, match=r"merges\.txt: line \d+"):
        export_tokenizer(model_dir)
