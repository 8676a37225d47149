"""export_tokenizer on tokenizer directories: special tokens, chat templates, detection, rejections.

Where transformers has an opinion (special token ids, the chat template it would use) it is the
oracle; rejections are checked for naming the file and the unsupported feature.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.constants import TokenType
from ggufsmith.tokenizer import detect_kind, export_tokenizer
from ggufsmith.errors import TokenizerError
from tests.tokenizer_helpers import train_bpe, train_sentencepiece, write_tokenizer_config

transformers = pytest.importorskip("transformers")


def _edit_tokenizer_json(model_dir: Path, edit) -> None:
    path = model_dir / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.fixture
def qwen2_dir(tmp_path):
    return train_bpe(tmp_path / "qwen2", "qwen2")


@pytest.fixture
def sp_dir(tmp_path):
    return train_sentencepiece(tmp_path / "sp")


# --- special tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", ["qwen2", "llama3", "sp"])
def test_special_ids_match_transformers(tmp_path, trainer):
    model_dir = train_sentencepiece(tmp_path / "sp") if trainer == "sp" else train_bpe(tmp_path / trainer, trainer)
    write_tokenizer_config(model_dir, pad_token="<|endoftext|>" if trainer == "qwen2" else None)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir)
    for role in ("bos", "eos", "unk", "pad"):
        expected = getattr(hf, f"{role}_token_id")
        assert metadata.get(f"tokenizer.ggml.{'unknown' if role == 'unk' else role}_token_id"
                            if role != "pad" else "tokenizer.ggml.padding_token_id") == expected, role


def test_special_token_as_added_token_dict(qwen2_dir):
    write_tokenizer_config(qwen2_dir, eos_token={"__type": "AddedToken", "content": "<|im_end|>", "special": True, "lstrip": False})
    hf = transformers.AutoTokenizer.from_pretrained(qwen2_dir)
    assert export_tokenizer(qwen2_dir).get("tokenizer.ggml.eos_token_id") == hf.eos_token_id


def test_special_ids_fall_back_to_config_json(qwen2_dir):
    config = json.loads((qwen2_dir / "tokenizer_config.json").read_text())
    config.pop("bos_token"), config.pop("eos_token")
    (qwen2_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (qwen2_dir / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    # A list of eos ids names no single token and is skipped.
    (qwen2_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3], "pad_token_id": 3}))
    metadata = export_tokenizer(qwen2_dir)
    assert metadata.get("tokenizer.ggml.bos_token_id") == 1
    assert metadata.get("tokenizer.ggml.eos_token_id") == 2
    assert metadata.get("tokenizer.ggml.padding_token_id") == 3


def test_out_of_range_special_id_is_ignored(qwen2_dir):
    (qwen2_dir / "config.json").write_text(json.dumps({"pad_token_id": 10**6}))
    assert "tokenizer.ggml.padding_token_id" not in export_tokenizer(qwen2_dir)


def test_added_token_types(qwen2_dir):
    metadata = export_tokenizer(qwen2_dir)
    tokens, types = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.token_type")
    assert types[tokens.index("<|im_end|>")] == TokenType.CONTROL
    assert types[tokens.index("myword")] == TokenType.USER_DEFINED
    assert types[tokens.index("Ġthe")] == TokenType.NORMAL


def test_sentencepiece_added_tokens_override_pieces(sp_dir):
    # added_tokens_decoder entries replace pieces; a special one becomes CONTROL, a plain one
    # USER_DEFINED with SentencePiece's "▁" written as a space (what llama.cpp matches).
    tokens = export_tokenizer(sp_dir).get("tokenizer.ggml.tokens")
    last = len(tokens) - 1
    write_tokenizer_config(sp_dir, added_tokens_decoder={
        str(last): {"content": "<|new_special|>", "special": True},
        str(last + 1): {"content": "▁hello▁you", "special": False},
    })
    metadata = export_tokenizer(sp_dir)
    tokens, types = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.token_type")
    assert (tokens[last], types[last]) == ("<|new_special|>", TokenType.CONTROL)
    assert (tokens[last + 1], types[last + 1]) == (" hello you", TokenType.USER_DEFINED)
    assert len(metadata.get("tokenizer.ggml.scores")) == len(tokens)


def test_duplicate_token_texts_are_rejected(sp_dir):
    write_tokenizer_config(sp_dir, added_tokens_decoder={"100": {"content": "<s>", "special": True}})
    with pytest.raises(TokenizerError, match="unique"):
        export_tokenizer(sp_dir)


# --- chat templates ------------------------------------------------------------------------------


def test_chat_template_string(qwen2_dir):
    write_tokenizer_config(qwen2_dir, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    hf = transformers.AutoTokenizer.from_pretrained(qwen2_dir)
    assert export_tokenizer(qwen2_dir).get("tokenizer.chat_template") == hf.chat_template


def test_named_chat_templates(qwen2_dir):
    write_tokenizer_config(qwen2_dir, chat_template=[
        {"name": "default", "template": "D {{ messages }}"},
        {"name": "tool_use", "template": "T {{ tools }}"},
        {"name": "RAG", "template": "R {{ documents }}"},
    ])
    hf = transformers.AutoTokenizer.from_pretrained(qwen2_dir)
    metadata = export_tokenizer(qwen2_dir)
    assert metadata.get("tokenizer.chat_template") == hf.chat_template["default"]
    assert metadata.get("tokenizer.chat_template.tool_use") == hf.chat_template["tool_use"]
    assert metadata.get("tokenizer.chat_template.rag") == hf.chat_template["RAG"]
    assert metadata.get("tokenizer.chat_templates") == ["tool_use", "rag"]


def test_chat_template_jinja_file_wins(qwen2_dir):
    write_tokenizer_config(qwen2_dir, chat_template="from the config")
    (qwen2_dir / "chat_template.jinja").write_text("from the file {{ messages }}", encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(qwen2_dir)
    assert export_tokenizer(qwen2_dir).get("tokenizer.chat_template") == hf.chat_template == "from the file {{ messages }}"


def test_no_chat_template(qwen2_dir):
    assert "tokenizer.chat_template" not in export_tokenizer(qwen2_dir)


# --- detection -----------------------------------------------------------------------------------


def test_detects_sentencepiece_and_bpe(qwen2_dir, sp_dir):
    assert detect_kind(sp_dir) == "llama"
    assert detect_kind(qwen2_dir) == "gpt2"


def test_tokenizer_model_that_is_not_sentencepiece_falls_back_to_tokenizer_json(qwen2_dir):
    # Llama 3 ships its tiktoken ranks as tokenizer.model next to tokenizer.json.
    (qwen2_dir / "tokenizer.model").write_text("IQ== 0\nIg== 1\n")
    assert detect_kind(qwen2_dir) == "gpt2"
    assert export_tokenizer(qwen2_dir).get("tokenizer.ggml.model") == "gpt2"


def test_kind_override_needs_its_file(qwen2_dir, sp_dir):
    with pytest.raises(TokenizerError, match="tokenizer.model: missing"):
        export_tokenizer(qwen2_dir, kind="llama")
    with pytest.raises(TokenizerError, match="tokenizer.json: missing"):
        export_tokenizer(sp_dir, kind="gpt2")
    with pytest.raises(TokenizerError, match="neither a WordPiece tokenizer.json nor a vocab.txt"):
        export_tokenizer(sp_dir, kind="bert")
    with pytest.raises(TokenizerError, match="tokenizer.json: not a WordPiece model"):
        export_tokenizer(qwen2_dir, kind="bert")
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        export_tokenizer(sp_dir, kind="wordpiece")


def test_empty_directory(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer found"):
        export_tokenizer(tmp_path)


def test_unreadable_json_names_the_file(qwen2_dir):
    (qwen2_dir / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer_config.json: not valid JSON"):
        export_tokenizer(qwen2_dir)


# --- rejected tokenizer.json features ------------------------------------------------------------


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d["model"].update(type="Unigram"), "Unigram tokenizer model is not supported"),
        (lambda d: d["model"].update(byte_fallback=True), "SentencePiece-style BPE with pre-tokenizer 'Sequence'"),
        (lambda d: d["model"].update(continuing_subword_prefix="##"), "continuing_subword_prefix"),
        (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\w+"), "regexes not known"),
        (lambda d: d["model"].update(merges=[["a b", "c"]]), "a space"),
    ],
)
def test_unsupported_tokenizer_json_is_rejected(qwen2_dir, edit, message):
    _edit_tokenizer_json(qwen2_dir, edit)
    with pytest.raises(TokenizerError, match=message) as raised:
        export_tokenizer(qwen2_dir)
    assert "tokenizer.json" in str(raised.value)


# --- what llama.cpp applies differently: one warning, or refused with strict ---------------------


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize(
    "edit,cause,affected",
    [
        (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer Lowercase", "upper-case letters"),
        (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}]}), "normalizer NFKC",
         "NFKC normalization would change"),
        (lambda d: d["model"].update(dropout=0.1), "dropout=0.1", "at random"),
        (lambda d: d.update(decoder={"type": "Metaspace"}), "decoder Metaspace", "generated tokens"),
        (lambda d: d["added_tokens"][-1].update(lstrip=True), "lstrip/rstrip", "spaces next to those tokens"),
    ],
)
def test_what_llama_cpp_applies_differently_converts_with_one_warning(qwen2_dir, caplog, edit, cause, affected):
    _edit_tokenizer_json(qwen2_dir, edit)
    metadata = export_tokenizer(qwen2_dir)
    assert metadata.get("tokenizer.ggml.pre") == "qwen2"
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert cause in warnings[0] and affected in warnings[0], warnings[0]
    with pytest.raises(TokenizerError, match="refused by --strict-tokenizer") as raised:
        export_tokenizer(qwen2_dir, strict=True)
    assert cause in str(raised.value) and "\n" not in str(raised.value)


def test_nfc_normalizer_is_accepted_with_a_warning(qwen2_dir, caplog):
    # Qwen2's NFC: llama.cpp does not normalize, but NFC text (nearly all text) is unchanged by it.
    assert export_tokenizer(qwen2_dir).get("tokenizer.ggml.pre") == "qwen2"
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "normalizer NFC" in warnings[0], warnings


def test_sentencepiece_model_needs_no_sentencepiece_package(sp_dir, monkeypatch):
    # `pip install ggufsmith` has numpy and tqdm only; tokenizer.model is read by our own decoder.
    import builtins

    expected = export_tokenizer(sp_dir, kind="llama")
    real_import = builtins.__import__

    def no_sentencepiece(name, *args, **kwargs):
        if name.startswith(("sentencepiece", "google.protobuf")):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sentencepiece)
    got = export_tokenizer(sp_dir, kind="llama")
    assert {k: v.plain() for k, v in got.items()} == {k: v.plain() for k, v in expected.items()}


def test_sentencepiece_style_json_forced_to_gpt2_is_refused(tmp_path):
    model_dir = train_sentencepiece(tmp_path / "sp")
    transformers.AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp_path / "json")
    assert detect_kind(tmp_path / "json") == "llama"
    with pytest.raises(TokenizerError, match="kind 'llama'"):
        export_tokenizer(tmp_path / "json", kind="gpt2")
