"""Oracle tests: llama.cpp loading our exported tokenizer keys tokenizes as the real tokenizer does.

Oracles: transformers (AutoTokenizer on the saved directory) for every tokenizer, and the
sentencepiece library itself for tokenizer.model files.
"""

from __future__ import annotations

import pytest

from ggufsmith.tokenizer import detect_kind, export_tokenizer
from ggufsmith.errors import TokenizerError
from tests.tokenizer_helpers import (
    BPE_STYLES,
    BPE_USER_DEFINED,
    CHECK_TEXT,
    SP_CONTROL,
    SP_USER_DEFINED,
    TEXT_ROLE_GETTERS,
    load_llama_vocab,
    load_llama_without_text_roles,
    train_bpe,
    train_sentencepiece,
    write_tokenizer_config,
    write_vocab_gguf,
)

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")


def _tokenize(llm, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def _hf_and_llama(model_dir, vocab_path=None):
    """(transformers' tokenizer for model_dir, llama.cpp's vocab loaded from our exported keys,
    those keys); the vocab file goes to vocab_path, by default model_dir / "vocab.gguf"."""
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, vocab_path or model_dir / "vocab.gguf"))
    return hf, llm, metadata


# --- byte-level BPE ------------------------------------------------------------------------------


@pytest.fixture(scope="session", params=sorted(BPE_STYLES))
def bpe_case(request, tmp_path_factory):
    """(style, model dir, HF tokenizer, llama.cpp vocab) for each pre-tokenizer style."""
    style = request.param
    model_dir = train_bpe(tmp_path_factory.mktemp(f"bpe-{style}"), style)
    hf, llm, metadata = _hf_and_llama(model_dir)
    return style, model_dir, hf, llm, metadata


def test_bpe_tokenizes_like_transformers(bpe_case):
    style, _, hf, llm, _ = bpe_case
    expected = hf.encode(CHECK_TEXT, add_special_tokens=False)
    assert _tokenize(llm, CHECK_TEXT) == expected, style


def test_bpe_special_tokens_like_transformers(bpe_case):
    style, _, hf, llm, _ = bpe_case
    specials = BPE_STYLES[style]["specials"]
    text = f"{specials[0]}Hello {specials[-1]} wörld{BPE_USER_DEFINED[0]} 你好{specials[1 % len(specials)]}\n"
    assert _tokenize(llm, text, special=True) == hf.encode(text, add_special_tokens=False), style
    # Without special parsing llama.cpp still matches user-defined (non-special) added tokens.
    plain = f"say {BPE_USER_DEFINED[0]} twice {BPE_USER_DEFINED[0]}"
    assert _tokenize(llm, plain) == hf.encode(plain, add_special_tokens=False), style


def test_bpe_add_bos_like_transformers(bpe_case):
    style, _, hf, llm, _ = bpe_case
    text = "Hello world"
    assert _tokenize(llm, text, add_bos=True) == hf.encode(text, add_special_tokens=True), style


def test_bpe_detokenize_round_trips(bpe_case):
    style, _, hf, llm, _ = bpe_case
    tokens = _tokenize(llm, CHECK_TEXT)
    assert llm.detokenize(tokens).decode("utf-8") == CHECK_TEXT, style
    assert hf.decode(tokens) == CHECK_TEXT, style


def test_bpe_pre_tokenizer_name(bpe_case):
    style, _, _, _, metadata = bpe_case
    # The fixtures set clean_up_tokenization_spaces=False, which picks the group member without
    # llama.cpp's space cleaning on decode (gpt-2 -> trillion, starcoder -> smollm).
    expected = {"llama3": "llama-bpe", "gpt2": "trillion", "starcoder": "smollm"}.get(style, style)
    assert metadata.get("tokenizer.ggml.pre") == expected


def test_bpe_padding_to_model_vocab_size(bpe_case, tmp_path):
    style, model_dir, hf, _, metadata = bpe_case
    n_tokens = len(metadata.get("tokenizer.ggml.tokens"))
    padded = export_tokenizer(model_dir, vocab_size=n_tokens + 7)
    tokens = padded.get("tokenizer.ggml.tokens")
    assert len(tokens) == n_tokens + 7 and tokens[-1] == f"[PAD{n_tokens + 6}]"
    assert padded.get("tokenizer.ggml.token_type")[-7:] == [5] * 7  # UNUSED
    llm = load_llama_vocab(write_vocab_gguf(padded, tmp_path / "padded.gguf"))
    assert llm.n_vocab() == n_tokens + 7
    assert _tokenize(llm, CHECK_TEXT) == hf.encode(CHECK_TEXT, add_special_tokens=False)
    with pytest.raises(TokenizerError, match="vocab_size"):
        export_tokenizer(model_dir, vocab_size=n_tokens - 1)


