"""Gemma's and Phi-3's SentencePiece tokenizers, from tokenizer.model and from the tokenizer.json
transformers 5 saves.

Gemma's SentencePiece model puts no "▁" before the text (add_dummy_prefix false) and has many
user-defined pieces; transformers 5 saves it as a tokenizer.json whose normalizer replaces spaces by
"▁" followed by a Split on " " (GemmaTokenizer). Phi-3's is a Llama-2-style model with its chat
tokens added after the SentencePiece pieces. Each is trained here, loaded by transformers (and
sentencepiece) as the oracle, and loaded by llama.cpp from our export.
"""

from __future__ import annotations

import json

import pytest

from ggufsmith.tokenizer import export_tokenizer
from tests.tokenizer_helpers import CHECK_TEXT, load_llama_vocab, train_sentencepiece, write_tokenizer_config, write_vocab_gguf

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

GEMMA_CHAT = ("<start_of_turn>", "<end_of_turn>")
PHI3_CHAT = ("<|user|>", "<|assistant|>", "<|end|>", "<|system|>")


def _tokenize(llm, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def _train_gemma(model_dir):
    """A Gemma-style SentencePiece model: <pad> <eos> <bos> <unk> first, no dummy prefix, chat tokens."""
    train_sentencepiece(model_dir, vocab_size=1200, add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                        control_symbols=list(GEMMA_CHAT), user_defined_symbols=["<mask>", "\t\t", "myword"])
    write_tokenizer_config(model_dir, tokenizer_class="GemmaTokenizer", bos_token="<bos>", eos_token="<eos>",
                           unk_token="<unk>", pad_token="<pad>", legacy=True,
                           chat_template="{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}")
    return model_dir


@pytest.fixture(scope="module")
def gemma_model_dir(tmp_path_factory):
    return _train_gemma(tmp_path_factory.mktemp("gemma") / "spm")


@pytest.fixture(scope="module")
def gemma_json_dir(gemma_model_dir, tmp_path_factory):
    """The Gemma tokenizer saved by transformers 5: tokenizer.json, no tokenizer.model."""
    model_dir = tmp_path_factory.mktemp("gemma-json") / "json"
    transformers.AutoTokenizer.from_pretrained(gemma_model_dir).save_pretrained(model_dir)
    assert not (model_dir / "tokenizer.model").exists()
    pre = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))["pre_tokenizer"]
    assert pre["type"] == "Split"  # GemmaTokenizer's Split on " ", after the normalizer's Replace
    return model_dir


@pytest.fixture(scope="module", params=["tokenizer.model", "tokenizer.json"])
def gemma_case(request, gemma_model_dir, gemma_json_dir):
    model_dir = gemma_model_dir if request.param == "tokenizer.model" else gemma_json_dir
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, model_dir.parent / f"{request.param}.gguf", arch="gemma"))
    return model_dir, hf, llm, metadata


def test_gemma_tokenizes_like_transformers(gemma_case):
    _, hf, llm, metadata = gemma_case
    assert metadata.get("tokenizer.ggml.model") == "llama"
    assert metadata.get("tokenizer.ggml.add_space_prefix") is False
    tokens = _tokenize(llm, CHECK_TEXT)
    assert tokens == hf.encode(CHECK_TEXT, add_special_tokens=False)
    assert llm.detokenize(tokens).decode("utf-8") == CHECK_TEXT


def test_gemma_tokenizes_like_sentencepiece(gemma_case, gemma_model_dir):
    import sentencepiece as spm

    _, _, llm, _ = gemma_case
    sp = spm.SentencePieceProcessor(model_file=str(gemma_model_dir / "tokenizer.model"))
    assert _tokenize(llm, CHECK_TEXT) == sp.encode(CHECK_TEXT)


def test_gemma_special_tokens_bos_and_end_of_turn(gemma_case):
    _, hf, llm, metadata = gemma_case
    text = f"{GEMMA_CHAT[0]}user\nGrüße myword\t\t你好{GEMMA_CHAT[1]}\n{GEMMA_CHAT[0]}model\n"
    assert _tokenize(llm, text, special=True) == hf.encode(text, add_special_tokens=False)
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")
    end_of_turn = hf.convert_tokens_to_ids(GEMMA_CHAT[1])
    assert metadata.get("tokenizer.ggml.eot_token_id") == end_of_turn
    assert llama_cpp.llama_vocab_is_eog(llm._model.vocab, end_of_turn)
    assert "<start_of_turn>" in metadata.get("tokenizer.chat_template")


