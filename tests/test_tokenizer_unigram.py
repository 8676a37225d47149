"""SentencePiece Unigram tokenizers exported as llama.cpp's "t5" (UGM) tokenizer: llama.cpp, loading
only our tokenizer keys, gives the token ids transformers gives, for T5's spiece.model (with its
<extra_id_N> sentinels), XLM-RoBERTa's sentencepiece.bpe.model (fairseq's shifted ids), and the
tokenizer.json transformers saves for each; the model's NFKC rules travel as the precompiled charsmap.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import pytest

from ggufsmith.constants import Keys, TokenType
from ggufsmith.errors import TokenizerError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.tokenizer import detect_kind, export_tokenizer
from tests.tokenizer_helpers import (
    SCRIPT_TEXTS,
    load_llama_vocab,
    training_text,
    write_tokenizer_config,
    write_vocab_gguf,
)

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytest.importorskip("llama_cpp")

TEXTS = [
    *SCRIPT_TEXTS,
    # NFKC through the charsmap: full-width forms, ligature, circled digit, compatibility spaces
    "ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ １２３ ﬁne ① ™ x\u00a0y\u3000z",
    "   leading spaces",
    "Emoji 🚀 and unknown ☃ characters ⚡",
    "",
]
T5_SPECIAL_TEXT = "translate <extra_id_0> this <extra_id_2>and</s> that"
XLMR_SPECIAL_TEXT = "fill <mask> here <s>and</s> there"


def _train_unigram(path: Path, **ids) -> None:
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()), model_writer=buffer, model_type="unigram",
                                   vocab_size=3000, character_coverage=0.9995, hard_vocab_limit=False,
                                   minloglevel=2, **ids)  # normalization: nmt_nfkc, the trainer's (and T5's) default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


@pytest.fixture(scope="session")
def unigram_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unigram")
    dirs = {"t5-spiece": root / "t5-spiece", "xlmr-spiece": root / "xlmr-spiece"}
    _train_unigram(dirs["t5-spiece"] / "spiece.model", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)  # T5's ids
    write_tokenizer_config(dirs["t5-spiece"], tokenizer_class="T5Tokenizer", extra_ids=4)
    _train_unigram(dirs["xlmr-spiece"] / "sentencepiece.bpe.model")  # sentencepiece's <unk> <s> </s>
    write_tokenizer_config(dirs["xlmr-spiece"], tokenizer_class="XLMRobertaTokenizer")
    for name in ("t5", "xlmr"):  # the folder transformers saves: tokenizer.json + tokenizer_config.json
        transformers.AutoTokenizer.from_pretrained(dirs[f"{name}-spiece"]).save_pretrained(root / f"{name}-json")
        dirs[f"{name}-json"] = root / f"{name}-json"
    return dirs


def _llama_ids(model_dir: Path, tmp_path: Path, texts: list[str], metadata=None) -> list[list[int]]:
    metadata = metadata or export_tokenizer(model_dir)
    vocab = load_llama_vocab(write_vocab_gguf(metadata, tmp_path / "vocab.gguf", arch="t5"))
    try:
        return [vocab.tokenize(text.encode(), add_bos=True, special=True) for text in texts]
    finally:
        vocab.close()


@pytest.mark.parametrize("variant", ["t5-spiece", "t5-json", "xlmr-spiece", "xlmr-json"])
def test_llama_cpp_tokenizes_as_transformers(unigram_dirs, tmp_path, variant):
    model_dir = unigram_dirs[variant]
    assert detect_kind(model_dir) == "t5"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = TEXTS + [T5_SPECIAL_TEXT if variant.startswith("t5") else XLMR_SPECIAL_TEXT]
    expected = [tokenizer(text)["input_ids"] for text in texts]
    assert sum(ids.count(tokenizer.unk_token_id) for ids in expected) < sum(map(len, expected)) / 10
    for text, got, want in zip(texts, _llama_ids(model_dir, tmp_path, texts), expected):
        assert got == want, f"{variant}: {text!r}: {tokenizer.convert_ids_to_tokens(want)}"


def test_the_charsmap_is_what_normalizes(unigram_dirs, tmp_path):
    """Without the precompiled charsmap, llama.cpp would not fold full-width text as transformers does."""
    model_dir = unigram_dirs["t5-json"]
    keys = export_tokenizer(model_dir)
    charsmap = json.loads((model_dir / "tokenizer.json").read_text())["normalizer"]["precompiled_charsmap"]
    import base64
    assert bytes(keys[Keys.Tokenizer.PRECOMPILED_CHARSMAP].value) == base64.b64decode(charsmap)
    text = "ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ"
    want = transformers.AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]
    assert _llama_ids(model_dir, tmp_path, [text], keys)[0] == want
    bare = Metadata()
    for key, value in keys.items():
        if key != Keys.Tokenizer.PRECOMPILED_CHARSMAP:
            bare.add_value(key, value)
    (tmp_path / "bare").mkdir()
    assert _llama_ids(model_dir, tmp_path / "bare", [text], bare)[0] != want


def test_keys_as_llama_cpp_expects(unigram_dirs):
    t5 = export_tokenizer(unigram_dirs["t5-spiece"])
    tokens, types = list(t5[Keys.Tokenizer.TOKENS].value), list(t5[Keys.Tokenizer.TOKEN_TYPE].value)
    proto = spm.SentencePieceProcessor(model_file=str(unigram_dirs["t5-spiece"] / "spiece.model"))
    n = proto.vocab_size()
    assert t5[Keys.Tokenizer.MODEL].value == "t5" and t5[Keys.Tokenizer.PRE].value == "default"
    assert tokens[:n] == [proto.id_to_piece(i) for i in range(n)]
    assert list(t5[Keys.Tokenizer.SCORES].value[:n]) == pytest.approx([proto.get_score(i) for i in range(n)])
    assert tokens[n:] == ["<extra_id_3>", "<extra_id_2>", "<extra_id_1>", "<extra_id_0>"]
    assert set(types[n:]) == {TokenType.CONTROL} and types[2] == TokenType.UNKNOWN
    assert (t5[Keys.Tokenizer.EOS_ID].value, t5[Keys.Tokenizer.UNK_ID].value, t5[Keys.Tokenizer.PAD_ID].value) == (1, 2, 0)
    assert (t5[Keys.Tokenizer.ADD_BOS].value, t5[Keys.Tokenizer.ADD_EOS].value) == (False, True)
    assert (t5[Keys.Tokenizer.ADD_PREFIX].value, t5[Keys.Tokenizer.REMOVE_EXTRA_WS].value) == (True, True)

    xlmr = export_tokenizer(unigram_dirs["xlmr-spiece"])
    tokens = list(xlmr[Keys.Tokenizer.TOKENS].value)
    assert tokens[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and tokens[-1] == "<mask>"
    ids = {role: xlmr[key].value for role, key in (("bos", Keys.Tokenizer.BOS_ID), ("eos", Keys.Tokenizer.EOS_ID),
                                                    ("unk", Keys.Tokenizer.UNK_ID), ("pad", Keys.Tokenizer.PAD_ID),
                                                    ("mask", Keys.Tokenizer.MASK_ID))}
    assert ids == {"bos": 0, "eos": 2, "unk": 3, "pad": 1, "mask": len(tokens) - 1}
    # <s> a </s></s> b </s> for a pair (llama.cpp's reranking)
    assert (xlmr[Keys.Tokenizer.ADD_BOS].value, xlmr[Keys.Tokenizer.ADD_EOS].value,
            xlmr[Keys.Tokenizer.ADD_SEP].value) == (True, True, True)


def test_generic_class_keeps_the_json_pipeline(unigram_dirs, tmp_path):
    """Under a class that runs tokenizer.json as it is, a Metaspace without WhitespaceSplit keeps runs
    of spaces: remove_extra_whitespaces is false, and llama.cpp still agrees with transformers."""
    model_dir = tmp_path / "generic"
    shutil.copytree(unigram_dirs["t5-json"], model_dir)
    data = json.loads((model_dir / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}
    (model_dir / "tokenizer.json").write_text(json.dumps(data))
    write_tokenizer_config(model_dir, tokenizer_class="PreTrainedTokenizerFast")
    keys = export_tokenizer(model_dir)
    assert keys[Keys.Tokenizer.REMOVE_EXTRA_WS].value is False
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = ["two  spaces and   three", "trailing  ", TEXTS[0]]
    assert _llama_ids(model_dir, tmp_path, texts, keys) == [tokenizer(text)["input_ids"] for text in texts]
    # The difference the warning names: llama.cpp, as sentencepiece, puts "▁" before a leading space too.
    (tmp_path / "leading").mkdir()
    assert _llama_ids(model_dir, tmp_path / "leading", ["  leading"], keys) != [tokenizer("  leading")["input_ids"]]
    with pytest.raises(TokenizerError, match="text that begins with a space"):
        export_tokenizer(model_dir, strict=True)


def test_unsupported_pre_tokenizer_is_refused(unigram_dirs, tmp_path):
    model_dir = tmp_path / "whitespace"
    shutil.copytree(unigram_dirs["t5-json"], model_dir)
    data = json.loads((model_dir / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (model_dir / "tokenizer.json").write_text(json.dumps(data))
    write_tokenizer_config(model_dir, tokenizer_class="PreTrainedTokenizerFast")
    with pytest.raises(TokenizerError, match="Unigram with pre-tokenizer Whitespace"):
        export_tokenizer(model_dir)
