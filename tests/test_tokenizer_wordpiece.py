"""WordPiece tokenizers exported as llama.cpp's "bert" (WPM) tokenizer: llama.cpp, loading only our
tokenizer keys, gives the token ids transformers' BertTokenizer gives, for cased and uncased
vocabularies, from tokenizer.json and from a bare vocab.txt.

The texts mix scripts, accents (precomposed and combining), Chinese (split per character),
punctuation and symbols, casing, digits and whitespace of several kinds. Where llama.cpp's WPM is
known to differ from transformers (docs/tokenizers.md: words of more than 100 characters), the
texts stay clear of it; that difference is asserted apart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ggufsmith.constants import Keys, TokenType
from ggufsmith.errors import TokenizerError
from ggufsmith.tokenizer import detect_kind, export_tokenizer
from tests.bert_models import train_wordpiece, write_vocab_txt_only
from tests.tokenizer_helpers import SCRIPT_TEXTS, load_llama_vocab, write_tokenizer_config, write_vocab_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("llama_cpp")

TEXTS = [
    *SCRIPT_TEXTS,
    "HELLO World, hello WORLD; Hello-World!",
    "e-mail: someone@example.com, URL https://example.org/path?q=1&r=2",
    "Emoji 🚀 and unknown ☃ characters ⚡ stay [UNK]",
    "",
]

VARIANTS = {  # name -> (lowercase, from tokenizer.json)
    "uncased-json": (True, True),
    "cased-json": (False, True),
    "uncased-vocab-txt": (True, False),
    "cased-vocab-txt": (False, False),
}


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wordpiece")
    dirs = {}
    for lowercase in (True, False):
        case = "uncased" if lowercase else "cased"
        train_wordpiece(root / f"{case}-json", lowercase=lowercase)
        write_vocab_txt_only(root / f"{case}-json", root / f"{case}-vocab-txt", lowercase=lowercase)
        dirs[f"{case}-json"], dirs[f"{case}-vocab-txt"] = root / f"{case}-json", root / f"{case}-vocab-txt"
    # Cased, but accents stripped: strip_accents set apart from lowercase.
    dirs["cased-strip-accents"] = root / "cased-strip-accents"
    write_vocab_txt_only(root / "uncased-json", dirs["cased-strip-accents"], lowercase=False)
    write_tokenizer_config(dirs["cased-strip-accents"], strip_accents=True)
    # A tokenizer class that keeps tokenizer.json's own normalizer (cased), whatever do_lower_case says.
    dirs["cased-generic-class"] = root / "cased-generic-class"
    shutil.copytree(dirs["cased-json"], dirs["cased-generic-class"])
    write_tokenizer_config(dirs["cased-generic-class"], tokenizer_class="PreTrainedTokenizerFast", do_lower_case=True)
    return dirs


def _llama_ids(model_dir: Path, tmp_path: Path, texts: list[str]) -> list[list[int]]:
    vocab = load_llama_vocab(write_vocab_gguf(export_tokenizer(model_dir), tmp_path / "vocab.gguf", arch="bert"))
    try:
        # special=True: transformers finds the special tokens written in the text ("[UNK]") too
        return [vocab.tokenize(text.encode(), add_bos=True, special=True) for text in texts]
    finally:
        vocab.close()


@pytest.mark.parametrize("variant", [*VARIANTS, "cased-strip-accents", "cased-generic-class"])
def test_llama_cpp_tokenizes_as_transformers(tokenizer_dirs, tmp_path, variant):
    model_dir = tokenizer_dirs[variant]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    expected = [tokenizer(text)["input_ids"] for text in TEXTS]
    assert sum(ids.count(tokenizer.unk_token_id) for ids in expected) < sum(map(len, expected)) / 4  # mostly known words
    for text, got, want in zip(TEXTS, _llama_ids(model_dir, tmp_path, TEXTS), expected):
        assert got == want, f"{variant}: {text!r}: {tokenizer.convert_ids_to_tokens(want)}"


def test_casing_changes_the_tokens(tokenizer_dirs, tmp_path):
    """The normalizer keys matter: only the cased vocabulary keeps "HELLO" apart from "hello"."""
    (tmp_path / "u").mkdir(), (tmp_path / "c").mkdir()
    upper, lower = _llama_ids(tokenizer_dirs["uncased-json"], tmp_path / "u", ["HELLO", "hello"])
    assert upper == lower
    upper, lower = _llama_ids(tokenizer_dirs["cased-json"], tmp_path / "c", ["HELLO", "hello"])
    assert upper != lower


def test_keys_as_llama_cpp_expects(tokenizer_dirs):
    keys = export_tokenizer(tokenizer_dirs["uncased-json"])
    tokens = keys[Keys.Tokenizer.TOKENS].value
    types = keys[Keys.Tokenizer.TOKEN_TYPE].value
    vocab = json.loads((tokenizer_dirs["uncased-json"] / "tokenizer.json").read_text())["model"]["vocab"]
    assert keys[Keys.Tokenizer.MODEL].value == "bert"
    for text, token_id in vocab.items():
        if text.startswith("[") and text.endswith("]"):  # the special tokens keep their text
            assert (tokens[token_id], types[token_id]) == (text, TokenType.CONTROL)
        elif text.startswith("##"):
            assert tokens[token_id] == text[2:]
        else:
            assert tokens[token_id] == "\u2581" + text
    ids = {role: keys[key].value for role, key in (("bos", Keys.Tokenizer.BOS_ID), ("eos", Keys.Tokenizer.EOS_ID),
                                                    ("sep", Keys.Tokenizer.SEP_ID), ("unk", Keys.Tokenizer.UNK_ID),
                                                    ("pad", Keys.Tokenizer.PAD_ID), ("mask", Keys.Tokenizer.MASK_ID))}
    assert ids == {"bos": vocab["[CLS]"], "eos": vocab["[SEP]"], "sep": vocab["[SEP]"], "unk": vocab["[UNK]"],
                   "pad": vocab["[PAD]"], "mask": vocab["[MASK]"]}
    # [CLS] a [SEP] b [SEP] for a pair (llama.cpp's reranking): bos, eos, and no second separator.
    assert (keys[Keys.Tokenizer.ADD_BOS].value, keys[Keys.Tokenizer.ADD_EOS].value,
            keys[Keys.Tokenizer.ADD_SEP].value) == (True, True, False)
    assert keys[Keys.Tokenizer.NORMALIZER_LOWERCASE].value is True


def test_vocab_txt_folder_is_detected_and_gets_its_own_special_ids(tokenizer_dirs):
    """Without tokenizer.json, the special tokens' ids come from the vocabulary, not from llama.cpp's
    defaults (bert-base-uncased's 100-103), which would be other tokens here."""
    model_dir = tokenizer_dirs["cased-vocab-txt"]
    assert detect_kind(model_dir) == "bert"
    keys = export_tokenizer(model_dir)
    tokens = keys[Keys.Tokenizer.TOKENS].value
    assert tokens[keys[Keys.Tokenizer.BOS_ID].value] == "[CLS]"
    assert tokens[keys[Keys.Tokenizer.UNK_ID].value] == "[UNK]"
    assert keys[Keys.Tokenizer.NORMALIZER_LOWERCASE].value is False


def test_words_of_more_than_100_characters_are_a_known_difference(tokenizer_dirs, tmp_path):
    """What docs/tokenizers.md lists: transformers gives [UNK] for a word of more than 100
    characters where llama.cpp tokenizes it; if this starts to agree, the docs should say so."""
    model_dir = tokenizer_dirs["uncased-json"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    long_word = "ab" * 60
    got = _llama_ids(model_dir, tmp_path, [long_word])[0]
    assert tokenizer(long_word)["input_ids"] == [tokenizer.cls_token_id, tokenizer.unk_token_id, tokenizer.sep_token_id]
    assert tokenizer.unk_token_id not in got


def test_other_continuation_prefix_is_refused(tokenizer_dirs, tmp_path):
    model_dir = tmp_path / "prefix"
    model_dir.mkdir()
    data = json.loads((tokenizer_dirs["uncased-json"] / "tokenizer.json").read_text())
    data["model"]["continuing_subword_prefix"] = "@@"
    (model_dir / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(TokenizerError, match="continuing_subword_prefix"):
        export_tokenizer(model_dir)
