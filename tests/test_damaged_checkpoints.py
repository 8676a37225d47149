"""The damaged-input catalogue of the checkpoint side: safetensors files, shards and their indexes,
PyTorch .bin files (hostile pickles included), generation_config.json and the model card.

Each entry damages a copy of the example model in one way and runs `ggufsmith convert` on it.
Weights, indexes and generation_config.json must fail with the contract of tests/damaged_inputs.py
(exit != 0, one line naming the culprit, no traceback, nothing at the target, no temporary file).
The model card is optional prose metadata: a bad card converts, with one warning naming README.md
and the key, and that key left out of the GGUF (readers/model_card.py says why).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, copy_example, run_cli

ST = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
MARKER = "PWNED"  # what a hostile pickle's payload would create in the model folder


# -- helpers: the example's safetensors file taken apart and put back together -----------------

def read_raw(path: Path) -> tuple[dict, bytes]:
    """(header, tensor data) of a safetensors file, as stored."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_raw(path: Path, header: dict | bytes, data: bytes) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def edit_header(model: Path, edit: Callable[[dict], object]) -> object:
    """Apply `edit` to the header of the model's safetensors file; returns what `edit` returns."""
    header, data = read_raw(model / ST)
    result = edit(header)
    write_raw(model / ST, header, data)
    return result


def shard_example(model: Path, suffix: str = ".safetensors", extra_in_second: str | None = None) -> dict:
    """Split the example's weights into two shards with their index (as save_pretrained does);
    `extra_in_second` also puts that tensor of the first shard into the second. Returns the index."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(model / ST)
    (model / ST).unlink()
    names = sorted(state)
    halves = (names[: len(names) // 2], names[len(names) // 2:])
    shards = SHARDS if suffix == ".safetensors" else tuple(s.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
                                                          for s in SHARDS)
    weight_map = {}
    for shard, part in zip(shards, halves):
        tensors = {n: state[n] for n in part}
        if extra_in_second and shard == shards[1]:
            tensors[extra_in_second] = state[extra_in_second]
        if suffix == ".safetensors":
            save_file(tensors, model / shard, metadata={"format": "pt"})
        else:
            torch.save(tensors, model / shard)
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model / (INDEX if suffix == ".safetensors" else "pytorch_model.bin.index.json")).write_text(json.dumps(index))
    return index


def as_torch_bin(model: Path) -> Path:
    """The example's weights as pytorch_model.bin instead of model.safetensors."""
    import torch
    from safetensors.torch import load_file

    path = model / "pytorch_model.bin"
    torch.save(load_file(model / ST), path)
    (model / ST).unlink()
    return path


