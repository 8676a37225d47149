"""Meta-layout checkpoints (params.json + consolidated.*.pth + tokenizer.model, readers/meta.py).

A small random llama is built with transformers and saved in the Hugging Face layout; the test
derives Meta's layout of the same weights from it (q/k rows back to Meta's interleaved rotary order,
Meta's names, two model-parallel ranks split as fairscale splits them). Two independent checks
then hold the reader to account:
  - llama.cpp's own converter of Meta checkpoints (examples/convert_legacy_llama.py, from the
    llama-cpp-python sdist) converts the test's Meta folder to the same tensor bytes as ggufsmith
    does, which also validates the derived layout (transformers 5 no longer ships its
    Meta -> HF script);
  - ggufsmith's conversion of the Meta folder equals its conversion of the Hugging Face folder
    tensor for tensor, byte for byte, and llama.cpp runs both to the same logits, which match
    transformers' for the Hugging Face model.
Llama 3's layout differs: the embedding is split by rows, vocab_size is given and use_scaled_rope
asks for Llama 3.1's frequency scaling (a rope_freqs tensor); the legacy converter cannot read it,
so its check is the Hugging Face copy's (the HF config written as transformers' converter writes it).
The scaling factor is params.json's rope_scaling_factor, else that of the Hugging Face release of the
model's shape: 32 for Llama 3.2 1B's (the "llama3.2" layout, whose params.json names none), 8 for
Llama 3.1's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.family_models import hf_logits, llamacpp_logits, relative_error
from tests.llamacpp_reference import legacy_converter, run_reference_script
from tests.meta_models import LAYOUTS, make_hf_llama, write_header_only_meta_folder, write_meta_folder

torch = pytest.importorskip("torch")

TOKENS = [1, 450, 1996, 1354, 701, 432, 1204, 975, 278, 1366, 1203, 1889]


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """layout -> (Hugging Face folder, Meta folder of the same weights)."""
    root = tmp_path_factory.mktemp("meta")
    made = {}
    for layout, (params, config_changes, embedding_axis) in LAYOUTS.items():
        hf_dir = make_hf_llama(root / f"{layout}-hf", config_changes)
        made[layout] = (hf_dir, write_meta_folder(root / f"{layout}-meta", hf_dir, params, embedding_axis))
    return made


def tensors_of(path: Path) -> dict[str, tuple[tuple, int, bytes]]:
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), bytes(t.data)) for t in reader.tensors}


def keys_of(path: Path) -> dict[str, object]:
    import gguf

    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def convert(src: Path, out: Path, outtype: str) -> Path:
    import ggufsmith

    ggufsmith.convert(src, out, outtype)
    return out


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_meta_folder_converts_to_the_tensors_of_its_hugging_face_copy(models, layout, outtype, tmp_path):
    hf_dir, meta_dir = models[layout]
    from_meta = convert(meta_dir, tmp_path / "meta.gguf", outtype)
    from_hf = convert(hf_dir, tmp_path / "hf.gguf", outtype)
    meta_tensors_, hf_tensors = tensors_of(from_meta), tensors_of(from_hf)
    assert list(meta_tensors_) == list(hf_tensors)  # same tensors, same order
    different = [name for name in hf_tensors if meta_tensors_[name] != hf_tensors[name]]
    assert different == []
    meta_keys, hf_keys = keys_of(from_meta), keys_of(from_hf)
    for key, value in hf_keys.items():
        if key.startswith(("llama.", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "general.file_type")):
            assert meta_keys.get(key) == value, key
    if layout in ("llama3.1", "llama3.2"):
        assert "rope_freqs.weight" in meta_tensors_  # use_scaled_rope became Llama 3's frequency factors


def test_rope_scaling_factor_in_params_json_is_the_one_written(models, tmp_path):
    """A params.json naming its factor gets that factor's rope_freqs, as the Hugging Face config.json
    with that factor does, whatever the shape rule would pick."""
    import json
    import shutil

    hf_dir, meta_dir = models["llama3.1"]
    hf16, meta16 = tmp_path / "hf16", tmp_path / "meta16"
    shutil.copytree(hf_dir, hf16)
    shutil.copytree(meta_dir, meta16)
    config = json.loads((hf16 / "config.json").read_text())
    config["rope_parameters"]["factor"] = 16.0
    (hf16 / "config.json").write_text(json.dumps(config))
    params = json.loads((meta16 / "params.json").read_text())
    (meta16 / "params.json").write_text(json.dumps(params | {"rope_scaling_factor": 16}))
    from_meta = tensors_of(convert(meta16, tmp_path / "meta16.gguf", "f32"))
    assert from_meta["rope_freqs.weight"] == tensors_of(convert(hf16, tmp_path / "hf16.gguf", "f32"))["rope_freqs.weight"]
    factor8 = tensors_of(convert(meta_dir, tmp_path / "meta8.gguf", "f32"))
    assert from_meta["rope_freqs.weight"] != factor8["rope_freqs.weight"]


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_llamacpp_legacy_converter_gives_the_same_tensors(models, outtype, tmp_path):
    """llama.cpp's converter of Meta checkpoints reads the test's Meta folder as ggufsmith does.
    Llama 2's layout only: that script always joins the embedding's ranks by columns (and knows no
    use_scaled_rope), so it cannot read Llama 3's."""
    _, meta_dir = models["llama2"]
    theirs = tmp_path / "legacy.gguf"
    status, output = run_reference_script([str(meta_dir), "--outfile", str(theirs), "--outtype", outtype],
                                          script=legacy_converter(), timeout=600)
    assert status == 0, output[-2000:]
    ours = tensors_of(convert(meta_dir, tmp_path / "ours.gguf", outtype))
    reference = tensors_of(theirs)
    assert sorted(ours) == sorted(reference)
    assert [name for name in reference if ours[name] != reference[name]] == []
    our_keys, their_keys = keys_of(tmp_path / "ours.gguf"), keys_of(theirs)
    for key in ("llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
                "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size"):
        assert our_keys[key] == their_keys[key], key


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_llamacpp_runs_the_meta_conversion_as_the_hugging_face_model(models, layout, tmp_path):
    hf_dir, meta_dir = models[layout]
    from_meta = llamacpp_logits(convert(meta_dir, tmp_path / "meta.gguf", "f32"), TOKENS)
    from_hf = llamacpp_logits(convert(hf_dir, tmp_path / "hf.gguf", "f32"), TOKENS)
    np.testing.assert_array_equal(from_meta, from_hf)
    assert relative_error(from_meta, hf_logits(hf_dir, "LlamaForCausalLM", TOKENS)) < 1e-3


