"""DistilBERT, CamemBERT and EuroBERT folders llama.cpp's bert graph cannot run as transformers does, or whose
config.json does not describe the weights: each is refused in one line naming the key, class or
tensor (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bert_models import build_bert, build_eurobert, train_wordpiece, train_xlmr_unigram
from tests.damaged_inputs import assert_convert_refused, edit_json

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bert_family_damaged")
    for kind, options in {"distilbert": {}, "distilbert-classifier": {"labels": ["negative", "positive"]}}.items():
        train_wordpiece(root / kind, lowercase=True, vocab_size=300)
        build_bert(root / kind, distilbert=True, hidden_size=32, **options)
    train_xlmr_unigram(root / "camembert", vocab_size=400, tokenizer_class="CamembertTokenizer")
    build_bert(root / "camembert", camembert=True, hidden_size=32)
    build_eurobert(root / "eurobert")
    return {kind: root / kind for kind in ("distilbert", "distilbert-classifier", "camembert", "eurobert")}


def _config(**changes):
    return lambda model_dir: edit_json(model_dir / "config.json", lambda c: c | changes)


# (folder, damage, culprit named in the error)
CASES = {
    "distilbert-relu-activation": ("distilbert", _config(activation="relu"), "activation is 'relu'"),
    # its head is pre_classifier, ReLU, classifier; llama.cpp's rank pooling puts tanh after the first
    "distilbert-sequence-classifier": ("distilbert-classifier", lambda d: None, "DistilBertForSequenceClassification"),
    "distilbert-more-layers-than-stored": ("distilbert", _config(n_layers=4), "blk.3"),
    "distilbert-dim-not-the-weights'": ("distilbert", _config(dim=48), "dim"),
    "distilbert-no-layer-count": ("distilbert", lambda d: edit_json(
        d / "config.json", lambda c: {k: v for k, v in c.items() if k != "n_layers"}), "n_layers"),
    "camembert-positions-start-past-the-table": ("camembert", _config(pad_token_id=120), "pad_token_id = 120"),
    "eurobert-gelu-activation": ("eurobert", _config(hidden_act="gelu"), "hidden_act is 'gelu'"),
    "eurobert-attention-biases": ("eurobert", _config(attention_bias=True), "attention_bias"),
    "eurobert-rope-scaling": ("eurobert", _config(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                   "rope_theta": 10000.0}), "rope scaling 'linear'"),
    "eurobert-more-kv-heads-than-stored": ("eurobert", _config(num_key_value_heads=4), "attn_k.weight"),
    "eurobert-dense-after-pooling": ("eurobert", lambda d: edit_json(d / "modules.json", lambda m: m + [
        {"idx": len(m), "name": str(len(m)), "path": "9_Dense", "type": "sentence_transformers.models.Dense"}]),
                                     "Dense"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(originals, tmp_path, case):
    kind, damage, culprit = CASES[case]
    assert_convert_refused(originals[kind], tmp_path, damage, culprit)
