"""BERT folders llama.cpp cannot run as sentence-transformers / transformers do, and broken
sentence-transformers or WordPiece files: each is refused in one line naming the file or key
(contract: tests/damaged_inputs.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.bert_models import (
    build_bert, train_roberta_bpe, train_wordpiece, train_xlmr_unigram, write_sentence_transformers_modules,
    write_vocab_txt_only,
)
from tests.damaged_inputs import assert_convert_refused, edit_json

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bert_damaged")
    train_wordpiece(root / "json", lowercase=True, vocab_size=300)
    build_bert(root / "json", hidden_size=32)
    write_sentence_transformers_modules(root / "json", "mean", hidden_size=32)
    write_vocab_txt_only(root / "json", root / "vocab-txt", lowercase=True)
    for name in ("config.json", "model.safetensors", "modules.json", "1_Pooling"):
        copy = shutil.copytree if (root / "json" / name).is_dir() else shutil.copy
        copy(root / "json" / name, root / "vocab-txt" / name)
    train_roberta_bpe(root / "roberta", vocab_size=300)
    build_bert(root / "roberta", roberta=True, hidden_size=32)
    train_xlmr_unigram(root / "xlmr", vocab_size=400)
    build_bert(root / "xlmr", xlmr=True, hidden_size=32)
    return {"json": root / "json", "vocab-txt": root / "vocab-txt", "roberta": root / "roberta", "xlmr": root / "xlmr"}


def _edit_json(relative: str, edit) -> callable:
    return lambda model_dir: edit_json(model_dir / relative, edit)


def _config(**changes):
    return _edit_json("config.json", lambda c: c | changes)


def _pooling(**changes):
    return _edit_json("1_Pooling/config.json", lambda c: c | changes)


def _add_module(kind: str, path: str):
    return _edit_json("modules.json", lambda m: m + [{"idx": len(m), "name": str(len(m)), "path": path,
                                                        "type": f"sentence_transformers.models.{kind}"}])


# (folder, damage, culprit named in the error)
CASES = {
    "relu-activation": ("json", _config(hidden_act="relu"), "hidden_act"),
    "relative-position-embeddings": ("json", _config(position_embedding_type="relative_key"), "position_embedding_type"),
    "decoder": ("json", _config(is_decoder=True), "is_decoder"),
    "no-token-types": ("json", _config(type_vocab_size=0), "type_vocab_size"),
    "token-types-not-the-tensor's": ("json", _config(type_vocab_size=3), "n_token_types = 3 from type_vocab_size"),
    "max-pooling": ("json", _pooling(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True), "pooling_mode_max_tokens"),
    "mean-and-max-pooling": ("json", _pooling(pooling_mode_max_tokens=True), "1_Pooling/config.json"),
    "pooling-flag-not-bool": ("json", _pooling(pooling_mode_mean_tokens="yes"), "pooling_mode_mean_tokens"),
    "unknown-pooling-mode-name": ("json", _pooling(pooling_mode_mean_tokens=False, pooling_mode="weightedmean"),
                                  "pooling_mode"),
    "pooling-config-missing": ("json", lambda d: shutil.rmtree(d / "1_Pooling"), "1_Pooling"),
    "pooling-path-outside-folder": ("json", _edit_json("modules.json", lambda m: [
        {**e, "path": "../elsewhere"} if e["type"].endswith("Pooling") else e for e in m]), "outside the model folder"),
    "modules-not-a-list": ("json", _edit_json("modules.json", lambda m: {"modules": m}), "modules.json"),
    "dense-after-pooling": ("json", _add_module("Dense", "3_Dense"), "Dense"),
    "other-continuation-prefix": ("json", _edit_json("tokenizer.json", lambda t: t | {
        "model": t["model"] | {"continuing_subword_prefix": "@@"}}), "continuing_subword_prefix"),
    "roberta-positions-start-past-the-table": ("roberta", _config(pad_token_id=120), "pad_token_id = 120"),
    "vocab-txt-not-utf8": ("vocab-txt", lambda d: (d / "vocab.txt").write_bytes(b"[PAD]\n\xff\xfe\n"), "vocab.txt"),
    "vocab-txt-larger-than-model": ("vocab-txt", lambda d: (d / "vocab.txt").write_text(
        "".join(f"w{i}\n" for i in range(5000))), "vocab_size"),
    # XLM-RoBERTa's Unigram tokenizer.json
    "unigram-entry-not-piece-and-score": ("xlmr", _edit_json("tokenizer.json", lambda t: t | {
        "model": t["model"] | {"vocab": [["<s>", 0.0], "oops", *t["model"]["vocab"][2:]]}}), "model.vocab[1]"),
    "unigram-charsmap-not-base64": ("xlmr", _edit_json("tokenizer.json", lambda t: t | {
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": "not base64!"}}), "precompiled_charsmap"),
    "unigram-charsmap-truncated": ("xlmr", _edit_json("tokenizer.json", lambda t: t | {
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": "/////wAAAAA="}}), "precompiled charsmap"),
    "unigram-whitespace-pre-tokenizer": ("xlmr", lambda d: (_edit_json("tokenizer.json", lambda t: t | {
        "pre_tokenizer": {"type": "Whitespace"}})(d), _edit_json("tokenizer_config.json", lambda c: c | {
            "tokenizer_class": "PreTrainedTokenizerFast"})(d)), "pre-tokenizer Whitespace"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
