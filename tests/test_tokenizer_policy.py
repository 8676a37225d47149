"""The tokenizer policy end to end: what llama.cpp's converter converts, ggufsmith converts; where
llama.cpp will tokenize some text differently, one warning says so, and --strict-tokenizer refuses.

The case users meet most: a SentencePiece model trained with the trainer's defaults, whose
normalization is nmt_nfkc (NFKC plus whitespace/control rules) and which removes extra spaces.
llama.cpp applies neither. Oracles: the sentencepiece library on the same tokenizer.model, and
llama.cpp (llama-cpp-python) running the converted model.
"""

from __future__ import annotations

import pytest

from tests.damaged_inputs import assert_clean_failure, run_cli
from tests.llama_models import build_model
from tests.tokenizer_helpers import train_sentencepiece

pytestmark = pytest.mark.slow

# Text without anything NFKC or the nmt rules change and without runs of spaces: here llama.cpp
# must give exactly sentencepiece's tokens.
PLAIN_TEXT = ("Hello World! don't stop. Übermäßig große Füße; weiß. Съешь же ещё этих булок. "
              "这是一个测试句子。 rocket 🦙 llama 1234567890 if x == 1: return [a, b]")
# Full-width letters and a ligature: NFKC turns them into "full width" and "fi".
NFKC_TEXT = "ｆｕｌｌ ｗｉｄｔｈ ﬁne"


@pytest.fixture(scope="session")
def nfkc_model(tmp_path_factory):
    """A tiny llama whose tokenizer.model has the sentencepiece trainer's default normalization."""
    from sentencepiece import sentencepiece_model_pb2

    model_dir = tmp_path_factory.mktemp("nmt-nfkc")
    # train_sentencepiece pins identity normalization for the other tests; these are the trainer's defaults.
    train_sentencepiece(model_dir, normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
    proto = sentencepiece_model_pb2.ModelProto.FromString((model_dir / "tokenizer.model").read_bytes())
    assert proto.normalizer_spec.name == "nmt_nfkc" and proto.normalizer_spec.precompiled_charsmap
    build_model(model_dir, "llama_gqa", vocab_size=len(proto.pieces))
    return model_dir


def test_nmt_nfkc_sentencepiece_converts_with_one_warning_and_runs_in_llama_cpp(nfkc_model, tmp_path):
    import llama_cpp
    import numpy as np
    import sentencepiece as spm
    import torch
    import transformers

    out = tmp_path / "model.gguf"
    proc = run_cli("convert", nfkc_model, out, "--outtype", "f32", "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "nmt_nfkc" in lines[0] and "NFKC normalization would change" in lines[0], lines[0]
    assert "remove_extra_whitespaces" in lines[0] and "--strict-tokenizer" in lines[0], lines[0]

    sp = spm.SentencePieceProcessor(model_file=str(nfkc_model / "tokenizer.model"))
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, logits_all=True, verbose=False, type_k=0, type_v=0)
    try:
        ours = llm.tokenize(PLAIN_TEXT.encode("utf-8"), add_bos=False, special=False)
        assert ours == sp.encode(PLAIN_TEXT)
        # What the warning announces does happen: NFKC-affected text tokenizes differently.
        assert llm.tokenize(NFKC_TEXT.encode("utf-8"), add_bos=False, special=False) != sp.encode(NFKC_TEXT)
        # The model runs: llama.cpp's logits on those tokens are transformers'.
        ids = [sp.bos_id(), *ours[:24]]
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(nfkc_model, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max()


def test_strict_tokenizer_refuses_nmt_nfkc_with_one_line(nfkc_model, tmp_path):
    out = tmp_path / "model.gguf"
    proc = run_cli("convert", nfkc_model, out, "--outtype", "f32", "--quiet", "--strict-tokenizer")
    line = assert_clean_failure(proc, "nmt_nfkc", out)
    assert "--strict-tokenizer" in line


def test_python_api_strict_tokenizer(nfkc_model, tmp_path):
    import ggufsmith
    from ggufsmith.errors import TokenizerError

    with pytest.raises(TokenizerError, match="nmt_nfkc.*refused by --strict-tokenizer"):
        ggufsmith.convert(nfkc_model, tmp_path / "model.gguf", "f32", strict_tokenizer=True)
    assert not (tmp_path / "model.gguf").exists()


def test_the_warning_gives_way_to_an_error(nfkc_model, tmp_path):
    # The conversion fails after the tokenizer was exported (a weight is missing): the error is the
    # one line printed; the tokenizer warning is printed only when a conversion succeeds.
    import shutil

    from safetensors.numpy import load_file, save_file

    model_dir = tmp_path / "model"
    shutil.copytree(nfkc_model, model_dir)
    weights = load_file(model_dir / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    target = tmp_path / "model.gguf"
    proc = run_cli("convert", model_dir, target, "--outtype", "f32", "--quiet")
    assert_clean_failure(proc, "blk.1.ffn_down.weight", target)


@pytest.mark.parametrize("legacy", [True, False])
def test_legacy_false_is_a_warned_difference(tmp_path, caplog, legacy):
    # transformers' legacy=false puts no space before text that follows a special token;
    # llama.cpp's SentencePiece tokenizer always does. Both the tokenizer.model folder and the
    # tokenizer.json transformers saves from it (Metaspace prepend_scheme 'first') are checked.
    import transformers

    from ggufsmith.tokenizer import export_tokenizer
    from tests.tokenizer_helpers import load_llama_vocab, write_tokenizer_config, write_vocab_gguf

    model_dir = train_sentencepiece(tmp_path / "sp")
    write_tokenizer_config(model_dir, legacy=legacy)
    json_dir = tmp_path / "json"
    transformers.AutoTokenizer.from_pretrained(model_dir).save_pretrained(json_dir)
    (json_dir / "tokenizer.model").unlink(missing_ok=True)
    write_tokenizer_config(json_dir, legacy=legacy)  # save_pretrained drops it
    text = "<|im_start|>Hello world"
    for folder in (model_dir, json_dir):
        caplog.clear()
        hf = transformers.AutoTokenizer.from_pretrained(folder)
        llm = load_llama_vocab(write_vocab_gguf(export_tokenizer(folder), folder / "vocab.gguf"))
        same = llm.tokenize(text.encode(), add_bos=False, special=True) == hf.encode(text, add_special_tokens=False)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert same == legacy, folder
        assert (len(warnings) == 1 and "follows a special token" in warnings[0]) == (not legacy), warnings
