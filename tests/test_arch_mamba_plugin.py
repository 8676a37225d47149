"""The mamba plugin against transformers' MambaForCausalLM and llama.cpp's own tensor names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ggufsmith.readers.config import HFConfig
from ggufsmith.arch.mamba import Mamba
from ggufsmith.arch.registry import find_architecture
from ggufsmith.constants import GGUFValueType
from ggufsmith.errors import ConversionError
from tests.archs_other_helpers import documented_gguf_name, documented_names, lazy_source, numpy_state_dict

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_mamba():
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2,
                                      conv_kernel=4, tie_word_embeddings=False)
    return transformers.MambaForCausalLM(config).eval()


def _config(model) -> HFConfig:
    values = model.config.to_dict()
    values["architectures"] = ["MambaForCausalLM"]
    return HFConfig(values)


def test_registry_picks_mamba_from_config(hf_mamba):
    assert find_architecture(_config(hf_mamba)) is Mamba


def test_metadata_has_the_keys_llama_cpp_reads(hf_mamba):
    c = hf_mamba.config
    md = Mamba(_config(hf_mamba)).metadata()
    expected = {
        "mamba.context_length": (2**20, GGUFValueType.UINT32),
        "mamba.embedding_length": (c.hidden_size, GGUFValueType.UINT32),
        "mamba.feed_forward_length": (0, GGUFValueType.UINT32),
        "mamba.attention.head_count": (0, GGUFValueType.UINT32),
        "mamba.block_count": (c.num_hidden_layers, GGUFValueType.UINT32),
        "mamba.ssm.conv_kernel": (c.conv_kernel, GGUFValueType.UINT32),
        "mamba.ssm.inner_size": (c.intermediate_size, GGUFValueType.UINT32),
        "mamba.ssm.state_size": (c.state_size, GGUFValueType.UINT32),
        "mamba.ssm.time_step_rank": (c.time_step_rank, GGUFValueType.UINT32),
        "mamba.attention.layer_norm_rms_epsilon": (pytest.approx(c.layer_norm_epsilon), GGUFValueType.FLOAT32),
        "mamba.ssm.dt_b_c_rms": (False, GGUFValueType.BOOL),
    }
    assert {k: (md.get(k), md[k].type) for k in md} == expected


def test_tensors_have_llama_cpp_names_and_layouts(hf_mamba):
    gguf = pytest.importorskip("gguf")
    state = numpy_state_dict(hf_mamba)
    mapped = {t.name: t for t in Mamba(_config(hf_mamba)).map_tensors(lazy_source(state))}

    # every name is one llama.cpp's gguf-py lists for the mamba architecture
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.MAMBA]}
    for name in mapped:
        base = name.removesuffix(".weight").removesuffix(".bias")
        assert re_block(base) in known, name
    # and the one documented in docs/architectures-other.md for its source
    rows = documented_names("mamba")
    for t in mapped.values():
        assert documented_gguf_name(rows, t.sources[0]) == t.name

    c = hf_mamba.config
    for bid, layer in enumerate(hf_mamba.backbone.layers):
        mixer = layer.mixer
        conv = mapped[f"blk.{bid}.ssm_conv1d.weight"].tensor.load()
        # llama.cpp wants {d_conv, d_inner}: numpy (d_inner, d_conv)
        assert conv.shape == (c.intermediate_size, c.conv_kernel)
        np.testing.assert_array_equal(conv, mixer.conv1d.weight.detach().numpy()[:, 0, :])
        # transformers' forward uses A = -exp(A_log); ours is correctly rounded, torch's within 1 ulp
        a = mapped[f"blk.{bid}.ssm_a"].tensor.load()
        torch_a = (-torch.exp(mixer.A_log.detach().float())).numpy()
        assert a.dtype == np.float32 and a.shape == torch_a.shape
        assert np.max(np.abs(a.view(np.int32) - torch_a.view(np.int32))) <= 1
    for t in mapped.values():
        if t.name.endswith((".ssm_a", ".ssm_conv1d.weight")):
            continue
        np.testing.assert_array_equal(t.tensor.load(), state[t.sources[0]], err_msg=t.name)


def re_block(name: str) -> str:
    import re

    return re.sub(r"^blk\.\d+\.", "blk.{bid}.", name)


def test_conv_a_and_d_stay_f32():
    plugin = Mamba(HFConfig({"hidden_size": 8, "num_hidden_layers": 1}))
    assert plugin.keep_f32("blk.3.ssm_conv1d.weight") and plugin.keep_f32("blk.0.ssm_a") and plugin.keep_f32("blk.0.ssm_d")
    assert not plugin.keep_f32("blk.0.ssm_in.weight")


def test_tied_lm_head_is_left_out(hf_mamba):
    values = hf_mamba.config.to_dict() | {"tie_word_embeddings": True}
    state = numpy_state_dict(hf_mamba)
    names = [t.name for t in Mamba(HFConfig(values)).map_tensors(lazy_source(state))]
    assert "output.weight" not in names and "token_embd.weight" in names


def test_expansion_other_than_two_is_refused():
    config = HFConfig({"hidden_size": 16, "intermediate_size": 48, "num_hidden_layers": 1}, "x/config.json")
    with pytest.raises(ConversionError, match="expansion factor of 2"):
        Mamba(config).metadata()


@pytest.mark.parametrize("setting, message", [({"use_bias": True}, "use_bias"), ({"use_conv_bias": False}, "conv1d bias")])
def test_variants_llama_cpp_cannot_run_are_refused(setting, message):
    config = HFConfig({"hidden_size": 16, "num_hidden_layers": 1, **setting}, "x/config.json")
    with pytest.raises(ConversionError, match=message):
        Mamba(config).metadata()


MAMBA2 = {"hidden_size": 32, "num_heads": 4, "head_dim": 16, "n_groups": 2, "num_hidden_layers": 1}


@pytest.mark.parametrize("setting, message", [
    ({"num_heads": 3}, "3 Mamba heads x head dim 16 is not the inner size 64"),
    ({"n_groups": 3}, "not a multiple of the 4 heads and 3 groups"),
    ({"use_bias": True}, "projections have biases"),
    ({"use_conv_bias": False}, "conv1d bias"),
    ({"time_step_limit": [0.0, 5.0]}, r"clamps dt"),
    ({"time_step_limit": [0.001, {"__float__": "Infinity"}]}, r"clamps dt"),
    ({"time_step_limit": [1.0]}, r"time_step_limit is \[1.0\]; expected \[low, high\]"),
])
def test_mamba2_variants_llama_cpp_cannot_run_are_refused(setting, message):
    from ggufsmith.arch.mamba import Mamba2

    with pytest.raises(ConversionError, match=message):
        Mamba2(HFConfig({**MAMBA2, **setting}, "x/config.json")).metadata()


def test_mamba2_reads_transformers_infinite_time_step_limit():
    """transformers 5 saves the default limit (0, inf) as [0.0, {"__float__": "Infinity"}]: not a clamp."""
    from ggufsmith.arch.mamba import Mamba2

    config = HFConfig({**MAMBA2, "time_step_limit": [0.0, {"__float__": "Infinity"}]}, "x/config.json")
    assert Mamba2(config).metadata()["mamba2.ssm.time_step_rank"].plain() == 4


def test_mamba2_tensors_have_llama_cpp_names_and_layouts():
    """Every tensor gets the name gguf-py lists for mamba2 and docs/architectures-other.md documents,
    and the per-head and per-group layouts llama.cpp's mamba2 graph reads."""
    gguf = pytest.importorskip("gguf")
    from ggufsmith.arch.mamba import Mamba2

    torch.manual_seed(0)
    config = transformers.Mamba2Config(vocab_size=96, **MAMBA2, state_size=8, expand=2)
    model = transformers.Mamba2ForCausalLM(config).eval()
    state = numpy_state_dict(model)
    mapped = {t.name: t for t in Mamba2(HFConfig({**config.to_dict(), "architectures": ["Mamba2ForCausalLM"]}))
              .map_tensors(lazy_source(state))}
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.MAMBA2]}
    rows = documented_names("mamba2")
    for t in mapped.values():
        assert re_block(t.name.removesuffix(".weight").removesuffix(".bias")) in known, t.name
        assert documented_gguf_name(rows, t.sources[0]) == t.name
    mixer = model.backbone.layers[0].mixer
    norm = mapped["blk.0.ssm_norm.weight"].tensor.load()
    assert norm.shape == (2, 32)  # (n_groups, d_inner / n_groups): row g scales group g's channels
    np.testing.assert_array_equal(norm[1], mixer.norm.weight.detach().numpy()[32:])
    assert mapped["blk.0.ssm_a"].tensor.load().shape == mapped["blk.0.ssm_d"].tensor.load().shape == (4, 1)
