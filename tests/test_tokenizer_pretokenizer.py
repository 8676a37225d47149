"""Pre-tokenizer identification on the pre_tokenizer configs of well-known tokenizers.

The JSON below is written by hand the way those models' tokenizer.json files spell it (JSON
escapes included), so these tests exercise the same decoding path a real file does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.converters.tokenizer.pretokenizer import PRE_TOKENIZERS, identify_pre_tokenizer
from ggufsmith.errors import TokenizerError

SOURCE = Path("model/tokenizer.json")

GPT2 = r'{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}'

LLAMA3 = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
   "behavior": "Isolated", "invert": false},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"""

QWEN2 = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
   "behavior": "Isolated", "invert": false},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}"""

STARCODER = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Digits", "individual_digits": true},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}"""

FALCON = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Punctuation", "behavior": "Contiguous"},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  {"type": "Digits", "individual_digits": false},
  {"type": "Split", "pattern": {"Regex": "[0-9][0-9][0-9]"}, "behavior": "Isolated", "invert": false}]}"""

BLOOM = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": " ?[^(\\s|[.,!?…。，、।۔،])]+"}, "behavior": "Isolated", "invert": false},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"""

DEEPSEEK_CODER = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": "[\r\n]"}, "behavior": "Isolated", "invert": false},
  {"type": "Split", "pattern": {"Regex": "\\s?\\p{L}+"}, "behavior": "Isolated", "invert": false},
  {"type": "Split", "pattern": {"Regex": "\\s?\\p{P}+"}, "behavior": "Isolated", "invert": false},
  {"type": "Split", "pattern": {"Regex": "[一-龥ࠀ-一가-퟿]+"}, "behavior": "Isolated", "invert": false},
  {"type": "Digits", "individual_digits": true},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"""

TEKKEN = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
   "behavior": "Isolated", "invert": false},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"""


@pytest.mark.parametrize(
    "config,ignore_merges,clean_spaces,expected",
    [
        (GPT2, False, None, "gpt-2"),
        (GPT2, False, True, "gpt-2"),
        (LLAMA3, True, True, "llama-bpe"),
        (LLAMA3, False, True, "dbrx"),  # same regexes, merges always applied
        (QWEN2, False, False, "qwen2"),
        (QWEN2, False, True, "stablelm2"),  # same regexes, spaces cleaned on decode
        (QWEN2, False, None, "qwen2"),
        (STARCODER, False, True, "starcoder"),
        (FALCON, False, True, "falcon"),
        (BLOOM, False, True, "bloom"),
        (DEEPSEEK_CODER, False, False, "deepseek-coder"),
        (TEKKEN, True, False, "tekken"),
    ],
)
def test_known_pre_tokenizers(config, ignore_merges, clean_spaces, expected):
    pre = json.loads(config)
    assert identify_pre_tokenizer(pre, SOURCE, ignore_merges=ignore_merges, clean_spaces=clean_spaces) == expected


def test_llama_cpp_adapted_contractions_are_the_same_regex():
    # llama.cpp spells (?i:'s|...) as (?:'[sS]|...); a tokenizer.json using that spelling is the same.
    adapted = json.loads(LLAMA3.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"))
    assert identify_pre_tokenizer(adapted, SOURCE, ignore_merges=True) == "llama-bpe"


def test_unknown_regex_is_rejected_naming_the_file():
    pre = json.loads(QWEN2.replace(r"\\p{N}|", r"\\p{N}{1,2}|"))
    with pytest.raises(TokenizerError, match=r"model/tokenizer.json: pre-tokenizer regexes not known"):
        identify_pre_tokenizer(pre, SOURCE)


@pytest.mark.parametrize(
    "config,message",
    [
        ('{"type": "Whitespace"}', "Whitespace"),
        ('{"type": "Metaspace", "replacement": "\\u2581", "prepend_scheme": "always", "split": false}', "Metaspace"),
        ('{"type": "BertPreTokenizer"}', "BertPreTokenizer"),
        ('{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}', "add_prefix_space"),
        ('{"type": "Split", "pattern": {"Regex": "\\\\s+"}, "behavior": "Removed", "invert": false}', "Removed"),
        ('{"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false}', "plain string"),
        ('{"type": "Digits", "individual_digits": true}', "without a ByteLevel"),
        (None, "without a ByteLevel"),
    ],
)
def test_unsupported_pre_tokenizers_are_rejected(config, message):
    pre = None if config is None else json.loads(config)
    with pytest.raises(TokenizerError, match=message):
        identify_pre_tokenizer(pre, SOURCE)


def test_ignore_merges_mismatch_is_rejected():
    with pytest.raises(TokenizerError, match="ignore_merges=True"):
        identify_pre_tokenizer(json.loads(GPT2), SOURCE, ignore_merges=True)


def test_table_names_are_unique():
    names = [e.name for e in PRE_TOKENIZERS]
    assert len(names) == len(set(names))