def test_a_single_rank_and_its_split_convert_alike(models, tmp_path):
    """One consolidated.00.pth (a 7B/8B release) and the same weights over four ranks."""
    hf_dir, _ = models["llama2"]
    params, _, axis = LAYOUTS["llama2"]
    one = convert(write_meta_folder(tmp_path / "one", hf_dir, params, axis, ranks=1), tmp_path / "one.gguf", "f16")
    four = convert(write_meta_folder(tmp_path / "four", hf_dir, params, axis, ranks=4), tmp_path / "four.gguf", "f16")
    assert tensors_of(one) == tensors_of(four)


# Meta's releases with use_scaled_rope, their params.json as llama-models' sku_list gives it (one block
# here), the feed-forward width and the rope factor of their Hugging Face config.json.
RELEASES = {
    "Llama-3.2-1B": ({"dim": 2048, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.5, "multiple_of": 256},
                     8192, 32.0),
    "Llama-3.2-3B": ({"dim": 3072, "n_heads": 24, "n_kv_heads": 8, "ffn_dim_multiplier": 1.0, "multiple_of": 256},
                     8192, 32.0),
    "Llama-3.1-8B": ({"dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3, "multiple_of": 1024},
                     14336, 8.0),
    "Llama-3.3-70B": ({"dim": 8192, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3, "multiple_of": 4096},
                      28672, 8.0),
    "Llama-3.1-405B": ({"dim": 16384, "n_heads": 128, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
                        "multiple_of": 4096}, 53248, 8.0),
}


@pytest.mark.parametrize("release", list(RELEASES))
def test_release_shapes_get_the_rope_factor_of_their_hugging_face_config(release, tmp_path):
    """A params.json of each release's shape, without rope_scaling_factor as Meta ships them, gets the
    rope_freqs that transformers computes for the release's config.json (llama3 rope, its factor):
    llama.cpp divides each rotary frequency by it, so it must be default / scaled frequency."""
    import ggufsmith
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    shape, intermediate, factor = RELEASES[release]
    params = shape | {"n_layers": 1, "vocab_size": 128256, "norm_eps": 1e-5, "rope_theta": 500000.0,
                      "use_scaled_rope": True}
    folder = write_header_only_meta_folder(tmp_path / release, params, intermediate)
    plan = ggufsmith.convert(folder, tmp_path / "out.gguf", "bf16", dry_run=True, with_tokenizer=False)
    [rope_freqs] = [t.tensor.load() for t in plan.tensors if t.name == "rope_freqs.weight"]

    config = transformers.LlamaConfig(
        hidden_size=shape["dim"], num_attention_heads=shape["n_heads"], max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = shape["dim"] // shape["n_heads"]
    default = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    np.testing.assert_allclose(rope_freqs, (default / scaled).numpy(), rtol=1e-6)
