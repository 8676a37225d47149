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

from .hf_files import TokenizerFiles
from .vocab import ADDED_TOKEN_SCORE, PAD_SCORE, Vocabulary, added_token_type

_WHITESPACE_MARK = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def is_sentencepiece_style(tokenizer_json: dict[str, Any]) -> bool:
    model = tokenizer_json.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


def _steps(component: dict[str, Any] | None, list_name: str) -> list[dict[str, Any]]:
    if not component:
        return []
    return list(component.get(list_name) or []) if component.get("type") == "Sequence" else [component]


def _is_split_on_space(pre: dict[str, Any] | None) -> bool:
    """Gemma's pre-tokenizer: Split on the string " ". It runs after the normalizer has replaced every
    space by "▁", so it never splits anything."""
    return bool(pre) and pre.get("type") == "Split" and pre.get("pattern") == {"String": " "} and not pre.get("invert")


def _is_space_replace(step: dict[str, Any]) -> bool:
    return (step.get("type") == "Replace" and step.get("pattern") == {"String": " "}
            and step.get("content") == _WHITESPACE_MARK)


def space_prefix(tokenizer_json: dict[str, Any], path: Path) -> bool:
    """Whether a "▁" is put before the text, from Metaspace or the older Prepend normalizer. Raises
    for space handling llama.cpp cannot reproduce."""
    pre = tokenizer_json.get("pre_tokenizer")
    norm_steps = _steps(tokenizer_json.get("normalizer"), "normalizers")
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
        if norm_steps:
            raise TokenizerError(f"{path}: normalizer {norm_steps[0].get('type')!r} is not applied by llama.cpp")
        return pre.get("prepend_scheme", "always") != "never"
    prepend = False
    for step in norm_steps:
        kind = step.get("type")
        if kind == "Prepend" and step.get("prepend") == _WHITESPACE_MARK:
            prepend = True
        elif _is_space_replace(step):
            continue
        else:
            raise TokenizerError(f"{path}: normalizer {kind!r} is not applied by llama.cpp's SentencePiece tokenizer")
    if not norm_steps:
        raise TokenizerError(f"{path}: BPE with byte_fallback but no '▁' space handling is not supported")
    return prepend


def load_sentencepiece_json_vocabulary(path: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles) -> Vocabulary:
    model = tokenizer_json.get("model") or {}
    for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise TokenizerError(f"{path}: BPE {option}={model[option]!r} is not supported by llama.cpp")
    if model.get("ignore_merges"):
        raise TokenizerError(f"{path}: BPE ignore_merges has no equivalent in llama.cpp's SentencePiece tokenizer")
    vocab = Vocabulary(model="llama", pre="default", source=path, scores=[])
    vocab.add_space_prefix = space_prefix(tokenizer_json, path)
    vocab.remove_extra_whitespaces = False

    first_rank: dict[str, int] = {}
    for rank, merge in enumerate(model.get("merges") or []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
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
        vocab.set_token(int(token_id), text, token_type, score)

    for item in sorted(tokenizer_json.get("added_tokens") or [], key=lambda t: int(t["id"])):
        token_id, text = int(item["id"]), item["content"]
        restated = token_id < len(vocab) and vocab.tokens[token_id] == text
        if restated and vocab.types[token_id] in (TokenType.UNKNOWN, TokenType.BYTE):
            continue
        token_type = added_token_type(text, bool(item.get("special")))
        if token_type == TokenType.USER_DEFINED:
            text = text.replace(_WHITESPACE_MARK, " ")
        vocab.set_token(token_id, text, token_type, ADDED_TOKEN_SCORE)
    return vocab
