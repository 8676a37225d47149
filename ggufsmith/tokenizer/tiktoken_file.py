"""Llama 3's tokenizer.model as Meta publishes it: a tiktoken BPE file, one "<base64 bytes> <rank>"
line per token, with the special tokens and the pre-tokenizer regex defined by Meta's tokenizer
code rather than by the file.

It is described here as the tokenizer.json transformers' converter (TikTokenConverter) makes of it,
so that the one byte-level BPE exporter (bpe.py) checks and exports it: each token's bytes in GPT-2's
byte-to-character alphabet, the merges that rebuild every token from two tokens of lower rank (in
rank order: tiktoken merges the pair whose result has the lowest rank first), ignore_merges (tiktoken
takes a word that is a whole token as it is), Llama 3's pre-tokenizer regex, and the 256 special
tokens after the ranks, named as Meta's code names them, `<|begin_of_text|>` added at the start.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError

from .hf_files import TokenizerFiles
from .pretokenizer import LLAMA3_REGEX
from .tokenizer_json import check_tokenizer_json

PARAMS_JSON = "params.json"
_LINE = re.compile(rb"([A-Za-z0-9+/]+=*) (\d+)")
N_SPECIAL_TOKENS = 256  # Meta's Llama 3 tokenizer reserves 256 ids after the BPE ranks
BEGIN_OF_TEXT, END_OF_TEXT = "<|begin_of_text|>", "<|end_of_text|>"

# The named special tokens at the start of the 256, in id order; the others are
# <|reserved_special_token_N|>. Llama 3.0 named fewer of them than Llama 3.1 and later.
_LLAMA30_NAMED = (BEGIN_OF_TEXT, END_OF_TEXT, "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                  "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>")
_LLAMA31_NAMED = (BEGIN_OF_TEXT, END_OF_TEXT, "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                  "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")


def is_tiktoken_file(path: Path) -> bool:
    """Whether `path` starts like a tiktoken BPE file (a base64 token and its rank)."""
    try:
        with open(path, "rb") as f:
            first = f.readline().rstrip(b"\r\n")
    except OSError:
        return False
    return bool(_LINE.fullmatch(first))


def read_ranks(path: Path) -> list[bytes]:
    """The tokens of a tiktoken file in rank order (ranks must be 0, 1, 2, ... with no gap)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None
    tokens: list[bytes] = []
    seen: set[bytes] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        match = _LINE.fullmatch(line.rstrip(b"\r"))
        if match is None:
            raise TokenizerError(f"{path}: line {number} is not '<base64 token> <rank>'; the tiktoken file is damaged")
        try:
            token = base64.b64decode(match.group(1), validate=True)
        except binascii.Error:
            raise TokenizerError(f"{path}: line {number}: the token is not valid base64") from None
        if int(match.group(2)) != len(tokens):
            raise TokenizerError(f"{path}: line {number} has rank {int(match.group(2))}, expected {len(tokens)}: "
                                 "ranks must count up from 0")
        if not token or token in seen:
            raise TokenizerError(f"{path}: line {number}: token {token!r} is empty or listed twice")
        seen.add(token)
        tokens.append(token)
    missing = [b for b in range(256) if bytes([b]) not in seen]
    if missing:
        raise TokenizerError(f"{path}: byte 0x{missing[0]:02x} is not a token; a byte-level BPE has all 256 bytes")
    return tokens


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: byte b -> a printable character (printable Latin-1 bytes stand
    for themselves, the others take the characters from U+0100 on, in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, extra = {}, 0
    for b in range(256):
        if b in printable:
            alphabet[b] = chr(b)
        else:
            alphabet[b] = chr(256 + extra)
            extra += 1
    return [alphabet[b] for b in range(256)]


def _merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) pair of tokens that joins into a token of higher rank, ordered by the
    joined token's rank, then by the ranks of left and right."""
    rank = {token: i for i, token in enumerate(tokens)}
    merges = []
    for token in tokens:
        pairs = [(token[:cut], token[cut:]) for cut in range(1, len(token))
                 if token[:cut] in rank and token[cut:] in rank]
        merges += sorted(pairs, key=lambda pair: (rank[pair[0]], rank[pair[1]]))
    return merges


def special_token_names(model_dir: Path) -> list[str]:
    """The 256 special tokens of Meta's Llama 3 tokenizer; params.json's use_scaled_rope tells
    Llama 3.1 and later (which named more of them) from Llama 3.0."""
    named = _LLAMA30_NAMED
    params = model_dir / PARAMS_JSON
    try:
        if params.is_file() and json.loads(params.read_text()).get("use_scaled_rope") is True:
            named = _LLAMA31_NAMED
    except (OSError, ValueError, AttributeError):
        pass  # readers/meta.py reports a damaged params.json
    reserved = iter(range(len([n for n in named if "reserved" in n]), N_SPECIAL_TOKENS))
    return [*named, *(f"<|reserved_special_token_{next(reserved)}|>" for _ in range(N_SPECIAL_TOKENS - len(named)))]


def tokenizer_json_from_tiktoken(path: Path, model_dir: Path) -> tuple[dict[str, Any], TokenizerFiles]:
    """The tokenizer.json transformers' converter makes of Meta's Llama 3 tokenizer.model, and the
    config files it saves with it (bos <|begin_of_text|> added, eos <|end_of_text|>)."""
    tokens = read_ranks(path)
    alphabet = _byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): i for i, token in enumerate(tokens)}
    specials = special_token_names(model_dir)
    added = [{"id": len(tokens) + i, "content": name, "special": True, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False} for i, name in enumerate(specials)]
    bos_id = len(tokens)
    tokenizer_json = {
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {BEGIN_OF_TEXT: {"id": BEGIN_OF_TEXT, "ids": [bos_id],
                                                              "tokens": [BEGIN_OF_TEXT]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[text(left), text(right)] for left, right in _merges(tokens)]},
    }
    check_tokenizer_json(tokenizer_json, path)
    files = TokenizerFiles(model_dir, tokenizer_config={"bos_token": BEGIN_OF_TEXT, "eos_token": END_OF_TEXT,
                                                        "add_bos_token": True, "add_eos_token": False})
    return tokenizer_json, files
