"""Our tokenizer keys against llama.cpp's convert_hf_to_gguf.py for the tokenizers of the newer
families: the slow GPT-2 files, Gemma's SentencePiece, and the BPE tokenizers of Qwen3, Command-R, GLM-4,
OLMo 2, SmolLM3, Granite, StarCoder2 and EXAONE 4, each beside a tiny random model of its
architecture (the reference converter reads the tokenizer through the architecture's own
set_vocab). Gemma 4's tokenizer is compared with llama.cpp's own Gemma 4 vocabulary file instead
(tests/test_tokenizer_vocab_files_keys.py): the reference cannot convert a tiny Gemma 4 saved by
this transformers (its config.json has no global_head_dim).

As in tests/test_tokenizer_vs_convert_hf.py, the reference is told the pre-tokenizer name (it
recognises only published tokenizers by hashing them) and the keys only one side writes are the
deliberate ones listed there; the other differences are listed here with their reasons.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufsmith.tokenizer import export_tokenizer
from tests.test_tokenizer_gemma_phi3 import _train_gemma
from tests.test_tokenizer_slow_files import write_slow_gpt2_folder
from tests.test_tokenizer_vs_convert_hf import ONLY_OURS, ONLY_THEIRS, _reference_keys
from tests.tokenizer_helpers import train_bpe_for_table_entry

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def _save_tiny_model(model_dir: Path, model_class: str, config_class: str, vocab_size: int, **config) -> None:
    config_object = getattr(transformers, config_class)(vocab_size=vocab_size, **config)
    torch.manual_seed(0)
    getattr(transformers, model_class)(config_object).save_pretrained(model_dir)


def _slow_gpt2(model_dir: Path) -> tuple[str, str, dict]:
    write_slow_gpt2_folder(model_dir)
    # n_ctx: read by the reference; bos/eos: GPT2Config's defaults are GPT-2's 50256, past this vocabulary
    return "GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, n_ctx=64,
                                                 bos_token_id=0, eos_token_id=0)


def _gemma2(model_dir: Path) -> tuple[str, str, dict]:
    _train_gemma(model_dir)
    return "Gemma2ForCausalLM", "Gemma2Config", dict(_SMALL, head_dim=16)


def _family(entry: str, model_class: str, config_class: str, **specials):
    def build(model_dir: Path) -> tuple[str, str, dict]:
        train_bpe_for_table_entry(model_dir, entry, **specials)
        # The configs' default special ids belong to the real vocabularies, past this small one.
        return model_class, config_class, dict(_SMALL, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return build


CASES = {
    "slow-gpt2": (_slow_gpt2, "gpt-2"),
    "gemma2-sentencepiece": (_gemma2, None),
    "qwen3": (_family("qwen2", "Qwen3ForCausalLM", "Qwen3Config", nfc=True,
                      specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>"), "qwen2"),
    "command-r": (_family("command-r", "CohereForCausalLM", "CohereConfig", nfc=True,
                          specials=("<PAD>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"), bos="<BOS_TOKEN>",
                          eos="<|END_OF_TURN_TOKEN|>"), "command-r"),
    "glm4": (_family("glm4", "Glm4ForCausalLM", "Glm4Config",
                     specials=("<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>"),
                     eos="<|endoftext|>"), "glm4"),
    "olmo2": (_family("dbrx", "Olmo2ForCausalLM", "Olmo2Config", specials=("<|endoftext|>", "<|pad|>")), "dbrx"),
    "smollm3": (_family("llama-bpe", "SmolLM3ForCausalLM", "SmolLM3Config",
                        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"),
                        bos="<|begin_of_text|>", eos="<|im_end|>"), "llama-bpe"),
    "granite": (_family("refact", "GraniteForCausalLM", "GraniteConfig",
                        specials=("<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>"),
                        eos="<|end_of_text|>"), "refact"),
    "starcoder2": (_family("starcoder", "Starcoder2ForCausalLM", "Starcoder2Config",
                           specials=("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>")), "starcoder"),
    "exaone4": (_family("exaone4", "Exaone4ForCausalLM", "Exaone4Config",
                        specials=("[PAD]", "[BOS]", "[|endofturn|]"), eos="[|endofturn|]"), "exaone4"),
}
# generation_config.json's list of eos ids, by text (written after the model, which writes its own).
GENERATION_EOS = {"glm4": ("<|endoftext|>", "<|user|>", "<|observation|>")}
# Keys only the reference writes for a case, with the reason.
ALSO_ONLY_THEIRS = {
    # The reference's GLM-4 set_vocab names <|endoftext|> as unk; the tokenizer has no unknown token
    # (a byte-level BPE never needs one) and we name none.
    "glm4": {"tokenizer.ggml.unknown_token_id"},
}
# Keys only we write for a case, with the reason.
ALSO_ONLY_OURS = {
    # The folder has no add_bos_token and no post-processor: the reference leaves the key out and
    # llama.cpp's default for a "gpt-2" tokenizer, false, applies; we write that same false.
    "slow-gpt2": {"tokenizer.ggml.add_bos_token"},
}
# Keys where the reference and we differ for a case, with the reason.
DIFFERENT = {
    # Gemma's user-defined pieces ("<mask>", "\t\t", "myword") are USER_DEFINED for us, so that llama.cpp
    # keeps them whole as sentencepiece does; the reference types them NORMAL (as for every
    # SentencePiece model, tests/test_tokenizer_vs_convert_hf.py).
    "gemma2-sentencepiece": {"tokenizer.ggml.token_type"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_keys_match_llama_cpp_converter(tmp_path, case):
    build, pre = CASES[case]
    model_dir = tmp_path / case
    model_class, config_class, config = build(model_dir)
    n_tokens = len(export_tokenizer(model_dir).get("tokenizer.ggml.tokens"))
    existing = json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").exists() else {}
    _save_tiny_model(model_dir, model_class, config_class, n_tokens + 3, **config)
    if case in GENERATION_EOS:
        hf = transformers.AutoTokenizer.from_pretrained(model_dir)
        eos_ids = [hf.convert_tokens_to_ids(text) for text in GENERATION_EOS[case]]
        (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert existing.get("model_type") in (None, json.loads((model_dir / "config.json").read_text())["model_type"])
    ours = {k: v.plain() for k, v in export_tokenizer(model_dir, vocab_size=vocab_size).items()}
    theirs = _reference_keys(model_dir, tmp_path / "reference.gguf", pre)

    assert set(ours) - set(theirs) <= ONLY_OURS | ALSO_ONLY_OURS.get(case, set())
    assert set(theirs) - set(ours) <= ONLY_THEIRS | ALSO_ONLY_THEIRS.get(case, set())
    different = sorted(k for k in set(ours) & set(theirs)
                       if (ours[k] != pytest.approx(theirs[k]) if k == "tokenizer.ggml.scores" else ours[k] != theirs[k]))
    assert different == sorted(DIFFERENT.get(case, set())), case


def test_gemma3_tokenizer_json_only_where_the_reference_goes_wrong(tmp_path):
    """A Gemma 3 folder with tokenizer.json but no tokenizer.model (what transformers 5 saves): the
    reference converter takes its byte-level BPE path ("gpt2"; it refuses the folder unless told a
    pre-tokenizer name, its hash being unknown), which llama.cpp then applies to GPT-2 byte-mapped
    text, not to the "▁" text the vocabulary is made of. Our SentencePiece ("llama") export tokenizes
    as transformers does. This is the one listed case where our tokenizer keys differ on purpose."""
    from tests.tokenizer_helpers import CHECK_TEXT, load_llama_vocab, write_vocab_gguf

    _train_gemma(tmp_path / "spm")
    model_dir = tmp_path / "json"
    transformers.AutoTokenizer.from_pretrained(tmp_path / "spm").save_pretrained(model_dir)
    n_tokens = len(export_tokenizer(model_dir).get("tokenizer.ggml.tokens"))
    _save_tiny_model(model_dir, "Gemma3ForCausalLM", "Gemma3TextConfig", n_tokens, **dict(_SMALL, head_dim=16))
    _reference_keys(model_dir, tmp_path / "reference.gguf", "default")
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    expected = hf.encode(CHECK_TEXT, add_special_tokens=False)

    theirs = load_llama_vocab(tmp_path / "reference.gguf")
    assert theirs.tokenize(CHECK_TEXT.encode(), add_bos=False, special=False) != expected
    metadata = export_tokenizer(model_dir, vocab_size=n_tokens)
    assert metadata.get("tokenizer.ggml.model") == "llama"
    ours = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "ours.gguf", arch="gemma3"))
    assert ours.tokenize(CHECK_TEXT.encode(), add_bos=False, special=False) == expected
