"""Damaged-input catalogue: tokenizer files. Each entry breaks one thing in a copy of the example
model and asserts the contract of tests/damaged_inputs.py (`ggufsmith convert` exits non-zero with
one line naming the culprit, writes nothing, leaves no temporary file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, copy_example, run_cli


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value), encoding="utf-8")


def _edit_json(path: Path, **fields) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(fields)
    _write_json(path, data)


def _edit_sentencepiece(path: Path, edit) -> None:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
    edit(proto)
    path.write_bytes(proto.SerializeToString())


def _misspell_first_byte_piece(proto) -> None:
    piece = next(p for p in proto.pieces if p.type == 6)  # BYTE
    piece.piece = "<0xZZ>"


# name -> (damage done to the model folder, text the error line must contain)
DAMAGE = {
    "tokenizer_json_is_an_array": (
        lambda d: _write_json(d / "tokenizer.json", [1, 2]), "tokenizer.json: expected a JSON object"),
    "tokenizer_json_model_is_a_string": (
        lambda d: _write_json(d / "tokenizer.json", {"model": "BPE"}), "tokenizer.json: model must be a JSON object"),
    "tokenizer_json_vocab_is_an_array": (
        lambda d: _write_json(d / "tokenizer.json", {"model": {"type": "BPE", "vocab": ["a", "b"]}}),
        "tokenizer.json: model.vocab must be a JSON object"),
    "tokenizer_json_token_id_is_text": (
        lambda d: _write_json(d / "tokenizer.json", {"model": {"type": "BPE", "vocab": {"a": "one"}}}),
        "model.vocab['a'] is 'one', not a token id"),
    "tokenizer_json_added_tokens_is_an_object": (
        lambda d: _write_json(d / "tokenizer.json", {"added_tokens": {"<x>": 5}}),
        "tokenizer.json: added_tokens must be a JSON array"),
    "tokenizer_json_pre_tokenizer_is_a_string": (
        lambda d: _write_json(d / "tokenizer.json", {"pre_tokenizer": "ByteLevel"}),
        "tokenizer.json: pre_tokenizer must be a JSON object"),
    "tokenizer_json_normalizer_step_is_a_number": (
        lambda d: _write_json(d / "tokenizer.json", {"normalizer": {"type": "Sequence", "normalizers": [7]}}),
        "tokenizer.json: normalizer.normalizers[0] must be a JSON object"),
    "tokenizer_json_nested_100000_deep": (
        lambda d: (d / "tokenizer.json").write_text("[" * 100_000 + "]" * 100_000),
        "tokenizer.json: JSON nested too deeply"),
    "tokenizer_model_truncated": (
        lambda d: (d / "tokenizer.model").write_bytes((d / "tokenizer.model").read_bytes()[:1001]),
        "tokenizer.model: not a SentencePiece model"),
    "tokenizer_model_byte_piece_misspelled": (
        lambda d: _edit_sentencepiece(d / "tokenizer.model", _misspell_first_byte_piece), "'<0xZZ>', not <0xXX>"),
    "token_text_at_two_ids": (
        lambda d: _write_json(d / "added_tokens.json", {"<s>": 5}), "occur at more than one id ('<s>' at ids 1, 5)"),
    "tokenizer_larger_than_vocab_size": (
        lambda d: _write_json(d / "added_tokens.json", {"<extra>": 2000}),
        "the tokenizer has 2001 tokens but the model's vocab_size is 2000"),
    "added_tokens_json_id_is_text": (
        lambda d: _write_json(d / "added_tokens.json", {"<x>": "five"}), "added_tokens.json: '<x>' is 'five'"),
    "added_tokens_json_id_is_huge": (
        lambda d: _write_json(d / "added_tokens.json", {"<x>": 10**12}), "added_tokens.json: '<x>' is 1000000000000"),
    "added_tokens_decoder_entry_is_a_string": (
        lambda d: _edit_json(d / "tokenizer_config.json", added_tokens_decoder={"5": "<x>"}),
        "tokenizer_config.json: added_tokens_decoder['5'] must be a JSON object"),
    "add_bos_token_is_a_string": (
        lambda d: _edit_json(d / "tokenizer_config.json", add_bos_token="yes"),
        "tokenizer_config.json: add_bos_token must be a JSON boolean"),
    "special_token_is_a_number": (
        lambda d: _edit_json(d / "special_tokens_map.json", bos_token=1),
        "special_tokens_map.json: bos_token must be a JSON string or object"),
    "chat_template_is_a_number": (
        lambda d: _edit_json(d / "tokenizer_config.json", chat_template=42),
        "tokenizer_config.json: chat_template must be a string"),
    "chat_template_jinja_not_utf8": (
        lambda d: (d / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff\xfe"),
        "chat_template.jinja: cannot read chat template"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_tokenizer_fails_cleanly(tmp_path, damage):
    model_dir = copy_example(tmp_path)
    break_it, culprit = DAMAGE[damage]
    break_it(model_dir)
    target = tmp_path / "out" / "model.gguf"
    target.parent.mkdir()
    proc = run_cli("convert", model_dir, target, "--quiet")
    assert_clean_failure(proc, culprit, target)
