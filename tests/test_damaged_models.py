"""Damaged-input catalogue, model side: checkpoints whose tensors and config.json disagree, and
config.json values of the wrong type or range. Each used to give a file llama.cpp refuses at load
time (exit 0), or an internal TypeError/ZeroDivisionError; each must now fail before anything is
written, with one line naming the tensor and the config key (contract: tests/damaged_inputs.py).

The damage is done to a copy of the example model (a 4-block llama, hidden 128, 4 heads of 32,
2 key/value heads, ff 352, vocab 2000). The last test converts the undamaged copy, so the checks
are known not to refuse a good model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, copy_example, run_cli

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402  (a test dependency, with torch)


def _edit_weights(model: Path, edit: Callable[[dict], None]) -> None:
    path = model / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_config(model: Path, edit: Callable[[dict], object]) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    result = edit(config)
    path.write_text(json.dumps(config if result is None else result))


def _drop(*names: str) -> Callable[[Path], None]:
    return lambda model: _edit_weights(model, lambda t: [t.pop(n) for n in names])


def _drop_block(bid: int) -> Callable[[Path], None]:
    return lambda model: _edit_weights(
        model, lambda t: [t.pop(n) for n in list(t) if n.startswith(f"model.layers.{bid}.")])


def _set(key: str, value) -> Callable[[Path], None]:
    return lambda model: _edit_config(model, lambda c: c.__setitem__(key, value))


def _unset(key: str) -> Callable[[Path], None]:
    def edit(config: dict) -> None:
        del config[key]
    return lambda model: _edit_config(model, edit)


def _replace_tensor(name: str, make: Callable) -> Callable[[Path], None]:
    return lambda model: _edit_weights(model, lambda t: t.__setitem__(name, make(t[name])))


def _copy_block(source: int, target: int) -> Callable[[Path], None]:
    def edit(t: dict) -> None:
        for n in list(t):
            if n.startswith(f"model.layers.{source}."):
                t[n.replace(f"layers.{source}.", f"layers.{target}.")] = t[n].clone()
    return lambda model: _edit_weights(model, edit)


def _with_large_value(weight):
    weight = weight.clone()
    weight[3, 5] = 1e5  # fine in bf16 and float32, infinity in float16
    return weight


def _write_config(text: str) -> Callable[[Path], None]:
    return lambda model: (model / "config.json").write_text(text)


# name -> (damage, what the error line must name)
CATALOGUE: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    # tensors and config.json disagree
    "one tensor missing": (_drop("model.layers.2.mlp.down_proj.weight"),
                           ["blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"]),
    "a norm missing": (_drop("model.layers.0.input_layernorm.weight"), ["blk.0.attn_norm.weight"]),
    "a whole block missing": (_drop_block(1), ["blk.1.", "num_hidden_layers"]),
    "the last block missing": (_drop_block(3), ["blk.3.", "num_hidden_layers"]),
    "the output norm missing": (_drop("model.norm.weight"), ["output_norm.weight", "model.norm.weight"]),
    "the token embeddings missing": (_drop("model.embed_tokens.weight"), ["token_embd.weight"]),
    "more blocks than num_hidden_layers": (_set("num_hidden_layers", 3), ["blk.3", "num_hidden_layers"]),
    "an extra block in the weights": (_copy_block(0, 4), ["blk.4", "num_hidden_layers"]),
    "fewer blocks than num_hidden_layers": (_set("num_hidden_layers", 6), ["blk.4.", "num_hidden_layers"]),
    "hidden_size contradicts the weights": (_set("hidden_size", 256), ["hidden_size", "tensor "]),
    "intermediate_size contradicts the weights": (_set("intermediate_size", 256), ["intermediate_size", "ffn_"]),
    "vocab_size contradicts the embeddings": (_set("vocab_size", 2048), ["vocab_size", "tensor "]),
    "num_key_value_heads contradicts the weights": (_set("num_key_value_heads", 4), ["num_key_value_heads", "attn_k.weight"]),
    "num_attention_heads contradicts head_dim": (_set("num_attention_heads", 8), ["num_attention_heads", "attn_"]),
    "head_dim contradicts the weights": (_set("head_dim", 16), ["head_dim", "attn_"]),
    "a weight of the wrong shape": (_replace_tensor("model.layers.1.mlp.up_proj.weight", lambda w: w[:300].clone()),
                                    ["blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight", "[300, 128]"]),
    "a transposed weight": (_replace_tensor("model.layers.0.mlp.down_proj.weight", lambda w: w.T.contiguous()),
                            ["blk.0.ffn_down.weight", "[352, 128]"]),
    "a norm of the wrong width": (_replace_tensor("model.norm.weight", lambda w: w[:64].clone()), ["output_norm.weight"]),
    "an lm_head of the wrong shape": (_replace_tensor("lm_head.weight", lambda w: w[:1000].clone()), ["output.weight", "lm_head.weight"]),
    "a 1-D tensor where a matrix belongs": (_replace_tensor("model.layers.0.self_attn.o_proj.weight", lambda w: w.reshape(-1).clone()),
                                            ["blk.0.attn_output.weight"]),
    # weights llama.cpp would compute infinities with
    "a weight beyond float16's range (bf16 source)": (_replace_tensor("model.layers.1.mlp.up_proj.weight", _with_large_value),
                                                      ["blk.1.ffn_up.weight", "bf16"]),
    # config.json values of the wrong type or range
    "config.json is a list": (_write_config("[1, 2, 3]"), ["config.json", "object"]),
    "config.json is not JSON": (_write_config('{"hidden_size": 128,'), ["config.json", "not valid JSON"]),
    "config.json nested 100,000 deep": (_write_config("[" * 100_000 + "]" * 100_000), ["config.json", "nested"]),
    "config.json is not UTF-8": (_write_config("{\"a\": \"\udcff\"}".encode("utf-8", "surrogateescape").decode("latin-1")),
                                 ["config.json"]),
    "num_hidden_layers is a word": (_set("num_hidden_layers", "four"), ["num_hidden_layers", "'four'"]),
    "zero attention heads": (_set("num_attention_heads", 0), ["num_attention_heads"]),
    "zero key/value heads": (_set("num_key_value_heads", 0), ["num_key_value_heads"]),
    "negative hidden_size": (_set("hidden_size", -128), ["hidden_size"]),
    "hidden_size is true": (_set("hidden_size", True), ["hidden_size"]),
    "fractional intermediate_size": (_set("intermediate_size", 352.5), ["intermediate_size"]),
    "rope_parameters is a string": (_set("rope_parameters", "fast"), ["rope_parameters"]),
    "rope_theta is a string": (_set("rope_parameters", {"rope_type": "default", "rope_theta": "big"}), ["rope_theta"]),
    "rope_type unknown": (_set("rope_parameters", {"rope_type": "warp", "rope_theta": 1e4}), ["rope_parameters", "warp"]),
    "rms_norm_eps is a string": (_set("rms_norm_eps", "small"), ["rms_norm_eps"]),
    "hidden_size missing": (_unset("hidden_size"), ["hidden_size"]),
    "architectures is a string": (_set("architectures", "LlamaForCausalLM"), ["architectures"]),
    "max_position_embeddings beyond uint32": (_set("max_position_embeddings", 2**40), ["max_position_embeddings"]),
}


@pytest.mark.parametrize("damage", list(CATALOGUE))
def test_damaged_model_fails_before_writing(tmp_path, damage):
    model = copy_example(tmp_path)
    apply, culprits = CATALOGUE[damage]
    apply(model)
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", model, target, "--outtype", "f16")
    line = assert_clean_failure(proc, culprits[0], target)
    for culprit in culprits[1:]:
        assert culprit in line, f"{culprit!r} not named in: {line}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_weight_beyond_float16_converts_to_bf16_but_not_f16(tmp_path, dtype):
    """f16 would make it infinity: refused, naming the way out; bf16 keeps it."""
    model = copy_example(tmp_path)
    _edit_weights(model, lambda t: t.update({n: w.to(getattr(torch, dtype)) for n, w in t.items()}))
    _replace_tensor("model.layers.1.mlp.up_proj.weight", _with_large_value)(model)
    proc = run_cli("convert", model, tmp_path / "f16.gguf", "--outtype", "f16")
    assert_clean_failure(proc, "blk.1.ffn_up.weight", tmp_path / "f16.gguf")
    proc = run_cli("convert", model, tmp_path / "bf16.gguf", "--outtype", "bf16")
    assert proc.returncode == 0, proc.stderr


def test_the_undamaged_copy_converts(tmp_path):
    """The catalogue's damages are what fails: the same copy, undamaged, converts."""
    model = copy_example(tmp_path)
    _edit_weights(model, lambda t: None)  # rewritten by the same code path as the damaged ones
    target = tmp_path / "out.gguf"
    proc = run_cli("convert", model, target, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    assert target.stat().st_size > 1_000_000
