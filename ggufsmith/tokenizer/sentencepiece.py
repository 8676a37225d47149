"""SentencePiece tokenizer.model -> llama.cpp's "llama" (SPM) tokenizer."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .differences import (
    SENTENCEPIECE_NORMALIZATION_TEXT,
    TokenizationDifferences,
    note_space_stripping,
    note_spacing_after_special_tokens,
)
from .hf_files import (
    ADDED_TOKENS,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    AddedToken,
    TokenizerFiles,
    added_tokens_file,
    config_added_tokens,
    get_typed,
    tokenizer_json_added_tokens,
)
from .sentencepiece_model import ModelProto, parse_model_proto
from .vocab import ADDED_TOKEN_SCORE, Vocabulary, added_token_type

log = logging.getLogger(__name__)

# sentencepiece_model.proto: TrainerSpec.ModelType
_SP_UNIGRAM, _SP_BPE = 1, 2
# ModelProto.SentencePiece.Type uses the same numbers as GGUF's token types.
_SP_PIECE_TYPES = {int(t): t for t in TokenType}
_WHITESPACE_MARK = "\u2581"  # SentencePiece's visible space
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


# The last file parsed: (its bytes, its ModelProto). Detecting the tokenizer's kind and exporting it
# read the same tokenizer.model three times; parsing 32000 pieces in Python takes ~0.25 s, paid
# before any tensor is converted. Keyed by the bytes themselves, so a changed file is parsed again.
_last_parsed: tuple[bytes, ModelProto] | None = None


def load_model_proto(path: Path) -> ModelProto:
    """Parse tokenizer.model (a SentencePiece ModelProto; read without the sentencepiece package).
    The same bytes give the same object: callers read it and never change it."""
    global _last_parsed
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None
    if _last_parsed is not None and _last_parsed[0] == data:
        return _last_parsed[1]
    try:
        proto = parse_model_proto(data)
    except ValueError as e:
        raise TokenizerError(f"{path}: not a SentencePiece model ({e})") from None
    if not proto.pieces:
        raise TokenizerError(f"{path}: not a SentencePiece model (no pieces)")
    _last_parsed = (data, proto)
    return proto


def is_sentencepiece_model(path: Path) -> bool:
    """True if `path` parses as a SentencePiece model (a tiktoken file may use the same name)."""
    try:
        load_model_proto(path)
    except TokenizerError:
        return False
    return True


def _check_supported(proto: Any, path: Path, differences: TokenizationDifferences) -> None:
    model_type = proto.trainer_spec.model_type
    if model_type != _SP_BPE:
        kind = {_SP_UNIGRAM: "unigram"}.get(model_type, f"type {model_type}")
        raise TokenizerError(
            f"{path}: SentencePiece {kind} model is not supported (llama.cpp's 'llama' tokenizer "
            "reproduces only SentencePiece BPE models)"
        )
    if proto.trainer_spec.treat_whitespace_as_suffix:
        # Not a difference on some text but another tokenizer: llama.cpp puts the space mark before
        # words, so every text with a space would be split into different pieces.
        raise TokenizerError(f"{path}: SentencePiece treat_whitespace_as_suffix is not supported by llama.cpp")
    normalizer = proto.normalizer_spec
    if normalizer.precompiled_charsmap and normalizer.name != "identity":
        differences.add(
            f"{path.name}'s normalization {normalizer.name!r}",
            SENTENCEPIECE_NORMALIZATION_TEXT.get(
                normalizer.name, f"text that the model's normalization rules {normalizer.name!r} change"
            ),
        )
    if normalizer.remove_extra_whitespaces:
        # Neither llama.cpp's SPM tokenizer nor transformers' converted tokenizer collapses runs of
        # whitespace, so both split such runs differently from the sentencepiece library.
        differences.add(f"{path.name}'s remove_extra_whitespaces", "text with runs of spaces or leading/trailing spaces")


def _apply_added_tokens(vocab: Vocabulary, added: list[AddedToken], source: Path) -> None:
    """Added tokens override the model's pieces, as in transformers. Unknown and byte pieces keep
    their type when the text is unchanged."""
    for token in added:
        token_id, text = token.id, token.content
        same_text = token_id < len(vocab) and vocab.tokens[token_id] == text
        if same_text and vocab.types[token_id] in (TokenType.UNKNOWN, TokenType.BYTE):
            continue
        if same_text and token.special is None:
            continue  # added_tokens.json restating a piece says nothing new
        token_type = added_token_type(text, bool(token.special))
        if token_type == TokenType.USER_DEFINED:
            # llama.cpp matches user-defined tokens against the raw text, which has real spaces.
            text = text.replace(_WHITESPACE_MARK, " ")
        if token_id < len(vocab) and vocab.tokens[token_id] != text and vocab.types[token_id] != TokenType.UNUSED:
            log.info("%s: token %d %r is replaced by added token %r", source, token_id, vocab.tokens[token_id], text)
        vocab.set_token(token_id, text, token_type, ADDED_TOKEN_SCORE)


def added_token_entries(model_dir: Path, files: TokenizerFiles, tokenizer_json: dict[str, Any]) -> list[AddedToken]:
    """Added tokens from added_tokens.json, tokenizer.json and tokenizer_config.json, in that order."""
    return (
        added_tokens_file(model_dir / ADDED_TOKENS)
        + tokenizer_json_added_tokens(tokenizer_json, model_dir / TOKENIZER_JSON)
        + config_added_tokens(files.tokenizer_config, model_dir / TOKENIZER_CONFIG)
    )


def load_sentencepiece_vocabulary(
    model_dir: Path, files: TokenizerFiles, model_path: Path, tokenizer_json: dict[str, Any],
    differences: TokenizationDifferences,
) -> tuple[Vocabulary, dict[str, int]]:
    """The vocabulary of a SentencePiece BPE model, and the special ids the model itself declares.
    `tokenizer_json` ({} if none) contributes its added tokens, as transformers' fast tokenizer does."""
    proto = load_model_proto(model_path)
    _check_supported(proto, model_path, differences)
    vocab = Vocabulary(model="llama", pre="default", source=model_path, scores=[])
    for token_id, piece in enumerate(proto.pieces):
        token_type = _SP_PIECE_TYPES.get(piece.type, TokenType.NORMAL)
        text = piece.piece
        if token_type == TokenType.USER_DEFINED:
            # sentencepiece matches user-defined symbols in text whose spaces are "▁"; llama.cpp
            # matches them in the raw text, so "▁myword" must read " myword" there.
            text = text.replace(_WHITESPACE_MARK, " ")
        elif token_type == TokenType.BYTE and not _BYTE_PIECE.fullmatch(text):
            # llama.cpp reads a byte token's value from its text and fails on any other spelling.
            raise TokenizerError(f"{model_path}: byte piece {token_id} is {text!r:.40}, not <0xXX>")
        vocab.set_token(token_id, text, token_type, piece.score)
    added = added_token_entries(model_dir, files, tokenizer_json)
    note_space_stripping(added, differences)
    _apply_added_tokens(vocab, added, model_path)

    note_spacing_after_special_tokens(files, differences)
    add_prefix = get_typed(files.tokenizer_config, "add_prefix_space", bool, model_dir / TOKENIZER_CONFIG)
    vocab.add_space_prefix = proto.normalizer_spec.add_dummy_prefix if add_prefix is None else add_prefix
    vocab.remove_extra_whitespaces = proto.normalizer_spec.remove_extra_whitespaces

    # transformers' LlamaTokenizer defaults to the model's <unk>, <s> and </s>, and to no pad token.
    spec = proto.trainer_spec
    declared = {"unk": spec.unk_id, "bos": spec.bos_id, "eos": spec.eos_id}
    return vocab, {role: i for role, i in declared.items() if 0 <= i < len(proto.pieces)}
