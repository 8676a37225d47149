"""Special token ids, add_bos/add_eos, and the end-of-generation / fill-in-the-middle tokens."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ggufsmith.constants import Keys, TokenType
from ggufsmith.gguf_writer.metadata import Metadata

from .end_of_generation import extra_end_of_generation_ids
from .hf_files import (
    CONFIG,
    GENERATION_CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    TokenizerFiles,
    get_typed,
    token_content,
    typed,
)
from .tokenizer_json import component_steps
from .vocab import Vocabulary

log = logging.getLogger(__name__)

# The special-token roles transformers names `<role>_token` / `<role>_token_id`, and their keys.
ROLE_KEYS: dict[str, str] = {
    "bos": Keys.Tokenizer.BOS_ID,
    "eos": Keys.Tokenizer.EOS_ID,
    "unk": Keys.Tokenizer.UNK_ID,
    "sep": Keys.Tokenizer.SEP_ID,
    "pad": Keys.Tokenizer.PAD_ID,
    "cls": Keys.Tokenizer.CLS_ID,
    "mask": Keys.Tokenizer.MASK_ID,
}

# Roles llama.cpp finds by token text at load time (llama-vocab.cpp). We write them explicitly so the
# file says what it means; llama.cpp would pick the same tokens. Within a role, earlier texts win.
TEXT_ROLES: dict[str, tuple[str, ...]] = {
    Keys.Tokenizer.EOT_ID: (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
        "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
    ),
    Keys.Tokenizer.EOM_ID: ("<|eom_id|>",),
    Keys.Tokenizer.FIM_PRE_ID: (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>",
    ),
    Keys.Tokenizer.FIM_SUF_ID: (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>",
    ),
    Keys.Tokenizer.FIM_MID_ID: (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>",
    ),
    Keys.Tokenizer.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    Keys.Tokenizer.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    Keys.Tokenizer.FIM_SEP_ID: ("<|file_sep|>",),
}
_ADDED_TYPES = (TokenType.CONTROL, TokenType.USER_DEFINED)


def _config_id(config: Mapping[str, Any], role: str, where: Path) -> int | None:
    key = f"{role}_token_id"
    value = typed(config.get(key), (int, list), where, key)
    text_config = typed(config.get("text_config"), dict, where, "text_config")
    if value is None and text_config:
        key = f"text_config.{key}"
        value = typed(text_config.get(f"{role}_token_id"), (int, list), where, key)
    if isinstance(value, list):
        # generation_config's several eos ids name no single token; llama.cpp finds the others as
        # end-of-generation tokens by their text.
        for i, item in enumerate(value):
            typed(item, int, where, f"{key}[{i}]")
        return None
    return value


def resolve_special_ids(
    files: TokenizerFiles, vocab: Vocabulary, fallback_ids: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Role -> token id. Sources in order: tokenizer_config.json `<role>_token` (text),
    special_tokens_map.json, config.json `<role>_token_id`, generation_config.json, then
    `fallback_ids` (e.g. the ids a SentencePiece model declares)."""
    id_of = vocab.id_of()
    ids: dict[str, int] = {}
    for role in ROLE_KEYS:
        candidates: list[tuple[str, int | None]] = []
        for source, name in ((files.tokenizer_config, TOKENIZER_CONFIG), (files.special_tokens_map, SPECIAL_TOKENS_MAP)):
            text = token_content(source.get(f"{role}_token"), files.model_dir / name, f"{role}_token")
            if text is not None:
                candidates.append((f"'{text}'", id_of.get(text)))
        candidates.append(("config.json", _config_id(files.config, role, files.model_dir / CONFIG)))
        candidates.append(("generation_config.json",
                           _config_id(files.generation_config, role, files.model_dir / GENERATION_CONFIG)))
        candidates.append(("tokenizer model", (fallback_ids or {}).get(role)))
        for where, token_id in candidates:
            if token_id is None:
                continue
            if 0 <= token_id < len(vocab):
                ids[role] = token_id
                break
            log.warning("%s: %s token %s id %d is outside the vocabulary; ignored", vocab.source, role, where, token_id)
    return ids


def text_role_ids(vocab: Vocabulary) -> dict[str, int]:
    """EOT/EOM/FIM key -> id of the added token whose text names that role."""
    id_of = vocab.id_of()
    found: dict[str, int] = {}
    for key, texts in TEXT_ROLES.items():
        for text in texts:
            token_id = id_of.get(text)
            if token_id is not None and vocab.types[token_id] in _ADDED_TYPES:
                found[key] = token_id
                break
    return found


def post_processor_adds(
    post_processor: Mapping[str, Any] | None, bos: str | None, eos: str | None, source: Path
) -> dict[str, bool]:
    """Whether tokenizer.json's post_processor puts the bos/eos token around a single sequence
    ({} when there is no post_processor, so the caller falls back to tokenizer_config.json)."""
    if not post_processor:
        return {}
    adds: dict[str, bool] = {}
    for processor in component_steps(post_processor, "processors", source, "post_processor"):
        kind = processor.get("type")
        if kind == "ByteLevel":
            adds = {"bos": False, "eos": False} | adds
        elif kind in ("RobertaProcessing", "BertProcessing"):
            adds = {"bos": True, "eos": True}
        elif kind == "TemplateProcessing":
            single = [(piece.get("SpecialToken") or {}).get("id") for piece in processor.get("single") or []]
            adds = {"bos": bool(single) and single[0] is not None and single[0] == bos,
                    "eos": bool(single) and single[-1] is not None and single[-1] == eos}
            if single and single[0] is not None and single[0] != bos:
                log.warning("post_processor starts sequences with %r, which is not the bos token", single[0])
    return adds


def add_special_tokens_metadata(
    metadata: Metadata,
    files: TokenizerFiles,
    vocab: Vocabulary,
    *,
    default_add_bos: bool,
    default_add_eos: bool,
    post_processor: Mapping[str, Any] | None = None,
    fallback_ids: Mapping[str, int] | None = None,
    add_sep: bool | None = None,
) -> None:
    ids = resolve_special_ids(files, vocab, fallback_ids)
    for role, token_id in ids.items():
        metadata.add_uint32(ROLE_KEYS[role], token_id)
    roles = text_role_ids(vocab) | extra_end_of_generation_ids(files, vocab, ids.get("eos"))
    for key, token_id in roles.items():
        metadata.add_uint32(key, token_id)

    bos_text = vocab.tokens[ids["bos"]] if "bos" in ids else None
    eos_text = vocab.tokens[ids["eos"]] if "eos" in ids else None
    from_post_processor = post_processor_adds(post_processor, bos_text, eos_text, files.model_dir / TOKENIZER_JSON)
    add_keys = (("bos", Keys.Tokenizer.ADD_BOS, default_add_bos), ("eos", Keys.Tokenizer.ADD_EOS, default_add_eos))
    for role, key, default in add_keys:
        configured = get_typed(files.tokenizer_config, f"add_{role}_token", bool, files.model_dir / TOKENIZER_CONFIG)
        if role in from_post_processor:
            # transformers (v5) runs tokenizer.json's post_processor as is and ignores add_<role>_token.
            value = from_post_processor[role]
        elif configured is not None:
            value = configured
        else:
            value = default
        if value and role not in ids:
            log.warning("%s: add_%s_token is set but there is no %s token; not adding it", vocab.source, role, role)
            value = False
        metadata.add_bool(key, value)
    if add_sep is not None:
        metadata.add_bool(Keys.Tokenizer.ADD_SEP, add_sep)
