"""Classifier / reranker folders and jina-embeddings-v3 folders llama.cpp cannot run as transformers
does, or that are broken: each is refused in one line naming the key, file or tensor (contract:
tests/damaged_inputs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bert_models import build_bert, build_jina_v3, jina_v3_as_published, train_wordpiece, train_xlmr_unigram
from tests.damaged_inputs import assert_convert_refused, edit_config, edit_safetensors

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rerank_jina_damaged")
    train_wordpiece(root / "bert-reranker", lowercase=True, vocab_size=300)
    build_bert(root / "bert-reranker", hidden_size=32, labels=["LABEL_0"])
    train_xlmr_unigram(root / "jina", vocab_size=400)
    build_jina_v3(root / "jina", hidden_size=32)
    jina_v3_as_published(root / "jina", root / "jina-published")
    return {name: root / name for name in ("bert-reranker", "jina", "jina-published")}


def _config(**changes):
    return lambda model_dir: edit_config(model_dir, **changes)


def _without_config_key(key: str):
    def damage(model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        del config[key]
        (model_dir / "config.json").write_text(json.dumps(config))
    return damage


def _without_tensors(*names: str):
    return lambda model_dir: edit_safetensors(model_dir, lambda tensors: [tensors.pop(name) for name in names])


# (folder, damage, culprit named in the error)
CASES = {
    # classifiers and rerankers
    "id2label-not-ids": ("bert-reranker", _config(id2label={"first": "LABEL_0"}), "id2label"),
    "more-labels-than-the-head's-rows": ("bert-reranker", _config(id2label={"0": "a", "1": "b"}), "id2label"),
    "classifier-without-its-pooler": ("bert-reranker", _without_tensors("bert.pooler.dense.weight"),
                                      "cls.weight (from bert.pooler.dense.weight)"),
    # jina-embeddings-v3
    "jina-relu": ("jina", _config(hidden_act="relu"), "hidden_act"),
    "jina-scaled-rotary": ("jina", _config(rope_parameters={"rope_type": "linear", "rope_theta": 20000.0,
                                                            "factor": 2.0}), "rope scaling"),
    "jina-without-rotary-base": ("jina", _without_config_key("rope_parameters"), "rotary_emb_base"),
    "jina-published-absolute-positions": ("jina-published", _config(position_embedding_type="absolute"),
                                          "position_embedding_type"),
    "jina-published-without-a-base-weight": ("jina-published", _without_tensors(
        "roberta.encoder.layers.1.mixer.Wqkv.parametrizations.weight.original"), "blk.1.attn_qkv.weight"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
