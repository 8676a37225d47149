"""Hugging Face tokenizer.json with a byte-level BPE model -> llama.cpp's "gpt2" tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .hf_files import TokenizerFiles
from .pretokenizer import identify_pre_tokenizer
from .vocab import Vocabulary, added_token_type

log = logging.getLogger(__name__)

# Normalizers llama.cpp does not apply but that leave almost all real text unchanged (text already
# in NFC). Accepted with a warning; any other normalizer is rejected.
_TOLERATED_NORMALIZERS = {"NFC"}


def _check_normalizer(normalizer: dict[str, Any] | None, path: Path) -> None:
    if not normalizer:
        return
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    for step in steps:
        kind = step.get("type")
        if kind in _TOLERATED_NORMALIZERS:
            log.warning("%s: normalizer %s is not applied by llama.cpp; input that is not %s will tokenize "
                        "differently", path, kind, kind)
        else:
            raise TokenizerError(f"{path}: normalizer {kind!r} is not applied by llama.cpp's BPE tokenizer")


def _check_model(model: dict[str, Any], path: Path) -> None:
    kind = model.get("type")
    if kind != "BPE":
        raise TokenizerError(f"{path}: {kind} tokenizer model is not supported (only byte-level BPE)")
    if model.get("dropout"):
        raise TokenizerError(f"{path}: BPE dropout={model['dropout']} makes tokenization random; not supported")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise TokenizerError(f"{path}: BPE {option}={model[option]!r} is not supported by llama.cpp")
    if model.get("byte_fallback"):
        raise TokenizerError(
            f"{path}: BPE with byte_fallback is a SentencePiece-style tokenizer, exported as kind 'llama', "
            "not 'gpt2'"
        )


def _check_decoder(decoder: dict[str, Any] | None, path: Path) -> None:
    if not decoder:
        return
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    for step in steps:
        if step.get("type") != "ByteLevel":
            raise TokenizerError(f"{path}: decoder {step.get('type')!r} is not supported (only ByteLevel)")


def bpe_merges(model: dict[str, Any], path: Path) -> list[str]:
    """Merges as the "left right" strings llama.cpp splits at the first space."""
    merges = []
    for merge in model.get("merges") or []:
        if isinstance(merge, str):  # the older "left right" form
            left, _, right = merge.partition(" ")
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(part, str) for part in merge):
            left, right = merge
        else:
            raise TokenizerError(f"{path}: merge {merge!r} is neither \"left right\" nor [left, right]")
        if not left or not right or " " in left or " " in right:
            raise TokenizerError(
                f"{path}: merge {merge!r} has an empty part or a space, which llama.cpp cannot represent"
            )
        merges.append(f"{left} {right}")
    return merges


def load_bpe_vocabulary(path: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles) -> Vocabulary:
    model = tokenizer_json.get("model") or {}
    _check_model(model, path)
    _check_normalizer(tokenizer_json.get("normalizer"), path)
    _check_decoder(tokenizer_json.get("decoder"), path)
    clean_spaces = files.tokenizer_config.get("clean_up_tokenization_spaces")
    pre = identify_pre_tokenizer(
        tokenizer_json.get("pre_tokenizer"),
        path,
        ignore_merges=bool(model.get("ignore_merges", False)),
        clean_spaces=clean_spaces if isinstance(clean_spaces, bool) else None,
        model_type=files.model_type,
    )
    vocab = Vocabulary(model="gpt2", pre=pre, source=path, merges=bpe_merges(model, path))
    for text, token_id in sorted((model.get("vocab") or {}).items(), key=lambda item: item[1]):
        vocab.set_token(int(token_id), text, TokenType.NORMAL)

    added = [(int(t["id"]), t) for t in tokenizer_json.get("added_tokens") or []]
    known_ids = {i for i, _ in added}
    for token_id, item in (files.tokenizer_config.get("added_tokens_decoder") or {}).items():
        if int(token_id) not in known_ids and isinstance(item, dict):
            added.append((int(token_id), item))
    for token_id, item in sorted(added, key=lambda entry: entry[0]):
        text = item.get("content")
        if not isinstance(text, str) or not text:
            raise TokenizerError(f"{path}: added token {token_id} has no content")
        if item.get("lstrip") or item.get("rstrip"):
            log.warning("%s: added token %r strips neighbouring spaces in transformers; llama.cpp keeps them",
                        path, text)
        vocab.set_token(token_id, text, added_token_type(text, bool(item.get("special"))))
    return vocab
