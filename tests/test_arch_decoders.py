"""The standard decoder plugins (falcon, gpt2, gptneox, gptj, bloom, mpt) on tiny transformers models.

Oracles: gguf-py's table of tensor names per architecture (llama.cpp's Python package), the GGUF
spec's list of required keys, transformers' own config objects for key values and, for gptj (which
no GGML runtime loads), the checkpoint's weights themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggufsmith.arch.tensors import gguf_name
from ggufsmith.readers.config import HFConfig
from ggufsmith.arch.registry import find_architecture, get_architecture
from ggufsmith.constants import GGUFValueType
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError
from tests.decoder_models import VARIANTS, build_model, rewrite_as_rw_config

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

VOCAB = 300
ARCH_OF = {kind: kind.split("-")[0] for kind in VARIANTS}

# The GGUF spec's required keys per architecture (section "Models"), without the "{arch}." prefix.
SPEC_REQUIRED = {
    "mpt": ["context_length", "embedding_length", "block_count", "attention.head_count",
            "attention.alibi_bias_max", "attention.clip_kqv", "attention.layer_norm_epsilon"],
    "gptneox": ["context_length", "embedding_length", "block_count", "use_parallel_residual",
                "rope.dimension_count", "attention.head_count", "attention.layer_norm_epsilon"],
    "gptj": ["context_length", "embedding_length", "block_count", "rope.dimension_count",
             "attention.head_count", "attention.layer_norm_epsilon"],
    "gpt2": ["context_length", "embedding_length", "block_count", "attention.head_count",
             "attention.layer_norm_epsilon"],
    "bloom": ["context_length", "embedding_length", "block_count", "feed_forward_length",
              "attention.head_count", "attention.layer_norm_epsilon"],
    "falcon": ["context_length", "embedding_length", "block_count", "attention.head_count",
               "attention.head_count_kv", "attention.use_norm", "attention.layer_norm_epsilon"],
}
# The spec types counts as uint64; llama.cpp reads them as uint32 and refuses any other type, as its
# own converter knows: we write uint32 (see docs/architectures.md).
SPEC_TYPES = {
    "use_parallel_residual": GGUFValueType.BOOL,
    "attention.use_norm": GGUFValueType.BOOL,
    "attention.layer_norm_epsilon": GGUFValueType.FLOAT32,
    "attention.alibi_bias_max": GGUFValueType.FLOAT32,
    "attention.clip_kqv": GGUFValueType.FLOAT32,
}


def lazy_safetensors(model_dir: Path) -> dict[str, LazyTensor]:
    from safetensors.numpy import load_file

    arrays = load_file(model_dir / "model.safetensors")
    return {name: LazyTensor.from_array(array, source=name) for name, array in arrays.items()}


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {kind: build_model(kind, root / kind, VOCAB) for kind in VARIANTS}


def plugin_for(model_dir: Path):
    config = HFConfig.from_dir(model_dir)
    return find_architecture(config)(config)


def gguf_py_names(arch: str, n_blocks: int) -> set[str]:
    """Every tensor name llama.cpp's gguf-py knows for the architecture, for .weight and .bias."""
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = set()
    for tensor in gguf.MODEL_TENSORS[model_arch]:
        template = gguf.TENSOR_NAMES[tensor]
        for bid in range(n_blocks):
            for suffix in ("weight", "bias"):
                names.add(f"{template.format(bid=bid)}.{suffix}")
    return names


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_plugin_is_found_from_config_json(models, kind):
    assert plugin_for(models[kind]).name == ARCH_OF[kind]


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_every_tensor_gets_a_name_llama_cpp_knows(models, kind):
    plugin = plugin_for(models[kind])
    source = lazy_safetensors(models[kind])
    mapped = plugin.map_tensors(source)
    names = [m.name for m in mapped]
    assert len(names) == len(set(names)) == len(source)
    assert set(names) <= gguf_py_names(plugin.name, 2)
    for m in mapped:
        assert m.tensor.load().shape == m.tensor.shape, m.name


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_spec_required_keys_present_with_spec_types(models, kind):
    arch = ARCH_OF[kind]
    metadata = {k: v for k, v in plugin_for(models[kind]).metadata().items()}
    for key in SPEC_REQUIRED[arch]:
        full = f"{arch}.{key}"
        assert full in metadata, full
        assert metadata[full].type == SPEC_TYPES.get(key, GGUFValueType.UINT32), full


