"""Damaged-input catalogue of `ggufsmith convert-lora`: one entry per kind of damage or of adapter
llama.cpp cannot apply, each a one-line error naming the culprit and nothing written
(tests/damaged_inputs.py).

The adapter is written here as peft saves one (adapter_config.json and adapter_model.safetensors,
`base_model.model.<module>.lora_A.weight` (r, in) and `.lora_B.weight` (out, r); the layout
tests/test_convert_lora.py checks against peft itself), for the example model
examples/tiny-llama, so that the catalogue needs neither torch nor peft.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli

PREFIX = "base_model.model."
RANK = 4
# module -> (out, in) of examples/tiny-llama (hidden 128, 4 heads and 2 kv heads of 32, MLP 352)
MODULES = {
    "model.layers.0.self_attn.q_proj": (128, 128),
    "model.layers.0.self_attn.k_proj": (64, 128),
    "model.layers.1.mlp.down_proj": (128, 352),
}
CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "down_proj"],
          "bias": "none", "use_dora": False, "use_rslora": False, "modules_to_save": None, "rank_pattern": {},
          "alpha_pattern": {}, "fan_in_fan_out": False}


def factors(modules: dict[str, tuple[int, int]] = MODULES, rank: int = RANK) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tensors = {}
    for module, (rows, columns) in modules.items():
        tensors[f"{PREFIX}{module}.lora_A.weight"] = rng.standard_normal((rank, columns)).astype(np.float32)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = rng.standard_normal((rows, rank)).astype(np.float32)
    return tensors


def write_adapter(folder: Path, tensors: dict[str, np.ndarray], **config) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(CONFIG | config))
    save_file(tensors, folder / "adapter_model.safetensors")
    return folder


def base_with(tmp_path: Path, **config) -> Path:
    """A copy of the example model's config.json (the only file of the base convert-lora reads), changed."""
    base = tmp_path / "base"
    base.mkdir()
    values = json.loads((EXAMPLE_MODEL / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(values | config))
    return base


def test_the_undamaged_adapter_converts(tmp_path):
    from tests.llamacpp_reference import gguf_contents

    adapter = write_adapter(tmp_path / "adapter", factors(), base_model_name_or_path=str(EXAMPLE_MODEL))
    out = tmp_path / "out.gguf"
    proc = run_cli("convert-lora", adapter, out, "--model-name", "My Adapter", "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    keys, tensors = gguf_contents(out)
    assert keys["general.name"] == "My Adapter" and keys["adapter.lora.alpha"] == 8.0
    assert len(tensors) == 2 * len(MODULES)


def _without(tensors: dict, name: str) -> dict:
    return {k: v for k, v in tensors.items() if k != name}


Q_A = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight"


def _missing_config(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    (adapter / "adapter_config.json").unlink()
    return [adapter, "--base", EXAMPLE_MODEL], "adapter_config.json"


def _config_not_json(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    (adapter / "adapter_config.json").write_text("{peft_type: LORA")
    return [adapter, "--base", EXAMPLE_MODEL], "adapter_config.json"


def _no_weights(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    (adapter / "adapter_model.safetensors").unlink()
    return [adapter, "--base", EXAMPLE_MODEL], "adapter_model.safetensors"


def _truncated_weights(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    data = (adapter / "adapter_model.safetensors").read_bytes()
    (adapter / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    return [adapter, "--base", EXAMPLE_MODEL], "adapter_model.safetensors"


def _bin_not_a_checkpoint(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.bin").write_bytes(b"not a torch checkpoint")
    return [adapter, "--base", EXAMPLE_MODEL], "adapter_model.bin"


def _base_not_given(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    return [adapter], "--base"


def _base_path_gone(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), base_model_name_or_path=str(tmp_path / "gone" / "base"))
    return [adapter], "--base"


def _base_id_not_in_cache(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), base_model_name_or_path="NoSuchOrg/NoSuchBase")
    return [adapter], "NoSuchOrg/NoSuchBase"


def _base_id_download_without_a_connection(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), base_model_name_or_path="NoSuchOrg/NoSuchBase")
    return [adapter, "--download"], "cannot download"


def _base_without_config(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    (tmp_path / "base").mkdir()
    return [adapter, "--base", tmp_path / "base"], "config.json"


def _dora(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), use_dora=True)
    return [adapter, "--base", EXAMPLE_MODEL], "use_dora"


def _pissa_not_converted(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), init_lora_weights="pissa_niter_4")
    return [adapter, "--base", EXAMPLE_MODEL], "init_lora_weights"


def _modules_to_save(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), modules_to_save=["lm_head"])
    return [adapter, "--base", EXAMPLE_MODEL], "modules_to_save"


def _full_weight_in_file(tmp_path):
    tensors = factors() | {f"{PREFIX}model.norm.weight": np.ones(128, np.float32)}
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", EXAMPLE_MODEL], "model.norm.weight"


def _not_lora(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), peft_type="IA3")
    return [adapter, "--base", EXAMPLE_MODEL], "peft_type"


def _alpha_zero(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), lora_alpha=0)
    return [adapter, "--base", EXAMPLE_MODEL], "lora_alpha"


def _trained_biases(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(), bias="all")
    return [adapter, "--base", EXAMPLE_MODEL], "bias"


def _lora_b_missing(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", _without(factors(), Q_B))
    return [adapter, "--base", EXAMPLE_MODEL], Q_A


def _ranks_disagree(tmp_path):
    tensors = factors()
    tensors[Q_B] = tensors[Q_B][:, :2].copy()
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", EXAMPLE_MODEL], Q_A


def _unknown_target_module(tmp_path):
    tensors = factors(MODULES | {"model.layers.0.self_attn.foo_proj": (128, 128)})
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", EXAMPLE_MODEL], "foo_proj"


def _shape_mismatch_with_base(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    return [adapter, "--base", base_with(tmp_path, intermediate_size=256)], "intermediate_size"


def _block_past_the_base(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors(MODULES | {"model.layers.9.mlp.down_proj": (128, 352)}))
    return [adapter, "--base", EXAMPLE_MODEL], "layers.9"


def _embeddings_of_a_tied_base(tmp_path):
    rng = np.random.default_rng(1)
    tensors = factors() | {f"{PREFIX}model.embed_tokens.lora_embedding_A": rng.standard_normal((RANK, 2000)).astype(np.float32),
                           f"{PREFIX}model.embed_tokens.lora_embedding_B": rng.standard_normal((128, RANK)).astype(np.float32)}
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", base_with(tmp_path, tie_word_embeddings=True)], "tie_word_embeddings"


def _convolution_factors(tmp_path):
    tensors = factors()
    tensors[Q_A] = tensors[Q_A].reshape(RANK, 128, 1, 1)
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", EXAMPLE_MODEL], Q_A


def _layout_the_factors_cannot_follow(tmp_path):
    """GPT-2 stores its weights transposed (Conv1D, (in, out)), which the plugin turns: an adapter
    made without fan_in_fan_out has factors llama.cpp would apply across the wrong axes."""
    base = tmp_path / "gpt2"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                                  "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128,
                                                  "vocab_size": 100, "layer_norm_epsilon": 1e-5}))
    adapter = write_adapter(tmp_path / "adapter", factors({"transformer.h.0.attn.c_attn": (64, 192)}))
    return [adapter, "--base", base], "attn_qkv"


def _mixtral_base(tmp_path):
    return base_with(tmp_path, architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=2,
                     num_experts_per_tok=1)


def _expert_ranks_differ(tmp_path):
    """Mixtral's per-expert LoRAs are stacked into one lora_a / lora_b, which llama.cpp applies at one
    rank: experts of different ranks cannot share it."""
    tensors = factors({"model.layers.0.block_sparse_moe.experts.0.w1": (352, 128)}) | factors(
        {"model.layers.0.block_sparse_moe.experts.1.w1": (352, 128)}, rank=2)
    adapter = write_adapter(tmp_path / "adapter", tensors)
    return [adapter, "--base", _mixtral_base(tmp_path)], "ffn_gate_exps"


def _expert_not_adapted(tmp_path):
    """One expert of two adapted: the stack llama.cpp applies needs every expert's factors."""
    one_expert = factors({"model.layers.0.block_sparse_moe.experts.1.w1": (352, 128)})
    adapter = write_adapter(tmp_path / "adapter", one_expert)
    return [adapter, "--base", _mixtral_base(tmp_path)], "ffn_gate_exps"


EXPERTS_MODULE = "model.layers.0.mlp.experts"


def _expert_stack_factors_off_the_rank(tmp_path):
    """target_parameters: lora_A of a ParamWrapper holds experts * r rows; 6 rows do not make r = 4."""
    rng = np.random.default_rng(0)
    tensors = {f"{PREFIX}{EXPERTS_MODULE}.lora_A.weight": rng.standard_normal((6, 352)).astype(np.float32),
               f"{PREFIX}{EXPERTS_MODULE}.lora_B.weight": rng.standard_normal((128, 6)).astype(np.float32)}
    adapter = write_adapter(tmp_path / "adapter", tensors, target_modules=[], target_parameters=["experts.down_proj"])
    return [adapter, "--base", _mixtral_base(tmp_path)], f"{EXPERTS_MODULE}.lora_A.weight"


def _parameters_nested_in_an_unknown_order(tmp_path):
    """Two parameters of one module adapted, named otherwise than transformers' expert stacks: which
    nested wrapper adapts which cannot be told from the file."""
    rng = np.random.default_rng(0)
    tensors = {}
    for wrapper in (EXPERTS_MODULE, f"{EXPERTS_MODULE}.base_layer"):
        tensors[f"{PREFIX}{wrapper}.lora_A.weight"] = rng.standard_normal((8, 128)).astype(np.float32)
        tensors[f"{PREFIX}{wrapper}.lora_B.weight"] = rng.standard_normal((352, 8)).astype(np.float32)
    adapter = write_adapter(tmp_path / "adapter", tensors, target_modules=[],
                            target_parameters=["experts.w_in", "experts.w_gate"])
    return [adapter, "--base", _mixtral_base(tmp_path)], f"{EXPERTS_MODULE}.base_layer.lora_A.weight"


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "head_dim": 16,
           "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 131072,
           "rms_norm_eps": 1e-5, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
           "vocab_size": 600, "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                                  "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
                                                  "rope_type": "yarn", "truncate": False}}


