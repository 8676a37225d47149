"""The llama plugin's tensors and keys against llama.cpp's own converter (convert_hf_to_gguf.py)
on the same tiny transformers checkpoints; its f32 output is read back with gguf-py's reader."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.arch import HFConfig, find_architecture
from tests.llama_models import (
    VARIANTS,
    build_model,
    checkpoint_tensors,
    reference_convert,
    tokenizer_vocab_size,
    with_tokenizer,
)
from tests.tokenizer_helpers import train_sentencepiece


@pytest.fixture(scope="session")
def sp_tokenizer_dir(tmp_path_factory):
    return train_sentencepiece(tmp_path_factory.mktemp("sp"))


@pytest.fixture(scope="session")
def converted(tmp_path_factory, sp_tokenizer_dir):
    """variant -> (our plugin instance, our mapped tensors, the reference f32 GGUF reader)."""
    import gguf

    cache = {}

    def get(variant):
        if variant not in cache:
            model_dir = with_tokenizer(tmp_path_factory.mktemp(variant), sp_tokenizer_dir)
            build_model(model_dir, variant, tokenizer_vocab_size(model_dir))
            reference = reference_convert(model_dir, model_dir / "reference-f32.gguf", "f32")
            config = HFConfig.from_dir(model_dir)
            plugin = find_architecture(config)(config)
            cache[variant] = (plugin, plugin.map_tensors(checkpoint_tensors(model_dir)), gguf.GGUFReader(reference))
        return cache[variant]

    return get


def _reference_tensors(reader):
    # gguf-py gives the data in numpy order (the reverse of ggml's ne), as we hold it.
    return {t.name: np.asarray(t.data) for t in reader.tensors}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tensors_equal_llamacpp_converter(converted, variant):
    plugin, mapped, reader = converted(variant)
    ours = {m.name: m.tensor.load() for m in mapped}
    theirs = _reference_tensors(reader)
    assert sorted(ours) == sorted(theirs)
    for name, array in ours.items():
        assert array.shape == theirs[name].shape, name
        # f32 in, f32 out: bit-identical, which pins the rotary permutation and expert stacking.
        np.testing.assert_array_equal(array.astype(np.float32), theirs[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_arch_keys_equal_llamacpp_converter(converted, variant):
    import gguf

    plugin, _, reader = converted(variant)
    ours = plugin.metadata()
    theirs = {name: field for name, field in reader.fields.items() if name.startswith("llama.")}
    # For an explicit yarn attention_factor llama.cpp's converter writes only yarn_attn_factor, which
    # its llama runtime does not read (logits then differ from transformers' by ~50%); we also write
    # rope.scaling.attn_factor, which it reads. test_llama_convert checks the logits.
    extra = {"llama.rope.scaling.attn_factor"} if variant == "llama_rope_yarn_attn" else set()
    assert sorted(ours) == sorted(set(theirs) | extra)
    for key, value in ours.items():
        if key in extra:
            continue
        field = theirs[key]
        assert int(value.type) == int(field.types[0]), key
        expected = field.contents()
        if value.type == gguf.GGUFValueType.FLOAT32:
            assert np.float32(value.plain()) == np.float32(expected), key
        else:
            assert value.plain() == expected, key