@pytest.fixture(scope="session")
def gptj_dir(tmp_path_factory) -> Path:
    from tests.tokenizer_helpers import train_bpe

    model_dir = tmp_path_factory.mktemp("gptj") / "gptj"
    train_bpe(model_dir, "gpt2")
    n_tokens = len(json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]) + 1
    return build_model("gptj", model_dir, n_tokens + 3)


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_gptj_file_holds_the_checkpoint_weights_unchanged(gptj_dir, tmp_path, outtype):
    """gptj has no runtime to check logits against: its documented transform is the identity, so
    every tensor read back from the file must be the HF weight (rounded to F16 for f16 matrices),
    under the name the plugin's table gives it, and the keys must be transformers' config values."""
    import torch
    from transformers import GPTJForCausalLM

    from tests.decoder_convert import convert
    from tests.decoder_reference import read_gguf

    model = GPTJForCausalLM.from_pretrained(gptj_dir, dtype=torch.float32)
    hf = {k: v.numpy() for k, v in model.state_dict().items()}
    keys, tensors = read_gguf(convert(gptj_dir, tmp_path / "gptj.gguf", outtype))
    plugin = plugin_for(gptj_dir)
    table = {gguf_name(entry).format(bid=b): hf_name.format(bid=b) for hf_name, entry in plugin.tensor_names.items() for b in range(2)}
    assert len(tensors) == len(hf)
    for name, (data, ggml_type) in tensors.items():
        expected = hf[table[name]]
        if expected.ndim == 2 and outtype == "f16":
            assert int(ggml_type) == 1, name
            expected = expected.astype(np.float16)
        else:
            assert int(ggml_type) == 0, name
        np.testing.assert_array_equal(data.reshape(expected.shape), expected, err_msg=name)

    config = model.config
    assert keys["general.architecture"][0] == "gptj"
    assert {k: v for k, (v, _) in keys.items() if k.startswith("gptj.")} == {
        "gptj.context_length": config.n_positions,
        "gptj.embedding_length": config.n_embd,
        "gptj.block_count": config.n_layer,
        "gptj.feed_forward_length": 4 * config.n_embd,  # n_inner unset: transformers' GPTJMLP uses 4 * n_embd
        "gptj.rope.dimension_count": config.rotary_dim,
        "gptj.attention.head_count": config.n_head,
        "gptj.attention.layer_norm_epsilon": pytest.approx(config.layer_norm_epsilon),
    }


@pytest.mark.parametrize("kind", ["falcon-mq", "falcon-gqa"])
def test_falcon_rw_config_converts_like_the_transformers_config(models, tmp_path, kind):
    current = plugin_for(models[kind])
    old_dir = tmp_path / "rw"
    old_dir.mkdir()
    (old_dir / "model.safetensors").symlink_to(models[kind] / "model.safetensors")
    (old_dir / "config.json").write_text((models[kind] / "config.json").read_text())
    rewrite_as_rw_config(old_dir)
    old = plugin_for(old_dir)
    assert old.name == "falcon"
    drop = {"falcon.rope.freq_base"}  # the RW configs have no rope_theta: llama.cpp's default (the same 10000) applies
    assert {k: v for k, v in current.metadata().items() if k not in drop} == dict(old.metadata().items())
    for a, b in zip(current.map_tensors(lazy_safetensors(models[kind])), old.map_tensors(lazy_safetensors(old_dir))):
        assert a.name == b.name
        np.testing.assert_array_equal(a.tensor.load(), b.tensor.load())


