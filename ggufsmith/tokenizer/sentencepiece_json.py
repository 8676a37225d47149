"""A SentencePiece-style BPE tokenizer.json (no tokenizer.model) -> llama.cpp's "llama" tokenizer.

transformers 5 saves Llama/Mistral-family tokenizers as tokenizer.json only: a BPE model with
byte_fallback over text whose spaces are replaced by "▁" (Metaspace, or the older normalizer
Prepend + Replace; Gemma's: Replace, then a Split on " " that finds no space left). llama.cpp's
SPM tokenizer merges the adjacent pair whose joined text has the highest score, so each token's
score is minus the rank of the first merge that produces it: the same order in which the BPE model
applies its merges.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .differences import (
    TokenizationDifferences,
    hf_normalizer_text,
    note_space_stripping,
    note_spacing_after_special_tokens,
)
from .hf_files import TokenizerFiles, tokenizer_json_added_tokens
from .tokenizer_json import component_steps
from .vocab import ADDED_TOKEN_SCORE, PAD_SCORE, Vocabulary, added_token_type

_WHITESPACE_MARK = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def is_sentencepiece_style(tokenizer_json: dict[str, Any]) -> bool:
    model = tokenizer_json.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


def _is_split_on_space(pre: dict[str, Any] | None) -> bool:
    """Gemma's pre-tokenizer: Split on the string " ". It runs after the normalizer has replaced every
    space by "▁", so it never splits anything."""
    return bool(pre) and pre.get("type") == "Split" and pre.get("pattern") == {"String": " "} and not pre.get("invert")


def _is_space_replace(step: dict[str, Any]) -> bool:
    return (step.get("type") == "Replace" and step.get("pattern") == {"String": " "}
            and step.get("content") == _WHITESPACE_MARK)


def space_prefix(
    tokenizer_json: dict[str, Any], path: Path, files: TokenizerFiles, differences: TokenizationDifferences
) -> bool:
    """Whether a "▁" is put before the text, from Metaspace or the older Prepend normalizer."""
    pre = tokenizer_json.get("pre_tokenizer")
    norm_steps = component_steps(tokenizer_json.get("normalizer"), "normalizers", path, "normalizer")
    if _is_split_on_space(pre) and any(_is_space_replace(step) for step in norm_steps):
        pre = None
    if pre:
        if pre.get("type") != "Metaspace" or pre.get("replacement", _WHITESPACE_MARK) != _WHITESPACE_MARK:
            raise TokenizerError(
                f"{path}: SentencePiece-style BPE with pre-tokenizer {pre.get('type')!r} is not supported"
            )
        if pre.get("split", False):
            raise TokenizerError(
                f"{path}: Metaspace with split=true is not supported (llama.cpp never splits on spaces)"
            )
        for step in norm_steps:
            differences.add(f"{path.name}'s normalizer {step['type']}", hf_normalizer_text(step))
        note_spacing_after_special_tokens(files, differences, path, pre.get("prepend_scheme", "always"))
        return pre.get("prepend_scheme", "always") != "never"
    prepend = replaces_spaces = False
    for step in norm_steps:
        kind = step["type"]
        if kind == "Prepend" and step.get("prepend") == _WHITESPACE_MARK:
            prepend = True
        elif _is_space_replace(step):
            replaces_spaces = True
        else:
            differences.add(f"{path.name}'s normalizer {kind}", hf_normalizer_text(step))
    if not replaces_spaces:
        # llama.cpp's SentencePiece tokenizer always writes spaces as "▁": another tokenizer.
        raise TokenizerError(f"{path}: BPE with byte_fallback but no '▁' space handling is not supported")
    return prepend


def load_sentencepiece_json_vocabulary(
    path: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles, differences: TokenizationDifferences
) -> Vocabulary:
    """The vocabulary of a checked SentencePiece-style tokenizer.json (tokenizer_json.check_tokenizer_json)."""
    model = tokenizer_json.get("model") or {}
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise TokenizerError(f"{path}: BPE {option}={model[option]!r} is not supported by llama.cpp")
    if model.get("dropout"):
        differences.add(f"{path.name}'s BPE dropout={model['dropout']}",
                        "every text (transformers picks merges at random; llama.cpp always applies them all)")
    if model.get("ignore_merges"):
        differences.add(f"{path.name}'s BPE ignore_merges",
                        "words that are whole tokens of the vocabulary but that the merges split otherwise")
    vocab = Vocabulary(model="llama", pre="default", source=path, scores=[])
    vocab.add_space_prefix = space_prefix(tokenizer_json, path, files, differences)
    vocab.remove_extra_whitespaces = False

    first_rank: dict[str, int] = {}
    for rank, merge in enumerate(model.get("merges") or []):
        if isinstance(merge, str) and " " in merge:
            left, right = merge.split(" ", 1)
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(part, str) for part in merge):
            left, right = merge
        else:
            raise TokenizerError(f"{path}: model.merges[{rank}] {merge!r:.60} is neither \"left right\" nor [left, right]")
        first_rank.setdefault(left + right, rank)
    unk = model.get("unk_token")
    for text, token_id in sorted((model.get("vocab") or {}).items(), key=lambda item: item[1]):
        if text == unk:
            token_type = TokenType.UNKNOWN
        elif _BYTE_TOKEN.fullmatch(text):
            token_type = TokenType.BYTE
        else:
            token_type = TokenType.NORMAL
        # Tokens no merge produces are single characters (or specials): their score is never used
        # to pick a merge, so they sort after every merge.
        score = -float(first_rank[text]) if text in first_rank else PAD_SCORE
        vocab.set_token(token_id, text, token_type, score)

    added = tokenizer_json_added_tokens(tokenizer_json, path)
    note_space_stripping(added, differences)
    for token in sorted(added, key=lambda token: token.id):
        text = token.content
        restated = token.id < len(vocab) and vocab.tokens[token.id] == text
        if restated and vocab.types[token.id] in (TokenType.UNKNOWN, TokenType.BYTE):
            continue
        token_type = added_token_type(text, bool(token.special))
        if token_type == TokenType.USER_DEFINED:
            text = text.replace(_WHITESPACE_MARK, " ")
        vocab.set_token(token.id, text, token_type, ADDED_TOKEN_SCORE)
    return vocab
