"""Where llama.cpp will tokenize differently from the Hugging Face tokenizer, said once.

The policy (docs/tokenizers.md): convert what llama.cpp's own converter converts. Some tokenizers
do things llama.cpp's tokenizers do not (a SentencePiece normalization such as the trainer's
default nmt_nfkc, added tokens that strip the spaces beside them, ...); llama.cpp then agrees with
transformers / sentencepiece on most text and differs on some. The exporter collects each such
difference with the text it affects, and at the end either logs ONE warning naming them all or,
with strict=True (`--strict-tokenizer`), refuses with one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ggufsmith.errors import TokenizerError

from .hf_files import TOKENIZER_CONFIG, TokenizerFiles, get_typed

log = logging.getLogger("ggufsmith.tokenizer")


@dataclass
class Difference:
    cause: str  # what llama.cpp does not do, naming the file: "tokenizer.model: normalization 'nmt_nfkc'"
    affected: str  # for which text: "text that NFKC normalization would change (full-width forms, ...)"


@dataclass
class TokenizationDifferences:
    """The differences found while exporting the tokenizer of `model_dir`."""

    model_dir: Path
    found: list[Difference] = field(default_factory=list)

    def add(self, cause: str, affected: str) -> None:
        if not any(d.cause == cause for d in self.found):
            self.found.append(Difference(cause, affected))

    def message(self) -> str:
        parts = "; ".join(f"{d.cause} is not applied by llama.cpp, so it differs on {d.affected}" for d in self.found)
        return f"{self.model_dir}: llama.cpp will tokenize some text differently from the Hugging Face tokenizer: {parts}"

    def report(self, strict: bool) -> None:
        """Refuse (strict) or warn once; nothing when llama.cpp tokenizes as the original does."""
        if not self.found:
            return
        if strict:
            raise TokenizerError(f"{self.message()} (refused by --strict-tokenizer)")
        log.warning("%s (--strict-tokenizer refuses such tokenizers)", self.message())


_NFKC_TEXT = "text that NFKC normalization would change (full-width forms, ligatures, compatibility characters such as ① or ﬁ)"

# SentencePiece normalization rule names (sentencepiece's normalization_rule_name) -> the text they change.
SENTENCEPIECE_NORMALIZATION_TEXT = {
    "nmt_nfkc": f"{_NFKC_TEXT} and text with control characters or unusual spaces",
    "nfkc": _NFKC_TEXT,
    "nmt_nfkc_cf": f"{_NFKC_TEXT}, text with control characters or unusual spaces and text with upper-case letters",
    "nfkc_cf": f"{_NFKC_TEXT} and text with upper-case letters",
}

# tokenizers' normalizer types -> the text they change (llama.cpp's BPE and SPM tokenizers apply none).
_HF_NORMALIZER_TEXT = {
    "NFC": "text that is not in Unicode NFC form (decomposed accents)",
    "NFD": "text with precomposed characters (accented letters, Hangul)",
    "NFKC": _NFKC_TEXT,
    "NFKD": f"{_NFKC_TEXT} and text with precomposed characters",
    "Lowercase": "text with upper-case letters",
    "StripAccents": "text with accents",
    "Strip": "text that begins or ends with spaces",
    "Nmt": "text with control characters or unusual spaces",
    "Precompiled": "text that the model's precompiled normalization rules change (NFKC forms, unusual spaces)",
    "BertNormalizer": "text with control characters, Chinese characters, accents or upper-case letters",
}


def hf_normalizer_text(step: dict) -> str:
    """The text a tokenizer.json normalizer step changes, for the warning."""
    kind = step.get("type")
    if kind == "Replace":
        return f"text containing {step.get('pattern')!r:.60}"
    if kind == "Prepend":
        return f"every text (the {step.get('prepend')!r:.20} put before it)"
    return _HF_NORMALIZER_TEXT.get(kind, f"text the {kind!r:.40} normalizer changes")


def note_space_stripping(added_tokens: list, differences: TokenizationDifferences) -> None:
    """Added tokens with lstrip/rstrip: transformers removes the spaces beside them, llama.cpp keeps them."""
    stripping = list(dict.fromkeys(token.content for token in added_tokens if token.strips_spaces))
    if stripping:
        shown = ", ".join(repr(text) for text in stripping[:3]) + (", ..." if len(stripping) > 3 else "")
        differences.add(f"the removal of spaces beside added tokens ({shown}: lstrip/rstrip)",
                        "text with spaces next to those tokens")


# transformers' classes that build their own Metaspace from tokenizer_config.json's `legacy`,
# whatever tokenizer.json says (legacy unset is false).
_LEGACY_CLASSES = {"LlamaTokenizer", "LlamaTokenizerFast"}


def note_spacing_after_special_tokens(files: TokenizerFiles, differences: TokenizationDifferences,
                                      tokenizer_json: Path | None = None, json_scheme: str | None = None) -> None:
    """llama.cpp's SentencePiece tokenizer puts a space before text that follows a special token
    (transformers' legacy=true, Metaspace prepend_scheme 'always'). transformers' LlamaTokenizer
    with legacy false or unset, or a tokenizer.json Metaspace with prepend_scheme 'first', does not.
    `tokenizer_json`/`json_scheme`: the file and its Metaspace scheme, for a tokenizer.json only."""
    config_path = files.model_dir / TOKENIZER_CONFIG
    if not config_path.is_file() and (files.model_dir / "params.json").is_file():
        return  # Meta's layout (readers/meta.py): its tokenizer is SentencePiece itself, no transformers class
    tokenizer_class = get_typed(files.tokenizer_config, "tokenizer_class", str, config_path)
    if tokenizer_class in _LEGACY_CLASSES or (tokenizer_class is None and tokenizer_json is None):
        legacy = get_typed(files.tokenizer_config, "legacy", bool, config_path)
        if legacy is not True:
            cause = f"{TOKENIZER_CONFIG}'s legacy={'false' if legacy is False else 'unset (false)'}"
        else:
            return
    elif json_scheme == "first":
        cause = f"{tokenizer_json.name}'s Metaspace prepend_scheme 'first'"
    else:
        return
    differences.add(cause, "text that follows a special token, where llama.cpp adds a space (as legacy=true does)")
