"""A WordPiece tokenizer (BERT's: tokenizer.json with a WordPiece model, or a plain vocab.txt) ->
llama.cpp's "bert" tokenizer (WPM).

llama.cpp's WPM splits the text into words as BertNormalizer + BertPreTokenizer do (whitespace,
punctuation, Chinese characters; lower-casing and accent stripping as the file's
`tokenizer.ggml.normalizer.*` keys say), then matches each word greedily, longest piece first, in
a vocabulary whose word-start pieces carry a leading "▁" and whose continuation pieces carry no
mark. WordPiece marks the other side: continuation pieces start with "##". So every token's text
is rewritten: "##ing" -> "ing", "play" -> "▁play"; control tokens ([CLS], [SEP], ...) keep their
text, as llama.cpp's converter writes them. The rewrite happens after the vocabulary is padded to
the model's size (`mark_word_starts`), so the padding tokens get the mark too, as there.

Which normalization transformers applies: its BertTokenizer classes build the normalizer from
tokenizer_config.json (do_lower_case, strip_accents, tokenize_chinese_chars, with BERT's defaults)
whatever tokenizer.json says; a tokenizer.json loaded by another class keeps its own normalizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .differences import TokenizationDifferences, note_space_stripping
from .hf_files import (
    SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, TokenizerFiles, config_added_tokens, get_typed, token_content,
    tokenizer_json_added_tokens,
)
from .tokenizer_json import component_steps
from .vocab import Vocabulary, added_token_type

VOCAB_TXT = "vocab.txt"
CONTINUATION = "##"
WORD_START = "\u2581"
# The "pre-tokenizer" name written for WPM: llama.cpp reads no pre-tokenizer for it (BertPreTokenizer
# is built in).
PRE = "default"

# transformers' classes that rebuild BertNormalizer from tokenizer_config.json (v4's fast classes
# did it too, when tokenizer.json disagreed); a folder without tokenizer_class gets BertTokenizer.
_CONFIG_NORMALIZER_CLASSES = {"BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast"}
# BertTokenizer's special tokens when tokenizer_config.json does not name them.
DEFAULT_SPECIAL = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}


def is_wordpiece(tokenizer_json: dict[str, Any]) -> bool:
    return (tokenizer_json.get("model") or {}).get("type") == "WordPiece"


def has_vocab_txt(model_dir: Path) -> bool:
    return (model_dir / VOCAB_TXT).is_file()


@dataclass(frozen=True)
class BertNormalization:
    lowercase: bool
    strip_accents: bool | None  # None: as lowercase (BERT's rule, and llama.cpp's default)
    chinese_chars: bool
    clean_text: bool


def load_wordpiece_vocabulary(model_dir: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles,
                              differences: TokenizationDifferences) -> Vocabulary:
    """The vocabulary (texts still in WordPiece's spelling: see mark_word_starts) and normalizer keys."""
    json_path = model_dir / "tokenizer.json"
    if tokenizer_json:
        source = json_path
        model = tokenizer_json.get("model") or {}
        prefix = model.get("continuing_subword_prefix", CONTINUATION)
        if prefix != CONTINUATION:
            raise TokenizerError(f"{json_path}: WordPiece continuing_subword_prefix {prefix!r:.20}; "
                                 f"llama.cpp's WPM knows only {CONTINUATION!r}")
        pieces = sorted((model.get("vocab") or {}).items(), key=lambda item: item[1])
    else:
        source = model_dir / VOCAB_TXT
        pieces = [(text, i) for i, text in enumerate(_read_vocab_txt(source))]
    if not pieces:
        raise TokenizerError(f"{source}: the WordPiece vocabulary is empty")
    normalization = _normalization(tokenizer_json, json_path, files)
    if not normalization.clean_text or not normalization.chinese_chars:
        off = [name for name, on in (("clean_text", normalization.clean_text),
                                     ("tokenize_chinese_chars", normalization.chinese_chars)) if not on]
        differences.add(f"{source.name}'s BertNormalizer with {' and '.join(off)} off (llama.cpp always does both)",
                        "text with control characters or Chinese characters")

    vocab = Vocabulary(model="bert", pre=PRE, source=source)
    vocab.normalizer_lowercase = normalization.lowercase
    vocab.normalizer_strip_accents = normalization.strip_accents
    for text, token_id in pieces:
        vocab.set_token(token_id, text, TokenType.NORMAL)

    added = tokenizer_json_added_tokens(tokenizer_json, json_path) if tokenizer_json else []
    known = {token.id for token in added}
    added += [t for t in config_added_tokens(files.tokenizer_config, model_dir / TOKENIZER_CONFIG) if t.id not in known]
    note_space_stripping(added, differences)
    for token in sorted(added, key=lambda token: token.id):
        vocab.set_token(token.id, token.content, added_token_type(token.content, bool(token.special)))
    if not tokenizer_json:
        _mark_special_tokens(vocab, files)
    return vocab


def _read_vocab_txt(path: Path) -> list[str]:
    """vocab.txt: one token per line, the line number its id (as transformers' load_vocab reads it)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _normalization(tokenizer_json: dict[str, Any], json_path: Path, files: TokenizerFiles) -> BertNormalization:
    """What transformers will apply: tokenizer_config.json's options for the BERT tokenizer classes
    (and a folder without tokenizer.json), else tokenizer.json's own normalizer."""
    config_path = files.model_dir / TOKENIZER_CONFIG
    config = files.tokenizer_config
    tokenizer_class = get_typed(config, "tokenizer_class", str, config_path)
    if tokenizer_json and tokenizer_class is not None and tokenizer_class not in _CONFIG_NORMALIZER_CLASSES:
        return _tokenizer_json_normalization(tokenizer_json, json_path)
    return BertNormalization(
        lowercase=get_typed(config, "do_lower_case", bool, config_path, default=True),
        strip_accents=get_typed(config, "strip_accents", bool, config_path),
        chinese_chars=get_typed(config, "tokenize_chinese_chars", bool, config_path, default=True),
        clean_text=True,
    )


def _tokenizer_json_normalization(tokenizer_json: dict[str, Any], json_path: Path) -> BertNormalization:
    """A BertNormalizer, possibly followed by Lowercase / StripAccents steps."""
    steps = component_steps(tokenizer_json.get("normalizer"), "normalizers", json_path, "normalizer")
    kinds = [step["type"] for step in steps]
    other = [kind for kind in kinds if kind not in ("BertNormalizer", "Lowercase", "StripAccents")]
    if other:
        raise TokenizerError(f"{json_path}: normalizer {other[0]} before WordPiece; llama.cpp's WPM "
                             "applies only BertNormalizer's steps")
    bert = next((step for step in steps if step["type"] == "BertNormalizer"), None)
    bert_lowercase = bool(bert.get("lowercase", True)) if bert else False
    lowercase = bert_lowercase or "Lowercase" in kinds
    strip = bert.get("strip_accents") if bert else None
    strip = (bert_lowercase if strip is None else strip) or "StripAccents" in kinds  # BertNormalizer's rule
    return BertNormalization(
        lowercase=lowercase,
        strip_accents=None if strip == lowercase else strip,  # llama.cpp's default: as lowercase
        chinese_chars=bool(bert and bert.get("handle_chinese_chars", True)),
        clean_text=bool(bert and bert.get("clean_text", True)),
    )


def _mark_special_tokens(vocab: Vocabulary, files: TokenizerFiles) -> None:
    """vocab.txt has no types: the tokens tokenizer_config.json / special_tokens_map.json name (or
    BertTokenizer's defaults) are its special tokens, as transformers makes them."""
    id_of = vocab.id_of()
    for role, default in DEFAULT_SPECIAL.items():
        text = None
        for source, name in ((files.tokenizer_config, TOKENIZER_CONFIG), (files.special_tokens_map, SPECIAL_TOKENS_MAP)):
            text = text or token_content(source.get(f"{role}_token"), files.model_dir / name, f"{role}_token")
        token_id = id_of.get(text or default)
        if token_id is not None:
            vocab.types[token_id] = TokenType.CONTROL


def special_token_fallbacks(vocab: Vocabulary) -> dict[str, int]:
    """Role -> id for roles the files do not name: BertTokenizer's default texts, and [CLS] as the
    bos, [SEP] as the eos token that llama.cpp's embedding and rerank tools put around a text
    (llama.cpp's converter does the same)."""
    id_of = vocab.id_of()
    ids = {role: id_of[text] for role, text in DEFAULT_SPECIAL.items() if text in id_of}
    if "cls" in ids:
        ids["bos"] = ids["cls"]
    if "sep" in ids:
        ids["eos"] = ids["sep"]
    return ids


def pair_adds_separator(post_processor: dict[str, Any] | None, source: Path) -> bool:
    """Whether a pair of texts gets two special tokens between them (RoBERTa's `</s></s>`): what
    llama.cpp's add_sep_token says, after the eos token add_eos_token already puts there. BERT's
    `[CLS] A [SEP] B [SEP]` has one."""
    for step in component_steps(post_processor, "processors", source, "post_processor"):
        if step["type"] == "TemplateProcessing":
            # each piece is {"Sequence": {"id": "A" | "B"}} or {"SpecialToken": {"id": text}} (checked)
            pieces = [(piece.get("Sequence") or {}).get("id") for piece in step.get("pair") or []]
            if "A" in pieces and "B" in pieces:
                return pieces.index("B") - pieces.index("A") - 1 >= 2
        if step["type"] == "RobertaProcessing":
            return True
    return False


def mark_word_starts(vocab: Vocabulary) -> None:
    """WordPiece spelling -> llama.cpp's: "##piece" -> "piece", any other non-control token gets "▁"."""
    for i, (text, token_type) in enumerate(zip(vocab.tokens, vocab.types)):
        if token_type == TokenType.CONTROL:
            continue
        vocab.tokens[i] = text[len(CONTINUATION):] if text.startswith(CONTINUATION) else WORD_START + text
