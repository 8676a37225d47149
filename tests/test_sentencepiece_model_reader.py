"""Our protobuf decoder of tokenizer.model against the sentencepiece package's own parser (the
generated ModelProto class), on models trained here with different options and on the example."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggufsmith.tokenizer.sentencepiece import is_sentencepiece_model
from ggufsmith.tokenizer.sentencepiece_model import parse_model_proto
from tests.tokenizer_helpers import train_sentencepiece

EXAMPLE_MODEL = Path(__file__).resolve().parent.parent / "examples" / "tiny-llama" / "tokenizer.model"
TRAINER_FIELDS = ("model_type", "treat_whitespace_as_suffix", "unk_id", "bos_id", "eos_id", "pad_id")
NORMALIZER_FIELDS = ("name", "precompiled_charsmap", "add_dummy_prefix", "remove_extra_whitespaces",
                     "escape_whitespaces")


def _official(data: bytes):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(data)
    return proto


@pytest.fixture(scope="module", params=["bpe", "unigram", "nmt_nfkc", "pad_unk_last", "example"])
def model_bytes(request, tmp_path_factory) -> bytes:
    if request.param == "example":
        return EXAMPLE_MODEL.read_bytes()
    options = {
        "bpe": {},
        "unigram": dict(model_type="unigram"),
        # a precompiled charsmap, extra-whitespace removal, and no dummy prefix
        "nmt_nfkc": dict(normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True, add_dummy_prefix=False),
        # negative and non-default special ids
        "pad_unk_last": dict(pad_id=3, unk_id=4, bos_id=-1, eos_id=5, treat_whitespace_as_suffix=True),
    }[request.param]
    directory = train_sentencepiece(tmp_path_factory.mktemp(request.param), vocab_size=800, **options)
    return (directory / "tokenizer.model").read_bytes()


def test_fields_equal_the_sentencepiece_parser(model_bytes):
    ours, official = parse_model_proto(model_bytes), _official(model_bytes)
    assert [(p.piece, p.score, p.type) for p in ours.pieces] == [(p.piece, p.score, p.type) for p in official.pieces]
    for name in TRAINER_FIELDS:
        assert getattr(ours.trainer_spec, name) == getattr(official.trainer_spec, name), name
    for name in NORMALIZER_FIELDS:
        assert getattr(ours.normalizer_spec, name) == getattr(official.normalizer_spec, name), name


def test_not_a_model_is_told_apart(tmp_path):
    tiktoken_like = tmp_path / "tokenizer.model"
    tiktoken_like.write_bytes(b"IQ== 0\nIg== 1\nIw== 2\nJA== 3\n")
    assert not is_sentencepiece_model(tiktoken_like)
    truncated = tmp_path / "truncated.model"
    truncated.write_bytes(EXAMPLE_MODEL.read_bytes()[:1001])
    assert not is_sentencepiece_model(truncated)


def test_a_file_rewritten_in_place_is_read_again(tmp_path):
    """tokenizer.model is parsed once for detection and export: a file replaced under the same
    name (same size even) gives its new pieces, not the ones parsed before."""
    from ggufsmith.tokenizer.sentencepiece import load_model_proto

    data = EXAMPLE_MODEL.read_bytes()
    official = _official(data)
    path = tmp_path / "tokenizer.model"
    path.write_bytes(data)
    assert load_model_proto(path).pieces[5].piece == official.pieces[5].piece
    official.pieces[5].score += 1.0  # the same size once serialized: only the score's bytes change
    changed = official.SerializeToString()
    assert len(changed) == len(data)
    path.write_bytes(changed)
    assert load_model_proto(path).pieces[5].score == official.pieces[5].score
