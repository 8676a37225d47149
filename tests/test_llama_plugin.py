"""The llama plugin's tensors and keys against llama.cpp's own converter (convert_hf_to_gguf.py)
on the same tiny transformers checkpoints; its f32 output is read back with gguf-py's reader."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.arch import HFConfig, find_architecture
from tests.llama_fixtures import model_dirs, reference, tokenizer_dirs  # noqa: F401 (fixtures)
from tests.llama_models import VARIANTS, checkpoint_tensors


@pytest.fixture(scope="session")
def converted(model_dirs, reference):
    """variant -> (our plugin instance, our mapped tensors, the reference f32 GGUF reader)."""
    import gguf

    def get(variant):
        config = HFConfig.from_dir(model_dirs(variant))
        plugin = find_architecture(config)(config)
        mapped = plugin.map_tensors(checkpoint_tensors(model_dirs(variant)))
        return plugin, mapped, gguf.GGUFReader(reference(variant, "f32"))

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


@pytest.mark.slow
def test_old_config_layout_gives_the_same_keys(model_dirs, tmp_path):
    """Configs written before transformers 5 have rope_theta and rope_scaling ({"type": ...}) at the
    top level instead of rope_parameters; llama.cpp's converter reads both, and so must we."""
    import json
    import shutil

    import gguf

    from tests.llamacpp_reference import run_reference_converter

    source = model_dirs("llama_rope_linear")
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".gguf":
            shutil.copy(f, tmp_path / f.name)
    config = json.loads((source / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    (tmp_path / "config.json").write_text(json.dumps(config))

    ours = find_architecture(HFConfig.from_dir(tmp_path))(HFConfig.from_dir(tmp_path)).metadata()
    reader = gguf.GGUFReader(run_reference_converter(tmp_path, tmp_path / "reference.gguf", "f32"))
    theirs = {name: field.contents() for name, field in reader.fields.items() if name.startswith("llama.")}
    assert {k: v.plain() for k, v in ours.items()} == pytest.approx(theirs)
    assert theirs["llama.rope.scaling.type"] == "linear"


def _plugin(**fields):
    config = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4,
                  num_hidden_layers=2, intermediate_size=96, vocab_size=100, rms_norm_eps=1e-5)
    config.update(fields)
    hf_config = HFConfig(config, "model/config.json")
    return find_architecture(hf_config)(hf_config)


@pytest.mark.parametrize("hf_class", ["LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"])
def test_llama_family_classes_use_the_llama_plugin(hf_class):
    assert _plugin(architectures=[hf_class]).name == "llama"


def test_unsupported_rope_scaling_is_a_clear_error():
    from ggufsmith.errors import ConversionError

    with pytest.raises(ConversionError, match=r"model/config.json rope_parameters: rope type 'warp' is not supported"):
        _plugin(rope_parameters={"rope_type": "warp", "rope_theta": 1e4}).metadata()


def test_llama3_rope_without_its_parameters_is_a_clear_error():
    from ggufsmith.errors import ConversionError

    with pytest.raises(ConversionError, match="rope_parameters: low_freq_factor is not set"):
        _plugin(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}).extra_tensors()


def test_missing_expert_is_a_clear_error():
    from ggufsmith.readers.lazy_tensor import LazyTensor
    from ggufsmith.errors import ConversionError

    plugin = _plugin(architectures=["MixtralForCausalLM"], num_local_experts=3, num_experts_per_tok=2)
    weight = LazyTensor.from_array(np.zeros((96, 64), np.float32))
    tensors = {f"model.layers.0.block_sparse_moe.experts.{x}.w1.weight": weight for x in (0, 2)}
    with pytest.raises(ConversionError, match=r"experts \[1\] are missing"):
        plugin.map_tensors(tensors)


def test_dynamic_rope_writes_no_scaling_and_warns(caplog):
    # Matches convert_hf_to_gguf.py (no keys): llama.cpp has no dynamic NTK scaling.
    with caplog.at_level("WARNING"):
        metadata = _plugin(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}).metadata()
    assert not [key for key in metadata if ".rope.scaling." in key]
    assert "max_position_embeddings" in caplog.text
