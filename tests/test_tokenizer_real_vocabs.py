"""Real published vocabularies: llama.cpp's vocab test files (models/ggml-vocab-*.gguf with .inp test
strings and .out token ids that the real Hugging Face tokenizers produced).

From each GGUF vocabulary we rebuild the files a checkpoint would carry: a tokenizer.json (tokens,
merges, added tokens, and the model's real pre_tokenizer config from tests/tokenizer_configs.py),
a SentencePiece tokenizer.model, or a WordPiece vocab.txt (bert-bge). Two checks per string:
  - transformers / sentencepiece on the rebuilt files give the .out ids (the rebuild is faithful);
  - llama.cpp on our export of those files gives the .out ids (our export is faithful).
The vocab files come from the llama-cpp-python sdist (tests/llamacpp_reference.py fetches it).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from ggufsmith.tokenizer import export_tokenizer
from ggufsmith.tokenizer import pretokenizer as pt
from ggufsmith.gguf_writer.reader import GGUFReader
from tests import tokenizer_configs as configs
from tests.llamacpp_reference import vocab_models_dir
from tests.tokenizer_helpers import load_llama_vocab, write_vocab_gguf

pytestmark = pytest.mark.slow  # vocabularies of up to 256k tokens

# vocab name -> (pre_tokenizer config, normalizer, BPE ignore_merges, pre-tokenizer names llama.cpp
# maps to the same regexes as the file's own)
BPE_VOCABS = {
    "gpt-2": (configs.GPT2, None, False, {"gpt-2"}),
    "mpt": (configs.GPT2, None, False, {"gpt-2", "trillion"}),
    "llama-bpe": (configs.LLAMA3, None, True, {"llama-bpe"}),
    "qwen2": (configs.QWEN2, {"type": "NFC"}, False, {"qwen2", "stablelm2"}),
    "starcoder": (configs.STARCODER, None, False, {"starcoder", "smollm"}),
    "refact": (configs.STARCODER, None, False, {"starcoder", "smollm"}),
    "command-r": (configs.STARCODER, {"type": "NFC"}, False, {"starcoder", "smollm"}),
    "falcon": (configs.FALCON, None, False, {"falcon"}),
    "deepseek-coder": (configs.DEEPSEEK_CODER, None, False, {"deepseek-coder"}),
    # Spelled from our own table (their files' exact spelling unknown to us): these two check that
    # the table's regexes reproduce the real tokenizers.
    "qwen35": (configs.split_then_byte_level(pt.QWEN35_REGEX), None, False, {"qwen35"}),
    "deepseek-llm": (configs.split_then_byte_level(*pt.DEEPSEEK_LLM_REGEXES[:-1], digits=False), None, False,
                     {"deepseek-llm"}),
}
SPM_VOCABS = ["llama-spm", "phi-3"]
_SEPARATOR = "\n__ggml_vocab_test__\n"


def _cases(name: str) -> list[tuple[str, list[int]]]:
    models = vocab_models_dir()
    texts = (models / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(_SEPARATOR)
    lines = (models / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@functools.lru_cache(maxsize=2)
def _fields(name: str) -> dict:
    # Our reader (tested against gguf-py elsewhere) only loads the input vocabulary here; gguf-py's
    # takes ~40 s on a 256k vocabulary.
    with GGUFReader(vocab_models_dir() / f"ggml-vocab-{name}.gguf") as reader:
        return {key: value.plain() for key, value in reader.metadata.items()}


def _rebuild_bpe(name: str, model_dir: Path) -> None:
    pre_tokenizer, normalizer, ignore_merges, _ = BPE_VOCABS[name]
    fields = _fields(name)
    vocab, added = {}, []
    for token_id, (text, token_type) in enumerate(zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"])):
        if token_type in (3, 4):  # CONTROL, USER_DEFINED: transformers' added tokens
            added.append({"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": token_type == 4, "special": token_type == 3})
        else:
            vocab[text] = token_id
    tokenizer = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": json.loads(pre_tokenizer),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab,
                  "merges": [m.split(" ") for m in fields["tokenizer.ggml.merges"]]},
    }
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


@pytest.mark.parametrize("name", sorted(BPE_VOCABS))
def test_real_bpe_vocab(tmp_path, name):
    from tokenizers import Tokenizer

    model_dir = tmp_path / name
    _rebuild_bpe(name, model_dir)
    cases = _cases(name)
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rebuilt_ok = [reference.encode(text, add_special_tokens=False).ids == ids for text, ids in cases]
    assert all(rebuilt_ok), f"the rebuilt tokenizer.json is not faithful for {rebuilt_ok.count(False)} strings"

    metadata = export_tokenizer(model_dir)
    assert metadata.get("tokenizer.ggml.pre") in BPE_VOCABS[name][3]
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "ours.gguf"))
    for text, ids in cases:
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == ids, repr(text)


def _rebuild_sentencepiece(name: str, model_dir: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2

    fields = _fields(name)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.trainer_spec.model_type = 2  # BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = int(fields["tokenizer.ggml.unknown_token_id"])
    proto.trainer_spec.bos_id = int(fields["tokenizer.ggml.bos_token_id"])
    proto.trainer_spec.eos_id = int(fields["tokenizer.ggml.eos_token_id"])
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = False
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    # The SentencePiece model ends with its last normal or byte piece; what follows was added by
    # transformers (phi-3's <|assistant|>, placeholders, ...) and goes to tokenizer_config.json.
    n_pieces = 1 + max(i for i, t in enumerate(types) if t in (1, 6))
    for text, score, token_type in zip(tokens[:n_pieces], fields["tokenizer.ggml.scores"], types[:n_pieces]):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = text, score, int(token_type)
    added = {str(i): {"content": tokens[i], "special": types[i] != 4} for i in range(n_pieces, len(tokens))}
    model_dir.mkdir()
    (model_dir / "tokenizer.model").write_bytes(proto.SerializeToString())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))


@pytest.mark.parametrize("name", SPM_VOCABS)
def test_real_sentencepiece_vocab(tmp_path, name):
    import sentencepiece as spm

    model_dir = tmp_path / name
    _rebuild_sentencepiece(name, model_dir)
    cases = _cases(name)
    reference = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    assert all(reference.encode(text) == ids for text, ids in cases), "the rebuilt tokenizer.model is not faithful"

    metadata = export_tokenizer(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "ours.gguf"))
    for text, ids in cases:
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == ids, repr(text)


# -- WordPiece: llama.cpp's bert-bge vocabulary (bge-small-en-v1.5, bert-base-uncased's 30522 tokens) ---

def _rebuild_vocab_txt(name: str, model_dir: Path) -> None:
    """vocab.txt back in WordPiece's spelling: "▁play" -> "play", a piece without the mark ->
    "##piece"; control tokens and this older file's unmarked [unusedN] tokens as they are."""
    fields = _fields(name)
    pieces = []
    for text, token_type in zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]):
        if token_type == 3 or (text.startswith("[unused") and text.endswith("]")):
            pieces.append(text)
        else:
            pieces.append(text[1:] if text.startswith("\u2581") else "##" + text)
    model_dir.mkdir()
    (model_dir / "vocab.txt").write_text("".join(f"{piece}\n" for piece in pieces), encoding="utf-8")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                 "do_lower_case": True}))


