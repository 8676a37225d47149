"""Gemma 4's tokenizer.json -> llama.cpp's "gemma4" tokenizer.

Gemma 4 ships a SentencePiece-style BPE (byte_fallback, spaces replaced by "▁", no "▁" put before
the text) whose merges are not ordered by token score, so llama.cpp's SPM tokenizer (which merges by
score) would not reproduce it. llama.cpp's "gemma4" tokenizer model (llama-vocab.cpp) is a BPE that
applies the merges by rank to the raw UTF-8 text with spaces escaped as "▁", falling back to the
<0xXX> byte tokens: what transformers does. It splits the text at newlines first and looks runs of
newlines up whole, so a merge that joins a newline with anything else is never applied: a
tokenization difference on the text around such newlines (Gemma 4's own tokenizer has none).

The tokens and their types are the SentencePiece-style ones (sentencepiece_json.py); the file also
carries the merges, and no scores (merges go by rank). It has no tokenizer.ggml.pre: llama.cpp sets
the pre-tokenizer of this model itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .bpe import bpe_merges
from .differences import TokenizationDifferences
from .hf_files import TokenizerFiles
from .sentencepiece_json import load_sentencepiece_json_vocabulary
from .vocab import Vocabulary

MODEL_NAME = "gemma4"
# Special tokens that Gemma 4's chat format needs to see in the generated text (channels, tool calls,
# the string quote): llama.cpp's converter types them USER_DEFINED so that llama.cpp renders them
# when detokenizing, where a CONTROL token would be dropped. Like every added token they are still
# matched whole in the input.
RENDERED_SPECIAL_TOKENS = frozenset({
    "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
})


def _note_newline_merges(merges: list[str], path: Path, differences: TokenizationDifferences) -> None:
    joined = (merge.replace(" ", "", 1) for merge in merges)
    across = [text for text in joined if "\n" in text and text.strip("\n")]
    if across:
        differences.add(f"{path.name}'s {len(across)} merge(s) joining a newline with other text ({across[0]!r}, ...)",
                        "text where they apply (llama.cpp's gemma4 tokenizer splits the text at newlines first)")


def load_gemma4_vocabulary(
    path: Path, tokenizer_json: dict[str, Any], files: TokenizerFiles, differences: TokenizationDifferences
) -> Vocabulary:
    vocab = load_sentencepiece_json_vocabulary(path, tokenizer_json, files, differences)
    if vocab.add_space_prefix:
        raise TokenizerError(
            f"{path}: the tokenizer puts a '▁' before the text, which llama.cpp's gemma4 tokenizer never does; "
            "export it as kind 'llama'"
        )
    vocab.model, vocab.pre, vocab.scores = MODEL_NAME, None, None
    vocab.add_space_prefix, vocab.remove_extra_whitespaces = False, None
    vocab.merges = bpe_merges(tokenizer_json.get("model") or {}, path)
    _note_newline_merges(vocab.merges, path, differences)
    for token_id, text in enumerate(vocab.tokens):
        if text in RENDERED_SPECIAL_TOKENS and vocab.types[token_id] == TokenType.CONTROL:
            vocab.types[token_id] = TokenType.USER_DEFINED
    return vocab