class _Payload:
    """A pickled object whose unpickling would run a shell command: creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# -- the catalogue -------------------------------------------------------------------------------
# Each entry damages the model folder and returns the text the error line must contain.

CATALOGUE: dict[str, Callable[[Path], str]] = {}


def entry(name: str):
    def register(damage: Callable[[Path], str]) -> Callable[[Path], str]:
        CATALOGUE[name] = damage
        return damage
    return register


@entry("safetensors-truncated-download")
def _(model):
    path = model / ST
    path.write_bytes(path.read_bytes()[:-1000])
    return "the file is truncated"


@entry("safetensors-shorter-than-its-length-prefix")
def _(model):
    (model / ST).write_bytes(b"\x10\x00\x00")
    return ST


@entry("safetensors-header-length-past-the-end")
def _(model):
    header, data = read_raw(model / ST)
    text = json.dumps(header).encode()
    (model / ST).write_bytes(struct.pack("<Q", 2**40) + text + data)
    return ST


@entry("safetensors-header-not-json")
def _(model):
    header, data = read_raw(model / ST)
    write_raw(model / ST, json.dumps(header).encode()[:-30] + b" " * 30, data)
    return ST


@entry("safetensors-header-is-an-array")
def _(model):
    write_raw(model / ST, b"[1, 2, 3]", b"")
    return ST


@entry("safetensors-header-nested-100000-deep")
def _(model):
    write_raw(model / ST, b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"")
    return ST


@entry("safetensors-dtype-is-an-object")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(dtype={"a": 1}), "lm_head.weight")[1])


@entry("safetensors-dtype-unknown")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(dtype="F33"), "lm_head.weight")[1])


@entry("safetensors-dimension-2-to-the-64")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(shape=[2**64, 128]), "lm_head.weight")[1])


@entry("safetensors-element-count-wraps-int64")
def _(model):
    # 2**32 * 2**32 * 2000 * 128 elements: 0 modulo 2**64, the overflow that once reached a GGUF
    return edit_header(model, lambda h: (h["lm_head.weight"].update(shape=[2**32, 2**32, 2000, 128]), "lm_head.weight")[1])


@entry("safetensors-dimension-true")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(shape=[True, 128]), "lm_head.weight")[1])


@entry("safetensors-dimension-negative")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(shape=[-2000, 128]), "lm_head.weight")[1])


@entry("safetensors-span-does-not-match-shape")
def _(model):
    return edit_header(model, lambda h: (h["lm_head.weight"].update(shape=[1000, 128]), "lm_head.weight")[1])


@entry("safetensors-offsets-end-before-begin")
def _(model):
    def edit(h):
        begin, end = h["lm_head.weight"]["data_offsets"]
        h["lm_head.weight"]["data_offsets"] = [end, begin]
    edit_header(model, edit)
    return "lm_head.weight"


@entry("safetensors-two-tensors-share-bytes")
def _(model):
    # two layer norms of the same size made to point at the same bytes: the safetensors library's refusal
    def edit(h):
        h["model.layers.1.input_layernorm.weight"]["data_offsets"] = h["model.layers.0.input_layernorm.weight"]["data_offsets"]
    edit_header(model, edit)
    return "invalid offset for tensor"


@entry("safetensors-bytes-after-the-last-tensor")
def _(model):
    header, data = read_raw(model / ST)
    write_raw(model / ST, header, data + b"\0" * 64)
    return ST


@entry("safetensors-duplicate-header-key")
def _(model):
    header, data = read_raw(model / ST)
    text = json.dumps(header)
    entry_text = json.dumps(header["lm_head.weight"])
    write_raw(model / ST, ("{" + f'"lm_head.weight": {entry_text}, ' + text[1:]).encode(), data)
    return "'lm_head.weight' appears twice"


@entry("index-weight-map-is-a-list")
def _(model):
    shard_example(model)
    (model / INDEX).write_text(json.dumps({"weight_map": [["lm_head.weight", SHARDS[0]]]}))
    return INDEX


@entry("index-entry-is-a-number")
def _(model):
    index = shard_example(model)
    index["weight_map"]["lm_head.weight"] = 3
    (model / INDEX).write_text(json.dumps(index))
    return "lm_head.weight"


@entry("index-shard-outside-the-folder")
def _(model):
    index = shard_example(model)
    index["weight_map"]["lm_head.weight"] = "../" + SHARDS[0]
    (model / INDEX).write_text(json.dumps(index))
    return "lm_head.weight"


@entry("index-names-a-missing-shard")
def _(model):
    shard_example(model)
    (model / SHARDS[1]).unlink()
    return SHARDS[1]


@entry("index-maps-a-tensor-twice")
def _(model):
    index = shard_example(model)
    text = json.dumps(index["weight_map"])
    (model / INDEX).write_text('{"weight_map": {"lm_head.weight": "%s", %s}' % (SHARDS[1], text[1:]))
    return "'lm_head.weight' appears twice"


@entry("index-puts-a-tensor-in-the-wrong-shard")
def _(model):
    index = shard_example(model)
    index["weight_map"]["lm_head.weight"] = SHARDS[1]
    (model / INDEX).write_text(json.dumps(index))
    return "lm_head.weight"


@entry("shard-holds-a-tensor-the-index-omits")
def _(model):
    index = shard_example(model)
    del index["weight_map"]["model.norm.weight"]
    (model / INDEX).write_text(json.dumps(index))
    return "model.norm.weight"


@entry("tensor-in-two-shards")
def _(model):
    shard_example(model, extra_in_second="lm_head.weight")
    return "lm_head.weight"


@entry("index-not-json")
def _(model):
    shard_example(model)
    (model / INDEX).write_text('{"weight_map": {"lm_head.weight": ')
    return INDEX


@entry("bin-hostile-pickle-in-zip")
def _(model):
    path = as_torch_bin(model)
    hostile = pickle.dumps({"lm_head.weight": _Payload(model / MARKER)}, protocol=2)
    with zipfile.ZipFile(path) as original:
        members = [(info, original.read(info)) for info in original.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as rebuilt:
        for info, data in members:
            rebuilt.writestr(info, hostile if info.filename.endswith("/data.pkl") else data)
    path.write_bytes(out.getvalue())
    return "pytorch_model.bin"


@entry("bin-hostile-legacy-pickle")
def _(model):
    path = as_torch_bin(model)
    path.write_bytes(pickle.dumps({"lm_head.weight": _Payload(model / MARKER)}))
    return "pytorch_model.bin"


@entry("bin-truncated-download")
def _(model):
    path = as_torch_bin(model)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "pytorch_model.bin"


@entry("bin-holds-a-list-not-a-state-dict")
def _(model):
    import torch

    path = as_torch_bin(model)
    torch.save([torch.zeros(2)], path)
    return "pytorch_model.bin"


@entry("bin-index-names-a-missing-shard")
def _(model):
    shard_example(model, suffix=".bin")
    (model / "pytorch_model-00002-of-00002.bin").unlink()
    return "pytorch_model-00002-of-00002.bin"


@entry("generation-config-top-k-is-text")
def _(model):
    (model / "generation_config.json").write_text(json.dumps({"top_k": "many"}))
    return "top_k"


@entry("generation-config-temperature-is-a-list")
def _(model):
    (model / "generation_config.json").write_text(json.dumps({"temperature": [0.7]}))
    return "temperature"


@entry("generation-config-top-k-beyond-int32")
def _(model):
    (model / "generation_config.json").write_text(json.dumps({"top_k": 2**40}))
    return "top_k"


@entry("generation-config-not-an-object")
def _(model):
    (model / "generation_config.json").write_text("[1, 2]")
    return "generation_config.json"


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_damaged_checkpoint_fails_cleanly(tmp_path, name):
    model = copy_example(tmp_path)
    culprit = CATALOGUE[name](model)
    target = tmp_path / "out" / "model.gguf"
    target.parent.mkdir()
    proc = run_cli("convert", model, target)
    line = assert_clean_failure(proc, culprit, target)
    if name.startswith(("safetensors", "index", "shard", "tensor", "bin")):
        assert ".safetensors" in line or ".bin" in line or ".json" in line, line  # names the file too
    assert not (model / MARKER).exists(), "a pickle payload ran"


# -- the model card: a warning, the key left out, the conversion goes on -------------------------

ALIAS_BOMB = "---\n" + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "tags: *a8\n---\n# card\n"

def absent(key: str) -> Callable[[dict], bool]:
    return lambda metadata: key not in metadata


CARDS = {
    # name: (README.md, what the warning must name, what must hold of the GGUF's metadata)
    "alias-bomb": (ALIAS_BOMB, "alias", absent("general.tags")),
    "license-is-a-list-of-numbers": ("---\nlicense: [1, 2]\n---\n", "license", absent("general.license")),
    "base-model-is-a-nested-list": ("---\nbase_model: [[org/model]]\n---\n", "base_model",
                                    absent("general.base_model.count")),
    "tags-hold-a-mapping": ("---\ntags: [chat, {a: b}]\n---\n", "tags", absent("general.tags")),
    "not-yaml": ("---\nlicense: [mit\ntags: x\n---\n", "not valid YAML", absent("general.license")),
    "nested-100000-deep": ("---\nlicense: mit\ntags: " + "[" * 100_000 + "]" * 100_000 + "\n---\n", "not valid YAML",
                           absent("general.license")),
    "larger-than-1-MiB": ("---\nlicense: mit\n" + "# padding\n" * 120_000 + "---\n", "larger than",
                          absent("general.license")),
    "a-list-not-a-mapping": ("---\n- license\n- mit\n---\n", "not a mapping", absent("general.license")),
    # the name falls back to the folder's, as without a card
    "name-is-a-mapping": ("---\nname: {first: a}\n---\n", "name", lambda m: m["general.name"].value == "Model"),
}


@pytest.mark.parametrize("name", list(CARDS))
def test_damaged_model_card_converts_with_one_warning(tmp_path, name):
    from ggufsmith.gguf_writer.reader import GGUFReader

    front_matter, culprit, holds = CARDS[name]
    model = copy_example(tmp_path)
    (model / "README.md").write_text(front_matter)
    target = tmp_path / "model.gguf"
    started = time.monotonic()
    proc = run_cli("convert", model, target, "--quiet", timeout=120)
    assert time.monotonic() - started < 60, "the model card slowed the conversion down"
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "README.md" in lines[0] and culprit in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    metadata = GGUFReader(target).metadata
    assert holds(metadata), {k: v.value for k, v in metadata.items() if k.startswith("general.")}
    assert metadata["general.architecture"].value == "llama"


def test_a_good_card_still_gives_its_keys(tmp_path):
    """The checks above must not throw away what a well-formed card says."""
    from ggufsmith.gguf_writer.reader import GGUFReader

    model = copy_example(tmp_path)
    (model / "README.md").write_text("---\nlicense: [mit, apache-2.0]\nversion: 1.0\ntags: [chat]\n"
                                     "base_model:\n- org/Base-Model-7B\n---\n")
    target = tmp_path / "model.gguf"
    proc = run_cli("convert", model, target, "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    metadata = GGUFReader(target).metadata
    assert metadata["general.license"].value == "mit,apache-2.0"
    assert metadata["general.version"].value == "1.0"
    assert list(metadata["general.tags"].value) == ["chat"]
    assert metadata["general.base_model.0.organization"].value == "Org"