def test_real_wordpiece_vocab(tmp_path):
    """The same tokenizer keys back (the [unusedN] tokens now carry the word-start mark, as
    llama.cpp's current converter writes every non-control token), and the test vectors pass."""
    import transformers

    model_dir = tmp_path / "bert-bge"
    _rebuild_vocab_txt("bert-bge", model_dir)
    cases = _cases("bert-bge")
    reference = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert all(reference.encode(text, add_special_tokens=False) == ids for text, ids in cases), \
        "the rebuilt vocab.txt is not faithful"

    metadata = export_tokenizer(model_dir)
    original = _fields("bert-bge")
    ours, theirs = metadata.get("tokenizer.ggml.tokens"), original["tokenizer.ggml.tokens"]
    assert len(ours) == len(theirs)
    assert all(t == o or (o.startswith("[unused") and t == "\u2581" + o) for t, o in zip(ours, theirs))
    assert list(metadata.get("tokenizer.ggml.token_type")) == list(original["tokenizer.ggml.token_type"])
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id", "cls_token_id", "mask_token_id"):
        assert metadata.get(f"tokenizer.ggml.{key}") == original[f"tokenizer.ggml.{key}"], key
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "ours.gguf", arch="bert"))
    for text, ids in cases:
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == ids, repr(text)
