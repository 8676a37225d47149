"""Hugging Face tokenizer.json with a byte-level BPE model -> llama.cpp's "gpt2" tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .differences import TokenizationDifferences, hf_normalizer_text, note_space_stripping
from .hf_files import TOKENIZER_CONFIG, TokenizerFiles, config_added_tokens, get_typed, tokenizer_json_added_tokens
from .pretokenizer import identify_pre_tokenizer
from .tokenizer_json import component_steps
from .vocab import Vocabulary, added_token_type



def _check_normalizer(normalizer: dict[str, Any] | None, path: Path, differences: TokenizationDifferences) -> None:
    """llama.cpp's BPE tokenizer normalizes nothing: each normalizer step is a difference."""
    for step in component_steps(normalizer, "normalizers", path, "normalizer"):
        differences.add(f"{path.name}'s normalizer {step['type']}", hf_normalizer_text(step))


def _check_model(model: dict[str, Any], path: Path, differences: TokenizationDifferences) -> None:
    kind = model.get("type")
    if kind != "BPE":
        raise TokenizerError(f"{path}: {kind} tokenizer model is not supported (only byte-level BPE)")
    if model.get("dropout"):
        differences.add(f"{path.name}'s BPE dropout={model['dropout']}",
                        "every text (transformers picks merges at random; llama.cpp always applies them all)")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            # Every word's pieces would be spelled differently: another tokenizer, not a difference.
            raise TokenizerError(f"{path}: BPE {option}={model[option]!r} is not supported by llama.cpp")
    if model.get("byte_fallback"):
        raise TokenizerError(
            f"{path}: BPE with byte_fallback is a SentencePiece-style tokenizer, exported as kind 'llama', "
            "not 'gpt2'"
        )


def _check_decoder(decoder: dict[str, Any] | None, path: Path, differences: TokenizationDifferences) -> None:
    for step in component_steps(decoder, "decoders", path, "decoder"):
        if step["type"] != "ByteLevel":
            differences.add(f"{path.name}'s decoder {step['type']}",
                            "the text of generated tokens (llama.cpp decodes byte-level BPE only)")


def bpe_merges(model: dict[str, Any], path: Path) -> list[str]:
    """Merges as the "left right" strings llama.cpp splits at the first space."""
    merges = []
    for merge in model.get("merges") or []:
        if isinstance(merge, str):  # the older "left right" form
            left, _, right = merge.partition(" ")
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(part, str) for part in merge):
            left, right = merge
        else:
            raise TokenizerError(f"{path}: merge {merge!r:.60} is neither \"left right\" nor [left, right]")
        if not left or not right or " " in left or " " in right:
            raise TokenizerError(
                f"{path}: merge {merge!r:.60} has an empty part or a space, which llama.cpp cannot represent"
            )
        merges.append(f"{left} {right}")
    return merges


def load_bpe_vocabulary(
    path: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles, differences: TokenizationDifferences
) -> Vocabulary:
    """The byte-level BPE vocabulary of a checked tokenizer.json (see tokenizer_json.check_tokenizer_json)."""
    model = tokenizer_json.get("model") or {}
    _check_model(model, path, differences)
    _check_normalizer(tokenizer_json.get("normalizer"), path, differences)
    _check_decoder(tokenizer_json.get("decoder"), path, differences)
    config_path = files.model_dir / TOKENIZER_CONFIG
    clean_spaces = get_typed(files.tokenizer_config, "clean_up_tokenization_spaces", bool, config_path)
    pre = identify_pre_tokenizer(
        tokenizer_json.get("pre_tokenizer"),
        path,
        ignore_merges=bool(model.get("ignore_merges", False)),
        clean_spaces=clean_spaces,
        model_type=files.model_type,
    )
    vocab = Vocabulary(model="gpt2", pre=pre, source=path, merges=bpe_merges(model, path))
    for text, token_id in sorted((model.get("vocab") or {}).items(), key=lambda item: item[1]):
        vocab.set_token(token_id, text, TokenType.NORMAL)

    added = tokenizer_json_added_tokens(tokenizer_json, path)
    known_ids = {token.id for token in added}
    added += [token for token in config_added_tokens(files.tokenizer_config, config_path) if token.id not in known_ids]
    note_space_stripping(added, differences)
    for token in sorted(added, key=lambda token: token.id):
        vocab.set_token(token.id, token.content, added_token_type(token.content, bool(token.special)))
    return vocab
