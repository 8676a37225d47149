"""A byte-level BPE published as the "slow" tokenizer files: vocab.json + merges.txt, without a
tokenizer.json (many GPT-2, GPT-J, CodeGen and Whisper folders).

transformers builds its tokenizer from these files in a fixed way (GPT2Tokenizer and its kin): a BPE
model over the vocabulary and merges, the GPT-2 ByteLevel pre-tokenizer (with the folder's
`add_prefix_space`), a ByteLevel decoder, and as added tokens the entries of added_tokens.json plus
every special token the configs name. We describe that tokenizer as the tokenizer.json transformers
would have written, so the one byte-level BPE exporter (bpe.py) checks and exports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError

from .hf_files import (
    ADDED_TOKENS,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TokenizerFiles,
    added_tokens_file,
    read_json_object,
    token_content,
)
from .tokenizer_json import check_tokenizer_json

VOCAB_JSON = "vocab.json"
MERGES_TXT = "merges.txt"

# tokenizer_config.json's tokenizer_class values that build their tokenizer from these files as
# GPT2Tokenizer does, adding nothing around a sequence unless add_bos_token / add_eos_token say so.
# (RoBERTa-style classes add their own <s>, </s>, <mask> tokens: not supported, they are encoders.)
GPT2_STYLE_CLASSES = frozenset({"GPT2Tokenizer", "CodeGenTokenizer", "WhisperTokenizer"})
# Names under which special tokens are listed besides the <role>_token entries.
_SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def has_bpe_vocab_files(model_dir: Path) -> bool:
    return (model_dir / VOCAB_JSON).is_file() and (model_dir / MERGES_TXT).is_file()


def _read_merges(path: Path) -> list[str]:
    """The "left right" lines of merges.txt; the "#version" header and blank lines are skipped, as
    transformers skips them."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read merges ({e})") from e
    merges = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{path}: line {number} {line!r:.60} is not a merge of two tokens 'left right'")
        merges.append(line)
    return merges


def _special_texts(files: TokenizerFiles) -> set[str]:
    """Every token text the configs name as special: <role>_token entries and the additional
    (transformers 4) or extra (transformers 5) special tokens, from tokenizer_config.json and
    special_tokens_map.json."""
    texts: set[str] = set()
    for name, source in ((TOKENIZER_CONFIG, files.tokenizer_config), (SPECIAL_TOKENS_MAP, files.special_tokens_map)):
        where = files.model_dir / name
        entries = [(f"{role}_token", source.get(f"{role}_token")) for role in _SPECIAL_ROLES]
        for key in ("additional_special_tokens", "extra_special_tokens"):
            extra = source.get(key)
            entries += [(f"{key}[{i}]", entry) for i, entry in enumerate(extra)] if isinstance(extra, list) else []
        texts.update(text for text in (token_content(entry, where, key) for key, entry in entries) if text)
    return texts


def _check_tokenizer_class(files: TokenizerFiles) -> None:
    """The transformers class that reads these files; GPT2Tokenizer when the folder does not say
    (transformers then picks it from config.json's model_type, a GPT-2-style one for these files)."""
    name = files.tokenizer_config.get("tokenizer_class")
    if name is None:
        return
    name = str(name).removesuffix("Fast")
    if name not in GPT2_STYLE_CLASSES:
        known = ", ".join(sorted(GPT2_STYLE_CLASSES))
        raise TokenizerError(
            f"{files.model_dir / TOKENIZER_CONFIG}: tokenizer_class {name!r} with {VOCAB_JSON} + {MERGES_TXT} is not "
            f"supported (known: {known}); save the tokenizer with transformers to get a tokenizer.json"
        )


def tokenizer_json_from_vocab_files(model_dir: Path, files: TokenizerFiles) -> dict[str, Any]:
    """The tokenizer.json transformers builds from vocab.json + merges.txt and the config files."""
    _check_tokenizer_class(files)
    vocab = read_json_object(model_dir / VOCAB_JSON)  # its ids are checked with the rest below
    merges = _read_merges(model_dir / MERGES_TXT)

    added_json = {token.content: token.id for token in added_tokens_file(model_dir / ADDED_TOKENS)}
    specials = _special_texts(files)
    # Special tokens already in vocab.json (GPT-2's <|endoftext|>) become added tokens too: transformers
    # matches them whole in the text.
    ids = {text: i for text, i in vocab.items() if text in specials} | added_json
    added_tokens = [
        {"id": i, "content": text, "special": text in specials, "single_word": False,
         "lstrip": False, "rstrip": False, "normalized": text not in specials}
        for text, i in sorted(ids.items(), key=lambda item: item[1])
    ]
    add_prefix_space = files.tokenizer_config.get("add_prefix_space", False)
    tokenizer_json = {
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,  # transformers builds it from add_bos_token / add_eos_token
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    check_tokenizer_json(tokenizer_json, model_dir / VOCAB_JSON)
    return tokenizer_json
