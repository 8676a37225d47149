"""llama.cpp's own vocabulary files for Qwen2, Qwen 3.5, Phi-3, Gemma 4 and Command-R
(models/ggml-vocab-*.gguf, written by llama.cpp's converter from the real Hugging Face tokenizers),
rebuilt into Hugging Face tokenizer files: our export of those files carries the same tokenizer keys
as llama.cpp's file, apart from the differences listed below with their reasons, and llama.cpp
tokenizes their .inp test strings into the .out ids with it.

The BPE and SentencePiece rebuilds come from tests/test_tokenizer_real_vocabs.py (which checks their
test vectors); Gemma 4's, a SentencePiece-style BPE tokenizer.json exported as llama.cpp's "gemma4"
tokenizer, is built here. Each rebuild also gets the special tokens and chat templates of the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggufsmith.tokenizer import export_tokenizer
from tests.llamacpp_reference import vocab_models_dir
from tests.test_tokenizer_real_vocabs import _cases, _fields, _rebuild_bpe, _rebuild_sentencepiece
from tests.tokenizer_helpers import load_llama_vocab, write_tokenizer_config, write_vocab_gguf

pytestmark = pytest.mark.slow  # vocabularies of up to 262k tokens
pytest.importorskip("llama_cpp")

_ROLE_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id",
              "mask": "mask_token_id"}
_CONTROL, _USER_DEFINED = 3, 4

# Keys our export writes that llama.cpp's file leaves to llama.cpp's defaults (or to its detection by
# token text), per vocabulary. Their values are checked against what llama.cpp does without them.
ADDED_KEYS = {
    "qwen2": {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.eot_token_id"},
    "qwen35": {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.eot_token_id"},
    "phi-3": {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_space_prefix",
              "tokenizer.ggml.remove_extra_whitespaces"},
    "gemma-4": {"tokenizer.ggml.add_eos_token"},
    "command-r": {"tokenizer.ggml.fim_pad_token_id"},  # its <PAD>, which llama.cpp also takes for fim_pad
}
# Keys of llama.cpp's file we do not write, with the reason.
OMITTED_KEYS = {
    # gemma4 merges by rank; the reference writes the constant -1000 for every token, never read.
    "gemma-4": {"tokenizer.ggml.scores"},
}


# Token types where llama.cpp's file differs from ours: (ours, theirs) for the token texts matched.
# These files were written by older versions of llama.cpp's converter; the current one agrees with us
# on the first two.
_UNKNOWN, _UNUSED = 2, 5
DIFFERENT_TYPES = {
    # Added tokens that look like control tokens (<|...|>) but are not flagged special: the current
    # converter types them CONTROL too (does_token_look_special, which names command-r).
    "command-r": ((_CONTROL, _USER_DEFINED), lambda text: text.startswith("<|") and text.endswith("|>")),
    # Padding up to config.json's vocab_size: UNUSED, as the current converter writes it.
    "phi-3": ((_UNUSED, _UNKNOWN), lambda text: text.startswith("[PAD")),
    # The unknown token keeps SentencePiece's UNKNOWN type; the converter types every special token
    # CONTROL. llama.cpp treats both as special tokens: tokenization is the same.
    "gemma-4": ((_UNKNOWN, _CONTROL), lambda text: text == "<unk>"),
}


def _rebuild_gemma4(model_dir: Path) -> None:
    """Gemma 4's tokenizer.json as transformers' GemmaTokenizer writes it: BPE with byte_fallback over
    text whose spaces the normalizer replaced by "▁", then a Split on " " (which finds none)."""
    fields = _fields("gemma-4")
    vocab, added = {}, []
    for token_id, (text, token_type) in enumerate(zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"])):
        if token_type in (_CONTROL, _USER_DEFINED):  # added tokens: matched whole in the text
            added.append({"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        vocab[text] = token_id
    tokenizer = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ", 1) for m in fields["tokenizer.ggml.merges"]]},
    }
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    write_tokenizer_config(model_dir, tokenizer_class="GemmaTokenizer")


def _add_special_tokens_and_templates(name: str, model_dir: Path) -> None:
    """tokenizer_config.json entries for the special tokens and chat templates the file carries."""
    fields = _fields(name)
    tokens = fields["tokenizer.ggml.tokens"]
    config = {f"{role}_token": tokens[fields[f"tokenizer.ggml.{key}"]]
              for role, key in _ROLE_KEYS.items() if f"tokenizer.ggml.{key}" in fields}
    for flag in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{flag}" in fields:
            config[flag] = fields[f"tokenizer.ggml.{flag}"]
    templates = [{"name": "default", "template": fields["tokenizer.chat_template"]}]
    for template_name in fields.get("tokenizer.chat_templates", []):
        templates.append({"name": template_name, "template": fields[f"tokenizer.chat_template.{template_name}"]})
    config["chat_template"] = templates if len(templates) > 1 else templates[0]["template"]
    write_tokenizer_config(model_dir, **config)


def _rebuild_command_r(model_dir: Path) -> None:
    _rebuild_bpe("command-r", model_dir)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "cohere", "vocab_size": 256000}))
    write_tokenizer_config(model_dir, clean_up_tokenization_spaces=False)  # as Cohere's tokenizer_config.json


def _rebuild_phi3(model_dir: Path) -> None:
    """Phi-3's tokenizer ends at <|user|>; the [PAD<id>] rows up to config.json's vocab_size (32064)
    are the converter's padding, not tokens."""
    _rebuild_sentencepiece("phi-3", model_dir)
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["added_tokens_decoder"] = {i: t for i, t in config["added_tokens_decoder"].items()
                                      if not t["content"].startswith("[PAD")}
    path.write_text(json.dumps(config))
    (model_dir / "config.json").write_text(json.dumps({"model_type": "phi3", "vocab_size": 32064}))