@pytest.mark.parametrize(
    "arch, fields, message",
    [
        ("falcon", {"alibi": True}, "alibi"),
        ("falcon", {"bias": True}, "bias"),
        ("falcon", {"parallel_attn": False}, "parallel_attn"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gptneox", {"tie_word_embeddings": True}, "tie_word_embeddings"),
        ("bloom", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
        ("mpt", {"logit_scale": 0.5}, "logit_scale"),
        ("falcon", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope scaling"),
    ],
)
def test_variants_llama_cpp_cannot_run_are_refused(models, arch, fields, message):
    kind = next(k for k in VARIANTS if ARCH_OF[k] == arch)
    values = json.loads((models[kind] / "config.json").read_text()) | fields
    with pytest.raises(ConversionError, match=message):
        plugin = get_architecture(arch)(HFConfig(values, models[kind] / "config.json"))
        plugin.metadata()


# --- against llama.cpp's convert_hf_to_gguf.py ------------------------------------------------------

from tests import decoder_reference  # noqa: E402
from tests.decoder_convert import convert  # noqa: E402
from tests.test_tokenizer_vs_convert_hf import ONLY_OURS as TOKENIZER_ONLY_OURS  # noqa: E402
from tests.test_tokenizer_vs_convert_hf import ONLY_THEIRS as TOKENIZER_ONLY_THEIRS  # noqa: E402
from tests.tokenizer_helpers import train_bpe  # noqa: E402

# Config fields the reference converter reads under names transformers >= 5 no longer writes (or a
# class name transformers does not use), added so that it runs; ours reads both spellings.
REFERENCE_CONFIG_EDITS = {
    "gpt2": lambda c: c | {"n_ctx": c["n_positions"]},
    # The reference reads rotary_pct, which transformers' AutoConfig (that the reference reads
    # config.json through) turns into rope_parameters; an unknown model_type makes it fall back to
    # the JSON as written.
    "gptneox": lambda c: c | {"rotary_pct": c["rope_parameters"]["partial_rotary_factor"], "model_type": "json-only"},
    # AutoConfig also sets num_kv_heads = num_attention_heads when absent; the reference then takes
    # that even for multi_query models (where transformers ignores it) and fails on the qkv. From
    # the RW config it converts them.
    "falcon-mq": "rw",
    "mpt": lambda c: c | {"architectures": ["MPTForCausalLM"]},
}
# Keys only we write, and why (see docs/architectures.md):
ONLY_OURS = {
    # rope_theta from config.json; the reference leaves llama.cpp's default, wrong for other values.
    "falcon": {"falcon.rope.freq_base", "falcon.attention.use_norm"},  # use_norm: required by the spec
    "gptneox": {"gptneox.rope.freq_base"},
    # the spec's names for what llama.cpp reads as max_alibi_bias and clamp_kqv
    "mpt": {"mpt.attention.alibi_bias_max", "mpt.attention.clip_kqv"},
}
# Keys both write with different values, and why:
DIFFERENT_VALUES = {
    # bloom's config.json has no context length (seq_length is absent from transformers' BloomConfig):
    # the reference falls back to hidden_size, we to BLOOM's 2048.
    "bloom": {"bloom.context_length"},
}
TOKENIZER_STYLE = {"falcon": "falcon", "bloom": "bloom"}
# Every architecture at f32; the quantized types for the three layout changes (regrouped qkv with
# two kv heads, Conv1D transposes, regrouped qkv with biases and the embedding norm).
REFERENCE_CASES = [(kind, "f32") for kind in VARIANTS if ARCH_OF[kind] != "gptj" and kind != "gptneox-sequential"] + [
    (kind, outtype) for kind in ("falcon-gqa", "gpt2", "bloom") for outtype in ("f16", "q8_0")
]


@pytest.fixture(scope="session")
def reference_dirs(tmp_path_factory) -> dict[str, Path]:
    """Each model with a trained tokenizer, its config.json written so the reference can read it."""
    root = tmp_path_factory.mktemp("decoders_reference")
    dirs = {}
    for kind in {k for k, _ in REFERENCE_CASES}:
        model_dir = root / kind
        train_bpe(model_dir, TOKENIZER_STYLE.get(ARCH_OF[kind], "gpt2"))
        n_tokens = len(json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]) + 1
        build_model(kind, model_dir, n_tokens + 3)
        edit = REFERENCE_CONFIG_EDITS.get(kind, lambda c: c)
        if edit == "rw":
            rewrite_as_rw_config(model_dir)
        else:
            config = json.loads((model_dir / "config.json").read_text())
            (model_dir / "config.json").write_text(json.dumps(edit(config)))
        dirs[kind] = model_dir
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("kind, outtype", REFERENCE_CASES)
def test_same_keys_and_tensors_as_convert_hf_to_gguf(reference_dirs, tmp_path, kind, outtype):
    model_dir = reference_dirs[kind]
    arch = ARCH_OF[kind]
    ours_keys, ours_tensors = decoder_reference.read_gguf(convert(model_dir, tmp_path / "ours.gguf", outtype))
    pre = ours_keys["tokenizer.ggml.pre"][0]
    theirs_keys, theirs_tensors = decoder_reference.read_gguf(
        decoder_reference.reference_convert(model_dir, tmp_path / "reference.gguf", outtype, pre=pre)
    )

    compared = [k for k in theirs_keys if k.startswith((f"{arch}.", "tokenizer.")) or k == "general.file_type"]
    assert {k for k in ours_keys if k.startswith(f"{arch}.")} - set(theirs_keys) <= ONLY_OURS.get(arch, set())
    assert {k for k in ours_keys if k.startswith("tokenizer.")} - set(theirs_keys) <= TOKENIZER_ONLY_OURS
    for key in compared:
        if key in TOKENIZER_ONLY_THEIRS:
            continue
        assert key in ours_keys, key
        if key in DIFFERENT_VALUES.get(arch, set()):
            continue
        (ours, ours_type), (theirs, theirs_type) = ours_keys[key], theirs_keys[key]
        assert int(ours_type) == int(theirs_type), key
        assert ours == (pytest.approx(theirs) if isinstance(theirs, float) else theirs), key

    assert set(ours_tensors) == set(theirs_tensors)
    for name, (data, ggml_type) in theirs_tensors.items():
        ours, ours_type = ours_tensors[name]
        assert int(ours_type) == int(ggml_type), name
        assert ours.shape == data.shape, name
        assert ours.tobytes() == data.tobytes(), name


# Buffers that checkpoints saved by older transformers carry next to the weights (causal masks, rotary
# tables): dropped on purpose. Anything else unknown must stop the conversion.
OLD_BUFFERS = {
    "gpt2": ["transformer.h.0.attn.bias", "transformer.h.1.attn.masked_bias"],
    "gptneox": ["gpt_neox.layers.0.attention.bias", "gpt_neox.layers.0.attention.masked_bias",
                "gpt_neox.layers.1.attention.rotary_emb.inv_freq"],
    "gptj": ["transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"],
}


@pytest.mark.parametrize("kind", list(OLD_BUFFERS))
def test_old_checkpoint_buffers_are_dropped_and_unknown_tensors_refused(models, kind):
    plugin = plugin_for(models[kind])
    source = lazy_safetensors(models[kind])
    expected = [m.name for m in plugin.map_tensors(source)]
    buffer = LazyTensor.from_array(np.zeros((4, 4), np.float32))
    with_buffers = source | {name: buffer for name in OLD_BUFFERS[kind]}
    assert [m.name for m in plugin.map_tensors(with_buffers)] == expected
    with pytest.raises(ConversionError, match="transformer.h.0.unknown.weight"):
        plugin.map_tensors(source | {"transformer.h.0.unknown.weight": buffer})


@pytest.mark.parametrize("kind", ["gpt2", "bloom"])
def test_checkpoints_without_the_transformer_prefix_map_the_same(models, kind):
    """GPT2Model / BloomModel checkpoints (openai-community/gpt2, bigscience/bloom-560m) name
    tensors without "transformer."."""
    plugin = plugin_for(models[kind])
    source = lazy_safetensors(models[kind])
    bare = {name.removeprefix("transformer."): tensor for name, tensor in source.items()}
    for a, b in zip(plugin.map_tensors(source), plugin.map_tensors(bare)):
        assert a.name == b.name
        np.testing.assert_array_equal(a.tensor.load(), b.tensor.load())