@pytest.fixture(scope="module")
def phi3_case(tmp_path_factory):
    """A Phi-3-style model: Llama 2's <unk> <s> </s>, then its chat tokens added by transformers."""
    model_dir = train_sentencepiece(tmp_path_factory.mktemp("phi3") / "spm", vocab_size=1200, control_symbols=[],
                                    user_defined_symbols=[])
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": list(PHI3_CHAT)})
    tokenizer.eos_token = "<|end|>"
    tokenizer.save_pretrained(model_dir)
    write_tokenizer_config(model_dir, legacy=True)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir, vocab_size=len(hf) + 5)  # padded as Phi-3's 32064 rows
    llm = load_llama_vocab(write_vocab_gguf(metadata, model_dir.parent / "phi3.gguf", arch="phi3"))
    return hf, llm, metadata


def test_phi3_tokenizes_like_transformers(phi3_case):
    hf, llm, metadata = phi3_case
    text = CHECK_TEXT.lstrip()  # transformers' converted tokenizer splits a leading space differently
    assert _tokenize(llm, text) == hf.encode(text, add_special_tokens=False)
    chat = "<|system|>\nYou are kind.<|end|>\n<|user|>\nGrüße, 你好?<|end|>\n<|assistant|>\n"
    assert _tokenize(llm, chat, special=True, add_bos=True) == hf.encode(chat)
    assert metadata.get("tokenizer.ggml.eos_token_id") == hf.convert_tokens_to_ids("<|end|>")
    assert metadata.get("tokenizer.ggml.token_type")[-1] == 5  # padding is UNUSED
    assert llama_cpp.llama_vocab_is_eog(llm._model.vocab, hf.convert_tokens_to_ids("<|end|>"))


def _merges_across_newlines_dropped(model_dir, target):
    """A copy of the tokenizer.json without the merges that join a newline with other text ("\r\n",
    which our training text has): llama.cpp's gemma4 tokenizer cannot apply those, and Gemma 4's own
    tokenizer has none."""
    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    data["model"]["merges"] = [m for m in merges if not ("\n" in "".join(m) and "".join(m).strip("\n"))]
    assert len(data["model"]["merges"]) < len(merges)
    target.mkdir()
    (target / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (target / "tokenizer_config.json").write_text((model_dir / "tokenizer_config.json").read_text())
    return target


def test_gemma_tokenizer_json_as_llama_cpps_gemma4_model(gemma_json_dir, tmp_path):
    """A Gemma tokenizer.json exported as Gemma 4's tokenizer (merges by rank, no scores) tokenizes
    in llama.cpp as in transformers."""
    model_dir = _merges_across_newlines_dropped(gemma_json_dir, tmp_path / "gemma4")
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    metadata = export_tokenizer(model_dir, kind="gemma4")
    assert metadata.get("tokenizer.ggml.model") == "gemma4"
    assert "tokenizer.ggml.scores" not in metadata and "tokenizer.ggml.pre" not in metadata
    llm = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "gemma4.gguf", arch="gemma4"))
    assert _tokenize(llm, CHECK_TEXT) == hf.encode(CHECK_TEXT, add_special_tokens=False)
    text = f"{GEMMA_CHAT[0]}user\nGrüße myword\t\t你好{GEMMA_CHAT[1]}\n"
    assert _tokenize(llm, text, special=True, add_bos=True) == hf.encode(text)


def test_gemma4_merge_across_a_newline_is_a_tokenization_difference(gemma_json_dir, caplog):
    """Our training text has "\r\n", so the trained tokenizer merges "\r" with "\n", which llama.cpp's
    gemma4 tokenizer never applies: a warning, and a refusal with strict."""
    from ggufsmith.errors import TokenizerError

    with caplog.at_level("WARNING"):
        export_tokenizer(gemma_json_dir, kind="gemma4")
    assert "newline" in caplog.text
    with pytest.raises(TokenizerError, match="newline"):
        export_tokenizer(gemma_json_dir, kind="gemma4", strict=True)
