"""tokenizer.json `pre_tokenizer` configs of well-known tokenizers, written by hand the way those
models' files spell them (JSON escapes included), for the pre-tokenizer identification tests."""

import json

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


def split_then_byte_level(*regexes: str, digits: bool | None = None) -> str:
    """A Sequence of isolated Split regexes, optional Digits, then ByteLevel without its regex: the
    shape of Qwen 3.5's and DeepSeek LLM's pre_tokenizer, whose exact spelling we write from our table."""
    steps = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in regexes]
    if digits is not None:
        steps.append({"type": "Digits", "individual_digits": digits})
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    return json.dumps({"type": "Sequence", "pretokenizers": steps}, ensure_ascii=False)
