"""Checkpoint readers against the libraries that wrote the files (safetensors, torch, transformers).

Every tensor read by ggufsmith must equal, element for element, what safetensors / torch load
from the same file; damaged files must give one clear error naming the file.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ggufsmith.readers.checkpoint import open_checkpoint
from ggufsmith.readers.safetensors import SafetensorsFile
from ggufsmith.errors import ConversionError

REPO = Path(__file__).resolve().parent.parent


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    # bf16 has no numpy type; the exact widening to float32 is torch's own.
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


@pytest.fixture(scope="module")
def tiny_llama_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config)


def save_torch_bin(model, model_dir: Path, sharded: bool) -> None:
    """The layout of transformers' older .bin checkpoints (transformers 5 writes only safetensors):
    pytorch_model.bin, or pytorch_model-0000i-of-0000n.bin shards with pytorch_model.bin.index.json."""
    model.config.save_pretrained(model_dir)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if not sharded:
        torch.save(state, model_dir / "pytorch_model.bin")
        return
    names = list(state)
    groups = [names[i::3] for i in range(3)]
    weight_map = {}
    for i, group in enumerate(groups, 1):
        shard = f"pytorch_model-{i:05d}-of-{len(groups):05d}.bin"
        torch.save({n: state[n] for n in group}, model_dir / shard)
        weight_map.update(dict.fromkeys(group, shard))
    (model_dir / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _assert_same_tensors(model_dir: Path, state_dict: dict[str, torch.Tensor]) -> None:
    with open_checkpoint(model_dir) as ckpt:
        assert set(ckpt.tensors) == set(state_dict)
        for name, expected in state_dict.items():
            got = ckpt.tensors[name]
            assert got.shape == tuple(expected.shape), name
            data = got.load()
            np.testing.assert_array_equal(data, _as_numpy(expected), err_msg=name)
            assert data.dtype == (np.float32 if expected.dtype == torch.bfloat16 else _as_numpy(expected).dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_save_pretrained_folders_read_exactly(tmp_path, tiny_llama_model, dtype, sharded, safe):
    model = tiny_llama_model.to(dtype)
    if safe:
        model.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "5GB")
    else:
        save_torch_bin(model, tmp_path, sharded)
    weight_files = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".safetensors", ".bin"))
    assert (len(weight_files) > 1) == sharded, weight_files
    state = model.state_dict()
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.config.architectures == ["LlamaForCausalLM"]
        assert all(f.suffix == (".safetensors" if safe else ".bin") for f in ckpt.files)
    _assert_same_tensors(tmp_path, state)


def test_safetensors_package_files_of_every_dtype(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {
        "f64": rng.standard_normal((3, 4)),
        "f32": rng.standard_normal((5, 7)).astype(np.float32),
        "f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, size=(6,)),
        "i32": rng.integers(-(2**20), 2**20, size=(2, 2)).astype(np.int32),
        "i16": rng.integers(-300, 300, size=(4,)).astype(np.int16),
        "i8": rng.integers(-100, 100, size=(4,)).astype(np.int8),
        "u8": rng.integers(0, 255, size=(4,)).astype(np.uint8),
        "bool": rng.random(5) > 0.5,
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 8), dtype=np.float32),
    }
    save_file(arrays, tmp_path / "model.safetensors")
    f = SafetensorsFile(tmp_path / "model.safetensors")
    try:
        for name, expected in arrays.items():
            got = f.tensors[name].load()
            assert got.shape == expected.shape and got.dtype == expected.dtype, name
            np.testing.assert_array_equal(got, expected)
    finally:
        f.close()


def test_bf16_rows_and_nonfinite_values(tmp_path):
    from safetensors.torch import save_file

    t = torch.randn(37, 16).to(torch.bfloat16)
    t[3, 2], t[4, 5], t[5, 6] = float("inf"), float("-inf"), float("nan")
    save_file({"w": t}, tmp_path / "x.safetensors")
    f = SafetensorsFile(tmp_path / "x.safetensors")
    try:
        lazy = f.tensors["w"]
        assert lazy.dtype == "BF16" and lazy.n_rows == 37
        np.testing.assert_array_equal(lazy.load(), t.float().numpy())
        np.testing.assert_array_equal(lazy.load_rows(10, 30), t[10:30].float().numpy())
    finally:
        f.close()


def _write_raw(path: Path, header: bytes, payload: bytes = b"", header_len: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if header_len is None else header_len) + header + payload)
    return path


@pytest.mark.parametrize(
    "header, payload, header_len, message",
    [
        (b"", b"", None, "too short"),  # replaced below by a 3-byte file
        (b"{}", b"", 10**6, "does not fit the file"),
        (b"{not json", b"", None, "not valid JSON"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        (json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode(), b"\0" * 8, None, "outside the file"),
        (json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode(), b"\0" * 16, None, "needs 16"),
        (json.dumps({"w": {"dtype": "U16", "shape": [4], "data_offsets": [0, 8]}}).encode(), b"\0" * 8, None, "U16"),
        (json.dumps({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode(), b"\0" * 4, None,
         "F8_E4M3 without a scale"),
        (json.dumps({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}).encode(), b"\0" * 4, None, "non-negative integers"),
        (json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}).encode(), b"\0" * 8, None, "end before they begin"),
    ],
    ids=["truncated", "huge-length", "bad-json", "not-object", "past-end", "span-mismatch", "unknown-dtype",
         "fp8-without-scale", "negative-dim", "reversed-offsets"],
)
def test_damaged_safetensors_give_one_clear_error(tmp_path, header, payload, header_len, message):
    path = tmp_path / "model.safetensors"
    if message == "too short":
        path.write_bytes(b"\x01\x02\x03")
    else:
        _write_raw(path, header, payload, header_len)
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(ConversionError) as info:
        open_checkpoint(tmp_path)
    text = str(info.value)
    assert str(path) in text and message in text and "\n" not in text


def test_missing_and_incomplete_shards_are_named(tmp_path, tiny_llama_model):
    tiny_llama_model.to(torch.float32).save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(ConversionError, match=shards[-1].name):
        open_checkpoint(tmp_path)


def test_no_weights_and_no_config(tmp_path):
    with pytest.raises(ConversionError, match="config.json"):
        open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConversionError, match="no weights found"):
        open_checkpoint(tmp_path)


def test_bin_without_torch_asks_for_the_extra(tmp_path, tiny_llama_model):
    save_torch_bin(tiny_llama_model.to(torch.float32), tmp_path, sharded=False)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from ggufsmith.readers.checkpoint import open_checkpoint\n"
        "from ggufsmith.errors import ConversionError\n"
        f"try: open_checkpoint({str(tmp_path)!r})\n"
        "except ConversionError as e: print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "pytorch_model.bin" in out and "pip install ggufsmith[torch]" in out


def test_legacy_non_zip_bin_is_read_without_mmap(tmp_path):
    state = {"a": torch.randn(4, 8).to(torch.bfloat16), "b": torch.arange(5)}
    (tmp_path / "config.json").write_text("{}")
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    _assert_same_tensors(tmp_path, state)


def test_bin_pickle_that_runs_code_is_refused(tmp_path, capsys):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "config.json").write_text("{}")
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": Evil()}, f)
    with pytest.raises(ConversionError, match="pytorch_model.bin.*never runs code"):
        open_checkpoint(tmp_path)
    assert "pwned" not in capsys.readouterr().out