# --- SentencePiece -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sp_case(tmp_path_factory):
    import sentencepiece as spm

    model_dir = train_sentencepiece(tmp_path_factory.mktemp("sp-bpe"))
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    hf, llm, metadata = _hf_and_llama(model_dir)
    return model_dir, sp, hf, llm, metadata


def test_sentencepiece_tokenizes_like_sentencepiece(sp_case):
    _, sp, _, llm, _ = sp_case
    assert _tokenize(llm, CHECK_TEXT) == sp.encode(CHECK_TEXT)


def test_sentencepiece_tokenizes_like_transformers(sp_case):
    # transformers' converted tokenizer splits a leading double space as "▁" "Hello" where
    # sentencepiece (and llama.cpp) give "▁▁" "Hello", so compare from the first word on.
    _, _, hf, llm, _ = sp_case
    text = CHECK_TEXT.lstrip()
    assert _tokenize(llm, text) == hf.encode(text, add_special_tokens=False)


def test_sentencepiece_user_defined_symbols_stay_whole(sp_case):
    # Typed USER_DEFINED (llama.cpp's converter leaves them NORMAL, and llama.cpp then splits them).
    # Each symbol ends the text, since llama.cpp adds a space prefix to text after one.
    _, sp, _, llm, _ = sp_case
    for symbol in SP_USER_DEFINED:
        text = f"say {symbol}"
        assert _tokenize(llm, text) == sp.encode(text)


def test_sentencepiece_special_tokens_like_transformers(sp_case):
    # llama.cpp puts a space prefix on every text after a special token, even one that starts with
    # a space ("▁▁"), where transformers' legacy mode adds "▁" only if there is none; so no text
    # here starts with a space right after a special token.
    _, _, hf, llm, _ = sp_case
    text = f"{SP_CONTROL[0]}user Grüße{SP_USER_DEFINED[0]}{SP_USER_DEFINED[1]}你好 x{SP_CONTROL[1]}\n<s>x</s>"
    assert _tokenize(llm, text, special=True) == hf.encode(text, add_special_tokens=False)


def test_sentencepiece_add_bos_like_transformers(sp_case):
    _, _, hf, llm, _ = sp_case
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")


def test_sentencepiece_detokenize_round_trips(sp_case):
    _, sp, hf, llm, _ = sp_case
    tokens = _tokenize(llm, CHECK_TEXT)
    # llama.cpp keeps the prefix space it added; sentencepiece and transformers drop it.
    assert llm.detokenize(tokens).decode("utf-8") == " " + CHECK_TEXT
    assert sp.decode(tokens) == CHECK_TEXT
    assert hf.decode(tokens) == CHECK_TEXT


def test_sentencepiece_token_types(sp_case):
    _, sp, _, _, metadata = sp_case
    types = metadata.get("tokenizer.ggml.token_type")
    tokens = metadata.get("tokenizer.ggml.tokens")
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            assert types[i] == 2
        elif sp.is_control(i):
            assert types[i] == 3
        elif sp.is_byte(i):
            assert types[i] == 6
        elif sp.id_to_piece(i) in SP_USER_DEFINED:
            assert types[i] == 4
        else:
            assert types[i] == 1, tokens[i]
        assert tokens[i] == sp.id_to_piece(i)


def test_sentencepiece_unigram_is_rejected_as_llama(tmp_path):
    # llama.cpp's "llama" tokenizer merges by score, which reproduces SentencePiece BPE but not the
    # unigram model's Viterbi segmentation: a unigram model is a "t5" tokenizer (test_tokenizer_unigram.py).
    model_dir = train_sentencepiece(tmp_path, model_type="unigram")
    assert detect_kind(model_dir) == "t5"
    with pytest.raises(TokenizerError, match="unigram"):
        export_tokenizer(model_dir, kind="llama")


