"""T5 folders llama.cpp cannot run as transformers does, and a damaged T5 tokenizer config: each is
refused in one line naming the key (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, run_cli
from tests.t5_models import build_t5, train_t5_unigram

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    model_dir = tmp_path_factory.mktemp("t5_damaged") / "t5"
    train_t5_unigram(model_dir, vocab_size=400)
    (model_dir / "tokenizer.json").unlink()  # spiece.model + tokenizer_config.json, as older T5 folders
    return build_t5(model_dir, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def _edit_json(relative: str, **changes):
    def damage(model_dir: Path) -> None:
        path = model_dir / relative
        path.write_text(json.dumps(json.loads(path.read_text()) | changes))
    return damage


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
    model_dir = tmp_path / "t5"
    shutil.copytree(original, model_dir)
    damage(model_dir)
    target = tmp_path / "out.gguf"
    assert_clean_failure(run_cli("convert", model_dir, target, "--outtype", "f32"), culprit, target)
