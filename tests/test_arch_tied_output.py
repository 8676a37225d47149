"""The output head of falcon, gpt2, bloom and mpt checkpoints: kept as `output.weight` when
config.json unties it from the embeddings, left out when it is tied (transformers then uses the
embeddings, and llama.cpp reads token_embd when a file has no `output`), even if the checkpoint
stores one. The weights are read back with the safetensors library.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ggufsmith.readers.config import HFConfig
from ggufsmith.arch.registry import find_architecture
from tests.decoder_models import build_model
from tests.llama_models import checkpoint_tensors

pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", ["falcon-mq", "gpt2", "bloom", "mpt"])
@pytest.mark.parametrize("tied", [False, True])
def test_output_head_is_kept_only_when_untied(tmp_path, kind, tied):
    from safetensors.numpy import load_file

    build_model(kind, tmp_path, vocab_size=50, tie_word_embeddings=False)  # stores lm_head.weight
    lm_head = load_file(tmp_path / "model.safetensors")["lm_head.weight"]
    if tied:
        config = json.loads((tmp_path / "config.json").read_text()) | {"tie_word_embeddings": True}
        (tmp_path / "config.json").write_text(json.dumps(config))

    config = HFConfig.from_dir(tmp_path)
    mapped = {t.name: t for t in find_architecture(config)(config).map_tensors(checkpoint_tensors(tmp_path))}

    assert "token_embd.weight" in mapped
    if tied:
        assert "output.weight" not in mapped
    else:
        assert mapped["output.weight"].sources == ("lm_head.weight",)
        np.testing.assert_array_equal(mapped["output.weight"].tensor.load(), lm_head)