def test_sentencepiece_nfkc_normalization_is_refused_only_when_strict(tmp_path):
    # Converted with a warning by default (tests/test_tokenizer_policy.py runs it in llama.cpp).
    model_dir = train_sentencepiece(tmp_path, normalization_rule_name="nmt_nfkc")
    assert export_tokenizer(model_dir).get("tokenizer.ggml.model") == "llama"
    with pytest.raises(TokenizerError, match="nmt_nfkc"):
        export_tokenizer(model_dir, strict=True)


# --- add_bos / add_eos from the configuration ----------------------------------------------------


def _copy_with_config(src, dst, **fields):
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.gguf"))
    write_tokenizer_config(dst, **fields)
    return dst


@pytest.mark.parametrize("add_bos,add_eos", [(False, True), (True, True), (False, False)])
def test_sentencepiece_add_bos_eos_follow_tokenizer_config(sp_case, tmp_path, add_bos, add_eos):
    model_dir = _copy_with_config(sp_case[0], tmp_path / "sp", add_bos_token=add_bos, add_eos_token=add_eos)
    hf, llm, _ = _hf_and_llama(model_dir, tmp_path / "v.gguf")
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")


@pytest.mark.parametrize("style", ["llama3", "qwen2"])
def test_bpe_post_processor_wins_over_tokenizer_config(tmp_path, style):
    # transformers runs tokenizer.json's post_processor and ignores add_bos_token for these.
    model_dir = train_bpe(tmp_path / style, style)
    flags = not BPE_STYLES[style]["bos"]
    write_tokenizer_config(model_dir, add_bos_token=flags, add_eos_token=flags)
    hf, llm, _ = _hf_and_llama(model_dir, tmp_path / "v.gguf")
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")


def test_every_table_name_is_one_llama_cpp_accepts(tmp_path):
    """llama.cpp refuses to load a file whose tokenizer.ggml.pre it does not know."""
    from ggufsmith.constants import GGUFValueType
    from ggufsmith.tokenizer.pretokenizer import PRE_TOKENIZERS

    metadata = export_tokenizer(train_bpe(tmp_path / "gpt2", "gpt2"))
    n_tokens = len(metadata.get("tokenizer.ggml.tokens"))
    for entry in PRE_TOKENIZERS:
        metadata.replace("tokenizer.ggml.pre", entry.name, GGUFValueType.STRING)
        llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / f"{entry.name}.gguf"))
        assert llm.n_vocab() == n_tokens, entry.name
    metadata.replace("tokenizer.ggml.pre", "no-such-pre-tokenizer", GGUFValueType.STRING)
    with pytest.raises(ValueError):
        load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "unknown.gguf"))


def test_eot_and_fim_ids_are_the_ones_llama_cpp_detects(bpe_case, tmp_path):
    """Without our eot/fim keys llama.cpp finds these tokens by their text; we must agree."""
    style, _, _, _, metadata = bpe_case
    llm = load_llama_without_text_roles(metadata, tmp_path / "stripped.gguf")
    vocab = llm._model.vocab
    tokens = metadata.get("tokenizer.ggml.tokens")
    for key, getter in TEXT_ROLE_GETTERS.items():
        detected = getattr(llama_cpp, getter)(vocab)
        ours = metadata.get(key, -1)
        if key == "tokenizer.ggml.eot_token_id" and ours != detected:
            # Several end-of-turn texts (Llama 3's <|end_of_text|> and <|eot_id|>): llama.cpp takes
            # whichever its hash map yields first; we take the chat one. Both must end generation.
            assert llama_cpp.llama_vocab_is_eog(vocab, ours) and tokens[ours] == "<|eot_id|>", style
            continue
        assert ours == detected, (style, key)


# --- SentencePiece-style tokenizer.json (what transformers 5 saves for Llama-family tokenizers) ---