REBUILDS = {
    "qwen2": lambda d: _rebuild_bpe("qwen2", d),
    "qwen35": lambda d: _rebuild_bpe("qwen35", d),
    "command-r": _rebuild_command_r,
    "phi-3": _rebuild_phi3,
    "gemma-4": _rebuild_gemma4,
}
KINDS = {"gemma-4": "gemma4"}  # what the Gemma 4 architecture plugin asks for
VOCAB_SIZES = {"command-r", "phi-3"}  # rebuilds with a config.json vocab_size (the pipeline passes it)


@pytest.fixture(scope="module", params=sorted(REBUILDS))
def exported(request, tmp_path_factory):
    name = request.param
    model_dir = tmp_path_factory.mktemp("vocab") / name
    REBUILDS[name](model_dir)
    _add_special_tokens_and_templates(name, model_dir)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"] if name in VOCAB_SIZES else None
    metadata = export_tokenizer(model_dir, kind=KINDS.get(name), vocab_size=vocab_size)
    return name, model_dir, metadata


def _same(ours, theirs) -> bool:
    if isinstance(theirs, list):
        return len(ours) == len(theirs) and bool(np.all(np.asarray(ours) == np.asarray(theirs)))
    return ours == theirs


def test_same_tokenizer_keys_as_llama_cpps_file(exported):
    name, _, metadata = exported
    theirs = {k: v for k, v in _fields(name).items() if k.startswith("tokenizer.")}
    ours = {k: metadata.get(k) for k in metadata if k.startswith("tokenizer.")}
    assert set(ours) - set(theirs) == ADDED_KEYS[name]
    assert set(theirs) - set(ours) == OMITTED_KEYS.get(name, set())
    different = sorted(k for k in set(ours) & set(theirs) if not _same(ours[k], theirs[k]))
    if name in DIFFERENT_TYPES:
        assert different == ["tokenizer.ggml.token_type"], name
        (expected_pair, is_explained), tokens = DIFFERENT_TYPES[name], theirs["tokenizer.ggml.tokens"]
        pairs = {i: (int(a), int(b)) for i, (a, b) in enumerate(zip(ours["tokenizer.ggml.token_type"],
                                                                  theirs["tokenizer.ggml.token_type"])) if a != b}
        assert pairs and all(pair == expected_pair and is_explained(tokens[i]) for i, pair in pairs.items())
    else:
        assert different == [], name


def test_added_keys_say_what_llama_cpp_does_without_them(exported, tmp_path):
    """Each key only we write holds the value llama.cpp uses when loading its own file."""
    import llama_cpp

    name, _, metadata = exported
    theirs = load_llama_vocab(_vocab_gguf(name))
    vocab = theirs._model.vocab
    getters = {
        "tokenizer.ggml.add_bos_token": lambda: llama_cpp.llama_vocab_get_add_bos(vocab),
        "tokenizer.ggml.add_eos_token": lambda: llama_cpp.llama_vocab_get_add_eos(vocab),
        "tokenizer.ggml.eot_token_id": lambda: llama_cpp.llama_vocab_eot(vocab),
        "tokenizer.ggml.fim_pre_token_id": lambda: llama_cpp.llama_vocab_fim_pre(vocab),
        "tokenizer.ggml.fim_suf_token_id": lambda: llama_cpp.llama_vocab_fim_suf(vocab),
        "tokenizer.ggml.fim_mid_token_id": lambda: llama_cpp.llama_vocab_fim_mid(vocab),
        "tokenizer.ggml.fim_pad_token_id": lambda: llama_cpp.llama_vocab_fim_pad(vocab),
        "tokenizer.ggml.fim_rep_token_id": lambda: llama_cpp.llama_vocab_fim_rep(vocab),
        "tokenizer.ggml.fim_sep_token_id": lambda: llama_cpp.llama_vocab_fim_sep(vocab),
    }
    for key in ADDED_KEYS[name] & set(getters):
        assert metadata.get(key) == getters[key](), key


def _vocab_gguf(name: str) -> Path:
    return vocab_models_dir() / f"ggml-vocab-{name}.gguf"


def test_llama_cpp_passes_the_test_vectors_with_our_export(exported, tmp_path):
    name, model_dir, metadata = exported
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "ours.gguf"))
    for text, ids in _cases(name):
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == ids, repr(text)


def test_gemma4_rebuild_is_faithful():
    """transformers on the rebuilt Gemma 4 tokenizer.json gives the .out ids: the rebuild is the real
    tokenizer, so the other tests check our export of it."""
    from tokenizers import Tokenizer

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "gemma-4"
        _rebuild_gemma4(model_dir)
        reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    wrong = [text for text, ids in _cases("gemma-4") if reference.encode(text, add_special_tokens=False).ids != ids]
    assert wrong == []