def _expert_stack_stored_transposed(tmp_path):
    """gpt-oss keeps its expert stacks for x @ W ((E, in, out), transformers' is_transposed), which
    the plugin transposes: PEFT's factors of such a stack cannot follow (refused, not misapplied)."""
    base = tmp_path / "gpt-oss"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(GPT_OSS))
    rng = np.random.default_rng(0)
    tensors = {f"{PREFIX}{EXPERTS_MODULE}.lora_A.weight": rng.standard_normal((4 * RANK, 64)).astype(np.float32),
               f"{PREFIX}{EXPERTS_MODULE}.lora_B.weight": rng.standard_normal((64, RANK * 4)).astype(np.float32)}
    adapter = write_adapter(tmp_path / "adapter", tensors, target_modules=[],
                            target_parameters=["experts.gate_up_proj"])
    return [adapter, "--base", base], "ffn_gate_exps"


DAMAGE = {f.__name__[1:]: f for f in (
    _missing_config, _config_not_json, _no_weights, _truncated_weights, _bin_not_a_checkpoint,
    _base_not_given, _base_path_gone, _base_id_not_in_cache, _base_id_download_without_a_connection,
    _base_without_config,
    _dora, _pissa_not_converted, _modules_to_save, _full_weight_in_file, _not_lora, _alpha_zero, _trained_biases,
    _lora_b_missing, _ranks_disagree, _unknown_target_module, _shape_mismatch_with_base, _block_past_the_base,
    _embeddings_of_a_tied_base, _convolution_factors, _layout_the_factors_cannot_follow,
    _expert_ranks_differ, _expert_not_adapted, _expert_stack_factors_off_the_rank,
    _parameters_nested_in_an_unknown_order, _expert_stack_stored_transposed,
)}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_adapter(damage, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # repository ids: none cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args, culprit = DAMAGE[damage](tmp_path)
    out = tmp_path / "out" / "adapter.gguf"
    out.parent.mkdir()
    proc = run_cli("convert-lora", args[0], out, *args[1:])
    assert_clean_failure(proc, culprit, out)


def test_output_is_the_adapter_file(tmp_path):
    adapter = write_adapter(tmp_path / "adapter", factors())
    target = adapter / "adapter_model.safetensors"
    before = target.read_bytes()
    proc = run_cli("convert-lora", adapter, target, "--base", EXAMPLE_MODEL)
    assert_clean_failure(proc, "adapter_model.safetensors", target, previous=before)
    shutil.rmtree(adapter)


def test_out_may_follow_the_options_or_be_left_out(tmp_path):
    """Not damage: the catalogue's CLI as users type it. OUT after --base; left out, the file goes into
    the adapter's folder under the naming convention's name (checked against convert_lora_to_gguf.py's
    in tests/test_convert_lora.py)."""
    adapter = write_adapter(tmp_path / "my-adapter", factors())
    proc = run_cli("convert-lora", adapter, "--base", EXAMPLE_MODEL, tmp_path / "out.gguf", "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.gguf").is_file()
    proc = run_cli("convert-lora", adapter, "--base", EXAMPLE_MODEL, "--outtype", "f32")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {adapter / 'My-Adapter-F32-LoRA.gguf'}" in proc.stderr
    assert (adapter / "My-Adapter-F32-LoRA.gguf").read_bytes()[:4] == b"GGUF"