@pytest.fixture(scope="session", params=["metaspace", "normalizer"])
def sp_json_case(request, sp_case, tmp_path_factory):
    """The SentencePiece model re-saved by transformers (tokenizer.json only); "normalizer" rewrites
    its space handling in the older Prepend + Replace normalizer form."""
    import json

    model_dir = tmp_path_factory.mktemp(f"sp-json-{request.param}")
    sp_case[2].save_pretrained(model_dir)
    assert not (model_dir / "tokenizer.model").exists()
    if request.param == "normalizer":
        path = model_dir / "tokenizer.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data["pre_tokenizer"] = None
        data["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ]}
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    # transformers does not save `legacy`; llama.cpp has the legacy behaviour (see train_sentencepiece).
    write_tokenizer_config(model_dir, legacy=True)
    hf, llm, metadata = _hf_and_llama(model_dir)
    return model_dir, sp_case[1], hf, llm, metadata


def test_sentencepiece_json_tokenizes_like_transformers_and_sentencepiece(sp_json_case):
    _, sp, hf, llm, metadata = sp_json_case
    assert metadata.get("tokenizer.ggml.model") == "llama"
    text = CHECK_TEXT.lstrip()  # see test_sentencepiece_tokenizes_like_transformers
    assert _tokenize(llm, text) == hf.encode(text, add_special_tokens=False)
    assert _tokenize(llm, CHECK_TEXT) == sp.encode(CHECK_TEXT)


def test_sentencepiece_json_special_tokens_and_bos(sp_json_case):
    _, _, hf, llm, _ = sp_json_case
    text = f"{SP_CONTROL[0]}user Grüße{SP_USER_DEFINED[0]}{SP_USER_DEFINED[1]}你好 x{SP_CONTROL[1]}\n<s>x</s>"
    assert _tokenize(llm, text, special=True) == hf.encode(text, add_special_tokens=False)
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")
    tokens = _tokenize(llm, CHECK_TEXT)
    assert llm.detokenize(tokens).decode("utf-8") == " " + CHECK_TEXT


# --- every entry of the pre-tokenizer table ------------------------------------------------------


def _table_names():
    from ggufsmith.tokenizer.pretokenizer import PRE_TOKENIZERS

    return [entry.name for entry in PRE_TOKENIZERS]


@pytest.mark.parametrize("name", _table_names())
def test_every_table_entry_tokenizes_like_transformers(tmp_path, name):
    """For each llama.cpp name we can emit: a tokenizer.json with exactly the regexes and flags the
    table lists for it is identified as that name, and llama.cpp tokenizes it as transformers does."""
    from tests.tokenizer_helpers import train_bpe_for_table_entry

    model_dir = train_bpe_for_table_entry(tmp_path / "tok", name)
    metadata = export_tokenizer(model_dir)
    assert metadata.get("tokenizer.ggml.pre") == name
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "vocab.gguf"))
    tokens = _tokenize(llm, CHECK_TEXT)
    assert tokens == hf.encode(CHECK_TEXT, add_special_tokens=False)
    assert llm.detokenize(tokens).decode("utf-8") == hf.decode(tokens)


def test_sentencepiece_remove_extra_whitespaces_follows_transformers(tmp_path, caplog):
    # Not applied by llama.cpp's SPM tokenizer nor by transformers' converted tokenizer: llama.cpp
    # agrees with transformers (the sentencepiece library collapses the spaces), with a warning.
    model_dir = train_sentencepiece(tmp_path / "sp", remove_extra_whitespaces=True)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir)
    assert "remove_extra_whitespaces" in caplog.text
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "v.gguf"))
    text = CHECK_TEXT.lstrip()
    assert _tokenize(llm, text) == hf.encode(text, add_special_tokens=False)


def test_sentencepiece_without_dummy_prefix_follows_sentencepiece(tmp_path):
    # transformers' converted tokenizer prepends "▁" regardless; the model file says not to, and
    # llama.cpp follows the model file as the sentencepiece library does.
    import sentencepiece as spm

    model_dir = train_sentencepiece(tmp_path / "sp", add_dummy_prefix=False)
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    metadata = export_tokenizer(model_dir)
    assert metadata.get("tokenizer.ggml.add_space_prefix") is False
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "v.gguf"))
    assert _tokenize(llm, CHECK_TEXT) == sp.encode(CHECK_TEXT)
    assert llm.detokenize(_tokenize(llm, CHECK_TEXT)).decode("utf-8") == CHECK_TEXT


def test_sentencepiece_user_defined_symbol_with_a_space(tmp_path):
    # A user-defined "▁myword" is " myword" in raw text, where llama.cpp looks for it.
    import sentencepiece as spm

    model_dir = train_sentencepiece(tmp_path / "sp", user_defined_symbols=["▁myword", "<tool>"])
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    llm = load_llama_vocab(write_vocab_gguf(export_tokenizer(model_dir), tmp_path / "v.gguf"))
    for text in ("say myword", "x\n myword", "Grüße myword"):
        assert _tokenize(llm, text) == sp.encode(text), text
