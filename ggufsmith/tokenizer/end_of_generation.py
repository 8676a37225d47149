"""Several end-of-sequence ids (generation_config.json's `"eos_token_id": [a, b, c]`) made known to
llama.cpp.

transformers stops generating at any id of that list. llama.cpp stops at its end-of-generation set:
the eos, eot and eom ids of the file, plus every token whose text is in a fixed list compiled into
llama-vocab.cpp (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, ...). Most lists hold only such texts.
Those that do not (GLM-4 stops at `<|user|>` and `<|observation|>`) need the eot and eom keys, or
llama.cpp would write the next turn itself. Those keys then name the listed ids; what they named
before was found by its text, so llama.cpp still stops at it.
"""

from __future__ import annotations

import logging
from typing import Any

from ggufsmith.constants import Keys

from .hf_files import CONFIG, GENERATION_CONFIG, TokenizerFiles
from .vocab import Vocabulary

log = logging.getLogger(__name__)

# Token texts llama.cpp adds to its end-of-generation set when it loads a vocabulary (llama-vocab.cpp).
LLAMA_CPP_END_OF_GENERATION_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
# The keys that add one id each to llama.cpp's end-of-generation set, in the order they are given.
_SLOTS = (Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID)


def _listed_eos_ids(config: dict[str, Any]) -> list[int]:
    value = config.get("eos_token_id")
    text_config = config.get("text_config")
    if value is None and isinstance(text_config, dict):
        value = text_config.get("eos_token_id")
    if not isinstance(value, list):
        return []
    return [i for i in value if isinstance(i, int) and not isinstance(i, bool)]


def extra_end_of_generation_ids(files: TokenizerFiles, vocab: Vocabulary, eos_id: int | None) -> dict[str, int]:
    """eot / eom key -> id, for the listed end-of-sequence ids llama.cpp would not stop at."""
    listed = _listed_eos_ids(files.generation_config) + _listed_eos_ids(files.config)
    needed = [i for i in dict.fromkeys(listed)
              if i != eos_id and 0 <= i < len(vocab) and vocab.tokens[i] not in LLAMA_CPP_END_OF_GENERATION_TEXTS]
    slots = dict(zip(_SLOTS, needed))
    if len(needed) > len(_SLOTS):
        left = ", ".join(f"{i} {vocab.tokens[i]!r}" for i in needed[len(_SLOTS):])
        log.warning("%s / %s: generation ends at token(s) %s in transformers; a GGUF file can name only %d "
                    "more end-of-generation tokens, so llama.cpp will not stop there",
                    files.model_dir / GENERATION_CONFIG, CONFIG, left, len(_SLOTS))
    return slots
