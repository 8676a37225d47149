"""Pre-tokenizer identification on the pre_tokenizer configs of well-known tokenizers
(tests/tokenizer_configs.py), which go through the same JSON decoding a real file does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.tokenizer.pretokenizer import PRE_TOKENIZERS, identify_pre_tokenizer
from ggufsmith.errors import TokenizerError
from tests.tokenizer_configs import BLOOM, DEEPSEEK_CODER, FALCON, GPT2, LLAMA3, QWEN2, STARCODER, TEKKEN

SOURCE = Path("model/tokenizer.json")


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
