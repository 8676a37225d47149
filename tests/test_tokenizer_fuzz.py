"""Fuzzing the readers of a stranger's tokenizer files: whatever the bytes, the only exception is
TokenizerError (one line naming the file), never a foreign one.

  - tokenizer.model: byte-level mutations of a trained SentencePiece model. Our decoder is also
    checked against protobuf's own parser of the schema (sentencepiece_model_pb2): when ours
    accepts a file, protobuf reads the same fields from it; when protobuf accepts one ours refuses,
    it is only for a string that is not UTF-8 (proto2 does not check; sentencepiece then fails).
  - tokenizer.json, tokenizer_config.json, special_tokens_map.json, added_tokens.json: one value
    anywhere in a real file replaced by any JSON value, through the whole exporter.

A few seconds each here; scripts/fuzz.py runs the same targets for as long as one likes.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ggufsmith.errors import TokenizerError
from ggufsmith.tokenizer import export_tokenizer, load_sentencepiece_model
from ggufsmith.tokenizer.sentencepiece_model import parse_model_proto
from tests.tokenizer_helpers import train_bpe, train_sentencepiece, write_tokenizer_config

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# Each JSON example copies a folder and runs the whole exporter: fewer, to stay within seconds.
FUZZ_JSON = settings(FUZZ, max_examples=100)


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory) -> Path:
    model_dir = train_sentencepiece(tmp_path_factory.mktemp("sp"), vocab_size=600,
                                    normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
    # read for SentencePiece models only, as llama.cpp's converter does
    (model_dir / "added_tokens.json").write_text(json.dumps({"<tool>": 5, "<extra>": 600}))
    export_tokenizer(model_dir)  # the unmutated folder converts
    return model_dir


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    model_dir = train_bpe(tmp_path_factory.mktemp("bpe"), "qwen2", vocab_size=400)
    write_tokenizer_config(model_dir, bos_token="<|endoftext|>", pad_token={"content": "<|endoftext|>"},
                           add_bos_token=False, clean_up_tokenization_spaces=False)
    (model_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    export_tokenizer(model_dir)  # the unmutated folder converts
    return model_dir


@pytest.fixture(scope="module")
def llama3_model(tmp_path_factory) -> Path:
    """A post_processor that is a TemplateProcessing (bos) and a BPE with ignore_merges."""
    model_dir = train_bpe(tmp_path_factory.mktemp("llama3"), "llama3", vocab_size=400)
    export_tokenizer(model_dir)  # the unmutated folder converts
    return model_dir


@pytest.fixture(scope="module")
def sp_json_model(sp_model, tmp_path_factory) -> Path:
    """The SentencePiece model as transformers 5 saves it: a byte-fallback BPE tokenizer.json only."""
    import transformers

    model_dir = tmp_path_factory.mktemp("sp-json")
    transformers.AutoTokenizer.from_pretrained(sp_model).save_pretrained(model_dir)
    (model_dir / "tokenizer.model").unlink(missing_ok=True)
    export_tokenizer(model_dir)  # the unmutated folder converts
    return model_dir


# --- tokenizer.model -----------------------------------------------------------------------------

_edits = st.lists(
    st.tuples(st.sampled_from(["set", "delete", "insert"]), st.floats(0, 1, exclude_max=True),
              st.binary(min_size=1, max_size=12)),
    min_size=1, max_size=8,
)


def _mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for op, where, payload in edits:
        pos = int(where * len(out)) if out else 0
        if op == "set" and out:
            out[pos] = payload[0]
        elif op == "delete":
            del out[pos:pos + len(payload) * 4]
        else:
            out[pos:pos] = payload
    return bytes(out)


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@FUZZ
@given(edits=_edits)
def test_mutated_tokenizer_model_matches_protobuf_or_is_refused(sp_model, tmp_path, edits):
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    data = _mutate((sp_model / "tokenizer.model").read_bytes(), edits)
    path = tmp_path / "tokenizer.model"
    path.write_bytes(data)
    try:
        ours = load_sentencepiece_model(path)
    except TokenizerError as e:
        assert str(path) in str(e)
        ours = None
    try:
        theirs = sentencepiece_model_pb2.ModelProto.FromString(data)
    except DecodeError:
        theirs = None
    if ours is None:
        if theirs is not None and theirs.pieces:
            with pytest.raises(ValueError, match="not UTF-8"):
                parse_model_proto(data)
        return
    assert theirs is not None, "ours accepts a file protobuf finds corrupt"
    assert [(p.piece, p.type) for p in ours.pieces] == [(p.piece, p.type) for p in theirs.pieces]
    assert all(_same_float(a.score, b.score) for a, b in zip(ours.pieces, theirs.pieces))
    for name in ("model_type", "treat_whitespace_as_suffix", "unk_id", "bos_id", "eos_id"):
        assert getattr(ours.trainer_spec, name) == getattr(theirs.trainer_spec, name), name
    for name in ("name", "precompiled_charsmap", "add_dummy_prefix", "remove_extra_whitespaces"):
        assert getattr(ours.normalizer_spec, name) == getattr(theirs.normalizer_spec, name), name


@FUZZ
@given(edits=_edits)
def test_mutated_tokenizer_model_exports_or_raises_tokenizer_error(sp_model, tmp_path, edits):
    model_dir = tmp_path / "model"
    shutil.copytree(sp_model, model_dir, dirs_exist_ok=True)
    (model_dir / "tokenizer.model").write_bytes(_mutate((sp_model / "tokenizer.model").read_bytes(), edits))
    try:
        export_tokenizer(model_dir, kind="llama")
        event("exported")
    except TokenizerError as e:
        event("refused")
        assert "\n" not in str(e)


# --- the JSON files ------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


@st.composite
def _json_edit(draw, document):
    """(path, new value): a place anywhere in `document` and the JSON value to put there."""
    path: list = []
    node = document
    while isinstance(node, (dict, list)) and node and draw(st.floats(0, 1)) < 0.75:
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    return path, draw(_json_values)


def _replace(document, path, value):
    if not path:
        return value
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


# (file, the model folder it is fuzzed in)
_JSON_FILES = [("tokenizer.json", "bpe_model"), ("tokenizer.json", "llama3_model"), ("tokenizer.json", "sp_json_model"),
               ("tokenizer_config.json", "bpe_model"),
               ("special_tokens_map.json", "bpe_model"), ("tokenizer_config.json", "sp_model"),
               ("added_tokens.json", "sp_model")]


@pytest.mark.parametrize("name,model", _JSON_FILES)
@FUZZ_JSON
@given(data=st.data())
def test_json_file_with_any_value_anywhere_exports_or_raises_tokenizer_error(request, tmp_path, name, model, data):
    source = request.getfixturevalue(model)
    original = json.loads((source / name).read_text(encoding="utf-8"))
    path, value = data.draw(_json_edit(original))
    document = _replace(json.loads(json.dumps(original)), path, value)
    model_dir = tmp_path / "model"
    shutil.copytree(source, model_dir, dirs_exist_ok=True)
    (model_dir / name).write_text(json.dumps(document), encoding="utf-8")
    try:
        export_tokenizer(model_dir)
        event("exported")
    except TokenizerError as e:
        event("refused")
        assert "\n" not in str(e) and str(model_dir) in str(e), str(e)


@pytest.mark.parametrize("name,model", _JSON_FILES)
def test_json_nested_100000_deep_is_one_tokenizer_error(request, tmp_path, name, model):
    model_dir = tmp_path / "model"
    shutil.copytree(request.getfixturevalue(model), model_dir)
    (model_dir / name).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TokenizerError, match=f"{name}: JSON nested too deeply"):
        export_tokenizer(model_dir)
