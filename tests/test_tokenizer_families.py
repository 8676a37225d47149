"""The BPE tokenizers of the current dense families (Qwen2/3, Qwen 3.5, StarCoder2, OLMo, OLMo 2,
SmolLM3, Granite, Command-R, GLM-4, EXAONE 4, Llama 4): each is trained here with its family's pre-tokenizer,
special tokens, bos/eos and a chat template, beside a config.json naming the family.

Checked against llama.cpp loading our export and transformers loading the folder: the
pre-tokenizer name is the one llama.cpp's converter gives the family; llama.cpp tokenizes a
multilingual text and the special tokens as transformers does, adds bos as it does; the eos and
end-of-turn tokens end generation in llama.cpp; the chat template is carried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from ggufsmith.tokenizer import export_tokenizer
from ggufsmith.tokenizer.pretokenizer import identify_pre_tokenizer, PRE_TOKENIZERS
from tests.tokenizer_helpers import (
    CHECK_TEXT,
    TEXT_ROLE_GETTERS,
    load_llama_vocab,
    load_llama_without_text_roles,
    train_bpe_for_table_entry,
    write_vocab_gguf,
)

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
                  "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass(frozen=True)
class Family:
    model_type: str
    table_entry: str  # the pre-tokenizer the family's tokenizer.json uses (an entry of our table)
    expected_pre: str  # what llama.cpp's converter writes for the family
    specials: tuple[str, ...]
    eos: str
    end_of_turn: str  # the token a chat turn ends with, which must end generation in llama.cpp
    bos: str | None = None
    nfc: bool = False
    generation_eos: tuple[str, ...] = ()  # generation_config.json's list of eos ids, by text


FAMILIES = {
    "qwen3": Family("qwen3", "qwen2", "qwen2", _QWEN_SPECIALS, "<|im_end|>", "<|im_end|>", nfc=True),
    "qwen3_5": Family("qwen3_5", "qwen35", "qwen35", _QWEN_SPECIALS, "<|im_end|>", "<|im_end|>"),
    "starcoder2": Family("starcoder2", "starcoder", "starcoder",
                         ("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                          "<repo_name>", "<file_sep>"), "<|endoftext|>", "<|endoftext|>"),
    "olmo": Family("olmo", "olmo", "olmo", ("<|endoftext|>", "<|padding|>"), "<|endoftext|>", "<|endoftext|>"),
    # OLMo 2 and 3 use cl100k's split without ignore_merges: llama.cpp's "dbrx".
    "olmo2": Family("olmo2", "dbrx", "dbrx", ("<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"),
                    "<|endoftext|>", "<|im_end|>"),
    "smollm3": Family("smollm3", "llama-bpe", "llama-bpe",
                      ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"), "<|im_end|>",
                      "<|im_end|>", bos="<|begin_of_text|>"),
    "granite": Family("granite", "refact", "refact",
                      ("<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                       "<|start_of_role|>", "<|end_of_role|>"), "<|end_of_text|>", "<|end_of_text|>"),
    "cohere": Family("cohere", "command-r", "command-r",
                     ("<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>", "<|START_OF_TURN_TOKEN|>",
                      "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"), "<|END_OF_TURN_TOKEN|>",
                     "<|END_OF_TURN_TOKEN|>", bos="<BOS_TOKEN>", nfc=True),
    # GLM-4 ends a turn by starting the next: <|user|>, or <|observation|> after a tool call.
    "glm4": Family("glm4", "glm4", "glm4",
                   ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                    "<|observation|>"), "<|endoftext|>", "<|user|>",
                   generation_eos=("<|endoftext|>", "<|user|>", "<|observation|>")),
    "exaone4": Family("exaone4", "exaone4", "exaone4",
                      ("[PAD]", "[BOS]", "[|endofturn|]", "[UNK]", "<|system|>", "<|user|>", "<|assistant|>"),
                      "[|endofturn|]", "[|endofturn|]"),
    "llama4": Family("llama4", "llama4", "llama4",
                     ("<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>",
                      "<|eom|>"), "<|eot|>", "<|eot|>", bos="<|begin_of_text|>",
                     generation_eos=("<|end_of_text|>", "<|eot|>", "<|eom|>")),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_case(request, tmp_path_factory):
    family = FAMILIES[request.param]
    model_dir = tmp_path_factory.mktemp(request.param) / "tok"
    train_bpe_for_table_entry(model_dir, family.table_entry, specials=family.specials, bos=family.bos,
                              eos=family.eos, model_type=family.model_type, nfc=family.nfc,
                              chat_template=_CHATML)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    if family.generation_eos:
        eos_ids = [hf.convert_tokens_to_ids(text) for text in family.generation_eos]
        (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    metadata = export_tokenizer(model_dir)
    llm = load_llama_vocab(write_vocab_gguf(metadata, model_dir.parent / "vocab.gguf"))
    return family, hf, llm, metadata


def _tokenize(llm, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def test_family_pre_tokenizer_name(family_case):
    family, _, _, metadata = family_case
    assert metadata.get("tokenizer.ggml.pre") == family.expected_pre


def test_family_tokenizes_like_transformers(family_case):
    family, hf, llm, _ = family_case
    tokens = _tokenize(llm, CHECK_TEXT)
    assert tokens == hf.encode(CHECK_TEXT, add_special_tokens=False)
    assert llm.detokenize(tokens).decode("utf-8") == hf.decode(tokens)
    chat = "".join(f"{special}Grüße, 你好 {i}\n" for i, special in enumerate(family.specials))
    assert _tokenize(llm, chat, special=True) == hf.encode(chat, add_special_tokens=False)
    assert _tokenize(llm, "Hello world", add_bos=True) == hf.encode("Hello world")


def test_family_end_of_generation_and_chat_template(family_case):
    family, hf, llm, metadata = family_case
    vocab = llm._model.vocab
    assert metadata.get("tokenizer.ggml.eos_token_id") == hf.eos_token_id
    for text in {family.eos, family.end_of_turn, *family.generation_eos}:
        assert llama_cpp.llama_vocab_is_eog(vocab, hf.convert_tokens_to_ids(text)), text
    assert metadata.get("tokenizer.chat_template") == _CHATML


def test_family_end_of_turn_and_fim_ids_are_the_ones_llama_cpp_detects(family_case, tmp_path):
    """Without our eot/fim keys llama.cpp finds these tokens by their text; we write the same ids."""
    family, _, _, metadata = family_case
    llm = load_llama_without_text_roles(metadata, tmp_path / "stripped.gguf")
    vocab = llm._model.vocab
    for key, getter in TEXT_ROLE_GETTERS.items():
        if family.generation_eos and key == "tokenizer.ggml.eot_token_id":
            continue  # generation_config.json's list decides (test_family_end_of_generation_and_chat_template)
        assert metadata.get(key, -1) == getattr(llama_cpp, getter)(vocab), (family.model_type, key)


@pytest.mark.parametrize("entry", [e for e in PRE_TOKENIZERS if e.model_types], ids=lambda e: e.name)
def test_family_names_only_for_their_family(entry, tmp_path):
    """A family's own name needs config.json to name the family; any other tokenizer with the same
    regexes gets the group's canonical name, which llama.cpp tokenizes the same way."""
    from tests.tokenizer_helpers import train_bpe_for_table_entry as train

    model_dir = train(tmp_path / "tok", entry.name, vocab_size=400)
    assert export_tokenizer(model_dir).get("tokenizer.ggml.pre") == entry.name
    (model_dir / "config.json").write_text('{"model_type": "llama"}')
    canonical = export_tokenizer(model_dir).get("tokenizer.ggml.pre")
    assert canonical != entry.name
    twin = next(e for e in PRE_TOKENIZERS if e.name == canonical)
    assert (twin.regexes, twin.ignore_merges) == (entry.regexes, entry.ignore_merges)


