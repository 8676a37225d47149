"""T5 folders llama.cpp cannot run as transformers does, and a damaged T5 tokenizer config: each is
refused in one line naming the key (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.damaged_inputs import assert_convert_refused, edit_json
from tests.t5_models import build_t5, train_t5_unigram

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    model_dir = tmp_path_factory.mktemp("t5_damaged") / "t5"
    train_t5_unigram(model_dir, vocab_size=400)
    (model_dir / "tokenizer.json").unlink()  # spiece.model + tokenizer_config.json, as older T5 folders
    return build_t5(model_dir, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def _edit_json(relative: str, **changes):
    return lambda model_dir: edit_json(model_dir / relative, **changes)


# damage, culprit named in the error
CASES = {
    "gated-silu-feed-forward": (_edit_json("config.json", feed_forward_proj="gated-silu"), "feed_forward_proj"),
    "other-relative-max-distance": (_edit_json("config.json", relative_attention_max_distance=64),
                                    "relative_attention_max_distance"),
    "deeper-decoder": (_edit_json("config.json", num_decoder_layers=4), "num_decoder_layers"),
    "sentinel-count-absurd": (_edit_json("tokenizer_config.json", extra_ids=10**9), "extra_ids"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line(original, tmp_path, case):
    damage, culprit = CASES[case]
    assert_convert_refused(original, tmp_path, damage, culprit)
