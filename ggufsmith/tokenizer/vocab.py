"""The vocabulary both tokenizer kinds build, and the GGUF keys it becomes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGUFValueType, Keys, TokenType
from ggufsmith.errors import TokenizerError
from ggufsmith.gguf_writer.metadata import Metadata

# What llama.cpp's converter gives ids the tokenizer leaves unassigned; the score sorts them last.
PAD_SCORE = -10000.0
# Score of added (user-defined / control) tokens: below every merge, as llama.cpp's converter does.
ADDED_TOKEN_SCORE = -1000.0


def pad_token_text(token_id: int) -> str:
    return f"[PAD{token_id}]"


@dataclass
class Vocabulary:
    """Tokens by id with their types; scores for SentencePiece, merges for BPE."""

    model: str  # tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (byte-level BPE), "gemma4", "bert"
    pre: str | None  # tokenizer.ggml.pre; None: not written (llama.cpp sets it for the model)
    source: Path  # the file the vocabulary came from, for error messages
    tokens: list[str] = field(default_factory=list)
    types: list[TokenType] = field(default_factory=list)
    scores: list[float] | None = None
    merges: list[str] | None = None
    add_space_prefix: bool | None = None
    remove_extra_whitespaces: bool | None = None
    normalizer_lowercase: bool | None = None  # WordPiece's BertNormalizer options (model "bert")
    normalizer_strip_accents: bool | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def set_token(self, token_id: int, text: str, token_type: TokenType, score: float | None = None) -> None:
        """Assign `token_id`, first filling any gap before it with unused [PAD<id>] tokens."""
        while len(self.tokens) <= token_id:
            self._append_pad()
        self.tokens[token_id] = text
        self.types[token_id] = token_type
        if self.scores is not None:
            self.scores[token_id] = ADDED_TOKEN_SCORE if score is None else score

    def _append_pad(self) -> None:
        self.tokens.append(pad_token_text(len(self.tokens)))
        self.types.append(TokenType.UNUSED)
        if self.scores is not None:
            self.scores.append(PAD_SCORE)

    def pad_to(self, vocab_size: int) -> None:
        """Grow to the model's embedding rows (config.json vocab_size) with unused [PAD<id>] tokens."""
        if len(self.tokens) > vocab_size:
            raise TokenizerError(
                f"{self.source}: the tokenizer has {len(self.tokens)} tokens but the model's vocab_size is "
                f"{vocab_size}; the tokenizer does not belong to this model"
            )
        while len(self.tokens) < vocab_size:
            self._append_pad()

    def check_unique(self) -> None:
        """llama.cpp maps text to id and aborts on duplicate token texts; refuse them here instead."""
        counts = Counter(self.tokens)
        duplicates = [t for t, n in counts.items() if n > 1]
        if duplicates:
            # The ids tell the user which file repeats the text (an added token over a piece, ...).
            ids = {t: [i for i, text in enumerate(self.tokens) if text == t][:3] for t in duplicates[:3]}
            shown = ", ".join(f"{t!r} at ids {', '.join(map(str, where))}" for t, where in ids.items())
            raise TokenizerError(
                f"{self.source}: {len(duplicates)} token text(s) occur at more than one id ({shown}), with the "
                "added tokens of the tokenizer files; llama.cpp requires every token text to be unique"
            )

    def id_of(self) -> dict[str, int]:
        return {text: i for i, text in enumerate(self.tokens)}

    def to_metadata(self, metadata: Metadata) -> None:
        metadata.add_string(Keys.Tokenizer.MODEL, self.model)
        if self.pre is not None:
            metadata.add_string(Keys.Tokenizer.PRE, self.pre)
        metadata.add_array(Keys.Tokenizer.TOKENS, self.tokens, GGUFValueType.STRING)
        if self.scores is not None:
            metadata.add_array(Keys.Tokenizer.SCORES, np.asarray(self.scores, dtype=np.float32), GGUFValueType.FLOAT32)
        metadata.add_array(
            Keys.Tokenizer.TOKEN_TYPE, np.asarray([int(t) for t in self.types], dtype=np.int32), GGUFValueType.INT32
        )
        if self.merges is not None:
            metadata.add_array(Keys.Tokenizer.MERGES, self.merges, GGUFValueType.STRING)
        if self.add_space_prefix is not None:
            metadata.add_bool(Keys.Tokenizer.ADD_PREFIX, self.add_space_prefix)
        if self.remove_extra_whitespaces is not None:
            metadata.add_bool(Keys.Tokenizer.REMOVE_EXTRA_WS, self.remove_extra_whitespaces)
        if self.normalizer_lowercase is not None:
            metadata.add_bool(Keys.Tokenizer.NORMALIZER_LOWERCASE, self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None:
            metadata.add_bool(Keys.Tokenizer.NORMALIZER_STRIP_ACCENTS, self.normalizer_strip_accents)


# Texts of added tokens that act as control tokens even when the tokenizer does not flag them as
# special (the same rule llama.cpp's converter applies, so the C++ side sees what it expects).
_SPECIAL_LOOKING = frozenset({"<pad>", "<mask>", "<2mass>", "[@BOS@]"})


def looks_special(text: str) -> bool:
    return (
        text in _SPECIAL_LOOKING
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<｜") and text.endswith("｜>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def added_token_type(text: str, special: bool) -> TokenType:
    return TokenType.CONTROL if special or looks_special(text) else TokenType.USER_DEFINED