def test_text_config_model_type_names_the_family(tmp_path):
    model_dir = train_bpe_for_table_entry(tmp_path / "tok", "command-r", vocab_size=400)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "some_vlm", "text_config": {"model_type": "cohere2"}}))
    assert export_tokenizer(model_dir).get("tokenizer.ggml.pre") == "command-r"
    assert identify_pre_tokenizer({"type": "ByteLevel", "use_regex": True}, tmp_path, model_type="exaone4") == "exaone4"


def test_more_listed_eos_ids_than_keys_is_a_warning(tmp_path, caplog):
    """eot and eom can name two more end-of-generation tokens; a third is said, not dropped silently."""
    specials = ("<|endoftext|>", "<|user|>", "<|observation|>", "<|tool|>")
    model_dir = train_bpe_for_table_entry(tmp_path / "tok", "glm4", vocab_size=400, specials=specials)
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = [hf.convert_tokens_to_ids(text) for text in specials]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    with caplog.at_level("WARNING"):
        metadata = export_tokenizer(model_dir)
    assert (metadata.get("tokenizer.ggml.eot_token_id"), metadata.get("tokenizer.ggml.eom_token_id")) == tuple(ids[1:3])
    assert "generation_config.json" in caplog.text and "<|tool|>" in caplog.text
