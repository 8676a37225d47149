"""Damaged-input catalogue, slow tokenizer files: a checkpoint whose tokenizer is vocab.json +
merges.txt (no tokenizer.json). Each damage must fail before anything is written, with one line
naming the file (contract: tests/damaged_inputs.py). The last test converts the undamaged folder
and checks llama.cpp tokenizes with the result as transformers does with the folder.

The folder is the example model (a llama of vocab 2000) with its SentencePiece tokenizer replaced
by a GPT-2-style BPE's slow files (tests/test_tokenizer_slow_files.py writes them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, copy_example, run_cli
from tests.test_tokenizer_slow_files import write_slow_gpt2_folder


def _slow_tokenizer_model(tmp_path: Path) -> Path:
    model = copy_example(tmp_path)
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink()
    slow = write_slow_gpt2_folder(tmp_path / "slow")
    for path in slow.iterdir():
        path.rename(model / path.name)
    return model


def _append_line(name: str, line: str) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        with open(model / name, "a", encoding="utf-8") as f:
            f.write(line)
    return damage


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda model: (model / name).write_text(text, encoding="utf-8")


def _set_config(key: str, value) -> Callable[[Path], None]:
    def damage(model: Path) -> None:
        path = model / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config[key] = value
        path.write_text(json.dumps(config))
    return damage


DAMAGES = {
    "merges_line_of_three_tokens": (_append_line("merges.txt", "a b c\n"), "merges.txt"),
    "merges_not_utf8": (lambda m: (m / "merges.txt").write_bytes(b"#version: 0.2\n\xff\xfe x\n"), "merges.txt"),
    "vocab_json_is_a_list": (_write("vocab.json", "[1, 2]"), "vocab.json"),
    "vocab_json_truncated": (_write("vocab.json", '{"a": 1,'), "vocab.json"),
    "vocab_id_negative": (_write("vocab.json", '{"a": -1}'), "vocab.json"),
    "added_tokens_json_is_a_list": (_write("added_tokens.json", '["x"]'), "added_tokens.json"),
    "tokenizer_class_not_gpt2_style": (_set_config("tokenizer_class", "RobertaTokenizer"), "tokenizer_config.json"),
    "add_prefix_space": (_set_config("add_prefix_space", True), "add_prefix_space"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_slow_tokenizer_files(tmp_path, damage):
    model = _slow_tokenizer_model(tmp_path)
    edit, culprit = DAMAGES[damage]
    edit(model)
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", model, target, "--outtype", "f16")
    assert_clean_failure(proc, culprit, target)


def test_the_undamaged_slow_tokenizer_folder_converts(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    transformers = pytest.importorskip("transformers")
    from tests.tokenizer_helpers import CHECK_TEXT

    model = _slow_tokenizer_model(tmp_path)
    assert not (model / "tokenizer.json").exists()
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", model, target, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    llm = llama_cpp.Llama(model_path=str(target), vocab_only=True, verbose=False)
    hf = transformers.AutoTokenizer.from_pretrained(model)
    assert llm.tokenize(CHECK_TEXT.encode(), add_bos=False, special=False) == hf.encode(CHECK_TEXT, add_special_tokens=False)
