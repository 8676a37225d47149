"""Name the llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) that reproduces a tokenizer.json's own
pre-tokenization.

llama.cpp does not read the regexes from the GGUF file: it knows a fixed set of names, each standing
for a list of regexes (plus a few flags) compiled into llama-vocab.cpp. So the converter's job is to
recognise which of those lists the HF tokenizer uses. We do that by reading the tokenizer's
`pre_tokenizer` config and looking the resulting list of split regexes up in the table below,
rather than by hashing the tokens of a test string as llama.cpp's converter does: the table says
what is supported, and anything not in it is rejected instead of guessed.

Each HF pre-tokenizer step becomes one split regex, in order:
  Split(Regex r, behavior=Isolated)  -> r
  ByteLevel(use_regex=True)          -> the GPT-2 regex
  Digits(individual_digits=True)     -> \\p{N}       (False -> \\p{N}+)
  Punctuation(behavior=Contiguous)   -> runs of punctuation (Falcon)
  ByteLevel(use_regex=False)         -> nothing (only the byte-to-unicode mapping)

Several llama.cpp names share a regex list and differ only in flags. The flags that change how
text is tokenized or decoded are part of each entry, and the first entry whose regexes and flags
all match wins:
  ignore_merges  HF's BPE `ignore_merges` (a whole pre-token found in the vocab skips the merges);
                 llama.cpp sets it per name, so a mismatch would tokenize differently -> must match.
  clean_spaces   transformers' `clean_up_tokenization_spaces` (decoding only) -> preferred match.
The canonical name of each group is the first one listed (e.g. "gpt-2" rather than "mpt", "olmo",
"jais" which llama.cpp maps to the same regexes; "qwen2" rather than "hunyuan", "grok-2").

Some names llama.cpp gives one model family only (its converter recognises them by hashing that
model's tokenizer output). They tokenize exactly like their group's canonical name, so they are used
only when config.json's model_type names that family: EXAONE 4's tokenizer is then "exaone4" rather
than "gpt-2", as llama.cpp's converter writes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError

from .tokenizer_json import component_steps

log = logging.getLogger(__name__)

# The regex ByteLevel(use_regex=True) applies (tokenizers' GPT-2 pattern).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Punctuation(behavior=Contiguous): tokenizers' is_punctuation is ASCII punctuation or Unicode P*.
PUNCTUATION_CONTIGUOUS = "<Punctuation:Contiguous>"
DIGITS_INDIVIDUAL = r"\p{N}"
DIGITS_RUNS = r"\p{N}+"

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"

LLAMA3_REGEX = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35_REGEX = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's Tekken and OpenAI's o200k (gpt-4o): case-aware words.
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
TEKKEN_REGEX = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_REGEX = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# BLOOM's split; the second spelling (a nested class) is the same set of characters.
BLOOM_REGEX = " ?[^(\\s|.,!?…。，、।۔،)]+"
BLOOM_REGEX_NESTED = " ?[^(\\s|[.,!?…。，、।۔،])]+"
SEED_CODER_REGEX = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
UFAKZEKA_REGEX = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
JAIS2_REGEX = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
    r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
BAILINGMOE_REGEX = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
EXAONE_MOE_REGEX = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"
)
TINY_AYA_REGEXES = (
    r"\d{1,3}(?=(?:\d{3})*\b)",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
MINICPM5_REGEXES = (
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_CJK_DEEPSEEK = "[一-龥ࠀ-一가-퟿]+"
DEEPSEEK_LLM_REGEXES = (
    "[\r\n]",
    # Letters of many scripts; escaped because an editor's NFC normalization silently changes some.
    (
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
        "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
        "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
        "\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
        "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
        "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124"
        "\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
        "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
        "\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
        "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
        "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
    ),
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    _CJK_DEEPSEEK,
    DIGITS_RUNS,
)
DEEPSEEK_CODER_REGEXES = ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK_DEEPSEEK, DIGITS_INDIVIDUAL)
DEEPSEEK_V3_REGEXES = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


@dataclass(frozen=True)
class PreTokenizerEntry:
    name: str  # what llama.cpp's llama_vocab::impl::load accepts in tokenizer.ggml.pre
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    clean_spaces: bool = True
    # config.json model_types this name is kept for; empty: any tokenizer with these regexes and flags
    model_types: tuple[str, ...] = ()


# First match wins; within a regex group the canonical name comes first.
PRE_TOKENIZERS: tuple[PreTokenizerEntry, ...] = (
    PreTokenizerEntry("gpt-2", (GPT2_REGEX,)),
    PreTokenizerEntry("trillion", (GPT2_REGEX,), clean_spaces=False),
    PreTokenizerEntry("llama-bpe", (LLAMA3_REGEX,), ignore_merges=True),
    PreTokenizerEntry("dbrx", (LLAMA3_REGEX,)),
    PreTokenizerEntry("qwen2", (QWEN2_REGEX,), clean_spaces=False),
    PreTokenizerEntry("stablelm2", (QWEN2_REGEX,)),
    PreTokenizerEntry("qwen35", (QWEN35_REGEX,), clean_spaces=False),
    PreTokenizerEntry("starcoder", (DIGITS_INDIVIDUAL, GPT2_REGEX)),
    PreTokenizerEntry("smollm", (DIGITS_INDIVIDUAL, GPT2_REGEX), clean_spaces=False),
    PreTokenizerEntry("falcon", (PUNCTUATION_CONTIGUOUS, GPT2_REGEX, DIGITS_RUNS, "[0-9][0-9][0-9]")),
    PreTokenizerEntry("deepseek-llm", DEEPSEEK_LLM_REGEXES, clean_spaces=False),
    PreTokenizerEntry("deepseek-coder", DEEPSEEK_CODER_REGEXES, clean_spaces=False),
    PreTokenizerEntry("deepseek-v3", DEEPSEEK_V3_REGEXES, clean_spaces=False),
    PreTokenizerEntry("bloom", (BLOOM_REGEX,)),
    PreTokenizerEntry("poro-chat", (BLOOM_REGEX,), clean_spaces=False),
    PreTokenizerEntry("viking", (BLOOM_REGEX, DIGITS_INDIVIDUAL), clean_spaces=False),
    PreTokenizerEntry("tekken", (TEKKEN_REGEX,), ignore_merges=True, clean_spaces=False),
    PreTokenizerEntry("gpt-4o", (GPT4O_REGEX,), clean_spaces=False),
    PreTokenizerEntry("seed-coder", (SEED_CODER_REGEX,), clean_spaces=False),
    PreTokenizerEntry("ufakzeka", (UFAKZEKA_REGEX,), clean_spaces=False),
    PreTokenizerEntry("jais-2", (JAIS2_REGEX,)),
    PreTokenizerEntry("bailingmoe", (BAILINGMOE_REGEX,), clean_spaces=False),
    PreTokenizerEntry("exaone-moe", (EXAONE_MOE_REGEX,)),
    PreTokenizerEntry("tiny_aya", TINY_AYA_REGEXES, clean_spaces=False),
    PreTokenizerEntry("minicpm5", MINICPM5_REGEXES, ignore_merges=True, clean_spaces=False),
    # Family names, each the same regexes and flags as an entry above (see the module doc).
    PreTokenizerEntry("olmo", (GPT2_REGEX,), model_types=("olmo",)),
    PreTokenizerEntry("exaone4", (GPT2_REGEX,), model_types=("exaone4",)),
    PreTokenizerEntry("refact", (DIGITS_INDIVIDUAL, GPT2_REGEX), model_types=("granite",)),
    PreTokenizerEntry("command-r", (DIGITS_INDIVIDUAL, GPT2_REGEX), clean_spaces=False,
                      model_types=("cohere", "cohere2")),
    PreTokenizerEntry("glm4", (LLAMA3_REGEX,), ignore_merges=True, model_types=("glm4", "glm4_moe")),
    PreTokenizerEntry("llama4", (GPT4O_REGEX,), clean_spaces=False, model_types=("llama4", "llama4_text")),
)

# Spellings that compile to the same pattern; applied to both the table and the input.
_EQUIVALENT_SPELLINGS = (
    ("\r", r"\r"),
    ("\n", r"\n"),
    ("\t", r"\t"),
    (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])", _CONTRACTIONS),
    (BLOOM_REGEX_NESTED, BLOOM_REGEX),
)


def canonical_regex(regex: str) -> str:
    for spelling, canonical in _EQUIVALENT_SPELLINGS:
        regex = regex.replace(spelling, canonical)
    return regex


@dataclass(frozen=True)
class ByteLevelSplit:
    """What a tokenizer.json pre_tokenizer does, reduced to what llama.cpp can express."""

    regexes: tuple[str, ...]
    byte_level: bool  # a ByteLevel step maps bytes to printable characters (GPT-2 style)


def split_regexes(pre_tokenizer: dict[str, Any] | None, source: Path) -> ByteLevelSplit:
    """The ordered split regexes of a tokenizer.json `pre_tokenizer` (see module doc)."""
    steps = component_steps(pre_tokenizer, "pretokenizers", source, "pre_tokenizer")
    regexes: list[str] = []
    byte_level = False
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                raise TokenizerError(
                    f"{source}: ByteLevel pre-tokenizer with add_prefix_space=true is not supported "
                    "(llama.cpp never adds a prefix space to BPE input)"
                )
            byte_level = True
            if step.get("use_regex", True):
                regexes.append(GPT2_REGEX)
        elif kind == "Split":
            regexes.append(_split_regex(step, source))
        elif kind == "Digits":
            regexes.append(DIGITS_INDIVIDUAL if step.get("individual_digits") else DIGITS_RUNS)
        elif kind == "Punctuation" and step.get("behavior", "Isolated") == "Contiguous":
            regexes.append(PUNCTUATION_CONTIGUOUS)
        else:
            raise TokenizerError(
                f"{source}: pre-tokenizer step {_describe(step)} has no llama.cpp equivalent"
            )
    return ByteLevelSplit(tuple(canonical_regex(r) for r in regexes), byte_level)


def _split_regex(step: dict[str, Any], source: Path) -> str:
    pattern = step.get("pattern") or {}
    behavior = step.get("behavior")
    if "Regex" not in pattern:
        raise TokenizerError(f"{source}: Split pre-tokenizer on a plain string {pattern!r} is not supported")
    if behavior != "Isolated" or step.get("invert"):
        raise TokenizerError(
            f"{source}: Split pre-tokenizer with behavior={behavior!r} invert={step.get('invert')!r} "
            "is not supported (llama.cpp only isolates matches)"
        )
    return pattern["Regex"]


def _describe(step: dict[str, Any]) -> str:
    fields = ", ".join(f"{k}={v!r:.60}" for k, v in step.items() if k != "type")
    return f"{step.get('type')}({fields})"


def identify_pre_tokenizer(
    pre_tokenizer: dict[str, Any] | None,
    source: Path,
    *,
    ignore_merges: bool = False,
    clean_spaces: bool | None = None,
    model_type: str | None = None,
) -> str:
    """The llama.cpp pre-tokenizer name for a byte-level BPE tokenizer.json's `pre_tokenizer`.

    `ignore_merges` is the tokenizer.json model's flag; `clean_spaces` is tokenizer_config.json's
    `clean_up_tokenization_spaces` (None: unknown, any entry will do); `model_type` is config.json's,
    which picks a family's own name among equivalent ones. Raises TokenizerError naming `source` when
    no llama.cpp pre-tokenizer reproduces it.
    """
    split = split_regexes(pre_tokenizer, source)
    if not split.byte_level:
        raise TokenizerError(
            f"{source}: BPE tokenizer without a ByteLevel pre-tokenizer is not supported "
            "(only byte-level BPE converts to llama.cpp's 'gpt2' tokenizer)"
        )
    same_regexes = [e for e in PRE_TOKENIZERS if tuple(canonical_regex(r) for r in e.regexes) == split.regexes]
    if not same_regexes:
        shown = " ; ".join(split.regexes) or "(none)"
        raise TokenizerError(f"{source}: pre-tokenizer regexes not known to llama.cpp: {shown}")
    same_merges = [e for e in same_regexes if e.ignore_merges == ignore_merges
                   and (not e.model_types or model_type in e.model_types)]
    same_merges.sort(key=lambda e: not e.model_types)  # the family's own name first (a stable sort)
    if not same_merges:
        raise TokenizerError(
            f"{source}: pre-tokenizer matches llama.cpp's {same_regexes[0].name!r} but its BPE model has "
            f"ignore_merges={ignore_merges}, which no llama.cpp pre-tokenizer with these regexes uses"
        )
    for entry in same_merges:
        if clean_spaces is None or entry.clean_spaces == clean_spaces:
            return entry.name
    log.info(
        "%s: using pre-tokenizer %r; its clean_up_tokenization_spaces differs (affects decoding only)",
        source,
        same_merges[0].name,
    )
    return same_merges[0].name
