"""Damaged-input catalogue of convert's publisher options (--metadata, --vocab-only, repo ids) and
of `ggufsmith set-metadata`: one entry per kind of damage, each a one-line error naming the culprit
and nothing written (tests/damaged_inputs.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ggufsmith
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli

# -- convert --metadata FILE: each entry is the file's text and the culprit the error names ---------

METADATA_DAMAGE = {
    "not_json": ("{general.name: 1", "meta.json"),
    "a_list_not_an_object": ('["general.name"]', "meta.json"),
    "unknown_key": ('{"general.nmae": "x"}', "general.nmae"),
    "name_is_a_number": ('{"general.name": 7}', "general.name"),
    "tags_not_a_list": ('{"general.tags": "chat"}', "general.tags"),
    "tags_not_strings": ('{"general.tags": ["chat", 1]}', "general.tags"),
    "base_model_entry_not_an_object": ('{"general.base_models": ["Org/Base"]}', "general.base_models"),
    "base_model_entry_unknown_field": ('{"general.base_models": [{"nmae": "x"}]}', "general.base_models"),
    "top_k_is_text": ('{"general.sampling.top_k": "40"}', "general.sampling.top_k"),
    "temp_too_large_for_float32": ('{"general.sampling.temp": 1e300}', "general.sampling.temp"),
}


@pytest.mark.parametrize("damage", list(METADATA_DAMAGE))
def test_damaged_metadata_file(damage, tmp_path):
    text, culprit = METADATA_DAMAGE[damage]
    (tmp_path / "meta.json").write_text(text)
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, out, "--metadata", tmp_path / "meta.json")
    assert_clean_failure(proc, culprit, out)


def test_missing_metadata_file(tmp_path):
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, out, "--metadata", tmp_path / "missing.json")
    assert_clean_failure(proc, "missing.json", out)


def test_vocab_only_with_a_quantization_preset(tmp_path):
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, out, "--vocab-only", "--outtype", "q4_k_m")
    assert_clean_failure(proc, "--vocab-only", out)


def test_repo_id_not_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # whatever happens, no network
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", "NoSuchOrg/NoSuchModel", out)
    line = assert_clean_failure(proc, "NoSuchOrg/NoSuchModel", out)
    assert "--download" in line and str(tmp_path / "empty-cache") in line


# -- set-metadata: each entry is the arguments and the culprit --------------------------------------

EDIT_DAMAGE = {
    "alignment": (["general.alignment=64"], "general.alignment"),
    "architecture": (["general.architecture=qwen2"], "general.architecture"),
    "split_key": (["split.count:uint16=2"], "split.count"),
    "vocabulary": (['tokenizer.ggml.tokens=["a"]'], "tokenizer.ggml.tokens"),
    "remove_the_vocabulary": (["--remove", "tokenizer.ggml.scores"], "tokenizer.ggml.scores"),
    "value_not_of_the_keys_type": (["llama.context_length=long"], "llama.context_length"),
    "value_out_of_the_keys_range": (["llama.context_length=-5"], "llama.context_length"),
    "array_not_json": (["general.langs:string[]=en,fr"], "general.langs"),
    "array_of_the_wrong_type": (["my.ids:int32[]=[1, \"2\"]"], "my.ids"),
    "unknown_type": (["my.key:double=1"], "double"),
    "not_a_key": (["General Name=x"], "General Name"),
    "no_equals_sign": (["general.name"], "general.name"),
    "remove_a_missing_key": (["--remove", "general.nothing"], "general.nothing"),
    "nothing_to_change": ([], "nothing to change"),
}


@pytest.fixture(scope="module")
def example_gguf(tmp_path_factory) -> Path:
    return ggufsmith.convert(EXAMPLE_MODEL, tmp_path_factory.mktemp("damaged-edit") / "example.gguf", "f16").output


@pytest.mark.parametrize("damage", list(EDIT_DAMAGE))
def test_damaged_set_metadata(damage, example_gguf, tmp_path):
    args, culprit = EDIT_DAMAGE[damage]
    target = tmp_path / "model.gguf"
    shutil.copyfile(example_gguf, target)
    previous = target.read_bytes()
    proc = run_cli("set-metadata", target, *args)
    assert_clean_failure(proc, culprit, target, previous=previous)


def test_set_metadata_on_a_file_that_is_not_gguf(tmp_path):
    target = tmp_path / "model.gguf"
    target.write_bytes(json.dumps({"not": "gguf"}).encode())
    proc = run_cli("set-metadata", target, "general.name=x")
    assert_clean_failure(proc, str(target), target, previous=target.read_bytes())


def test_download_without_a_connection(tmp_path, monkeypatch):
    # --download reaches for the Hub (here forbidden by HF_HUB_OFFLINE): a different error from the
    # cache miss above, naming the id
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", "NoSuchOrg/NoSuchModel", out, "--download")
    line = assert_clean_failure(proc, "NoSuchOrg/NoSuchModel", out)
    assert "cannot download" in line
