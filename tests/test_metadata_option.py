"""`--metadata FILE` on `quantize` and in `batch` plans: llama.cpp's JSON overrides of general.*
keys (convert_hf_to_gguf.py --metadata), as `convert --metadata` applies them.

The reference is llama.cpp's converter run with the same file on the same model: the general.* keys
the file sets must be written with the same values and types after quantizing a GGUF made without
them, and in every output of a batch source that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ggufsmith
from ggufsmith.batch import batch, load_plan
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.llamacpp_reference import gguf_contents, reference_conversions

OVERRIDES = {
    "general.name": "Renamed Model",
    "general.author": "Someone Else",
    "general.version": "v2.0",
    "general.license.name": "custom",
    "general.tags": ["chat", "tiny"],
    "general.languages": ["en", "fr"],
    "general.base_models": [{"name": "Base Model", "organization": "Org", "version": "v1",
                             "repo_url": "https://huggingface.co/org/base-model"}],
    "general.sampling.temp": 0.25,
    "general.sampling.top_k": 17,
}


@pytest.fixture(scope="session")
def metadata_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("metadata") / "metadata.json"
    path.write_text(json.dumps(OVERRIDES))
    return path


@pytest.fixture(scope="session")
def reference(metadata_file, tmp_path_factory) -> Path:
    """convert_hf_to_gguf.py --metadata FILE's conversion of the example model."""
    out = tmp_path_factory.mktemp("metadata-reference")
    return reference_conversions(EXAMPLE_MODEL, out, ("f16",), extra=("--metadata", str(metadata_file)))["f16"]


@pytest.fixture(scope="session")
def reference_keys(reference) -> dict:
    """The general.* keys the reference writes that the file sets."""
    keys, _ = gguf_contents(reference)
    overridden = {k: v for k, v in keys.items() if k.startswith(("general.base_model.", "general.sampling."))
                  or k in OVERRIDES}
    assert overridden["general.name"] == "Renamed Model"  # the reference did apply the file
    return overridden


@pytest.fixture(scope="session")
def plain_f16(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("metadata-input") / "tiny-f16.gguf"
    ggufsmith.convert(EXAMPLE_MODEL, path, "f16")
    return path


def _general_types(path: Path) -> dict:
    import gguf

    return {name: [int(t) for t in field.types] for name, field in gguf.GGUFReader(path).fields.items()
            if name.startswith("general.")}


def test_quantize_applies_the_metadata_file_as_llamacpp_converter(plain_f16, metadata_file, reference,
                                                                  reference_keys, tmp_path):
    out = tmp_path / "q8.gguf"
    proc = run_cli("quantize", plain_f16, out, "Q8_0", "--metadata", metadata_file)
    assert proc.returncode == 0, proc.stderr
    keys, _ = gguf_contents(out)
    assert {k: keys.get(k) for k in reference_keys} == reference_keys
    assert keys["general.file_type"] == 7  # still the quantized file
    ours_types, reference_types = _general_types(out), _general_types(reference)
    assert {k: ours_types[k] for k in reference_keys} == {k: reference_types[k] for k in reference_keys}


def test_quantize_without_the_option_keeps_the_inputs_keys(plain_f16, tmp_path):
    out = tmp_path / "q8.gguf"
    assert run_cli("quantize", plain_f16, out, "Q8_0").returncode == 0
    keys, _ = gguf_contents(out)
    assert keys["general.name"] == gguf_contents(plain_f16)[0]["general.name"] != "Renamed Model"


def test_quantize_refuses_an_unknown_key_in_one_line(plain_f16, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"general.nmae": "typo"}))
    out = tmp_path / "q8.gguf"
    assert_clean_failure(run_cli("quantize", plain_f16, out, "Q8_0", "--metadata", bad), "general.nmae", out)


def _plan(folder: Path, metadata: Path | None, outtypes=("f16", "q8_0")) -> Path:
    source = {"path": str(EXAMPLE_MODEL), "outtypes": list(outtypes)}
    if metadata is not None:
        source["metadata"] = str(metadata)
    plan = folder / "plan.json.yaml"
    plan.write_text(json.dumps({"output_dir": "out", "sources": [source]}))  # JSON is YAML
    return plan


def test_batch_source_metadata_reaches_every_output(metadata_file, reference_keys, tmp_path):
    report = batch(load_plan(_plan(tmp_path, metadata_file)))
    assert [r.status for r in report.results] == ["done", "done"], report.results
    for result in report.results:
        keys, _ = gguf_contents(Path(result.file))
        assert {k: keys.get(k) for k in reference_keys} == reference_keys, result.outtype
        assert Path(result.file).name.startswith("Renamed-Model-")  # named from the overridden general.name
    # the f16 output is the file `convert --metadata` makes
    single = tmp_path / "single.gguf"
    ggufsmith.convert(EXAMPLE_MODEL, single, "f16", metadata=metadata_file)
    f16 = next(r for r in report.results if r.outtype == "f16")
    assert Path(f16.file).read_bytes() == single.read_bytes()


def test_batch_redoes_outputs_when_the_metadata_file_changes(metadata_file, tmp_path):
    edited = tmp_path / "metadata.json"
    edited.write_text(metadata_file.read_text())
    plan = _plan(tmp_path, edited, outtypes=("f16",))
    first = batch(load_plan(plan)).results[0]
    assert batch(load_plan(plan)).results[0].status == "skipped"
    edited.write_text(json.dumps(OVERRIDES | {"general.author": "Another Author"}))
    again = batch(load_plan(plan)).results[0]
    assert again.status == "done" and again.file == first.file
    assert gguf_contents(Path(again.file))[0]["general.author"] == "Another Author"


def test_batch_refuses_a_bad_metadata_file_before_running(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"general.tags": "not a list"}))
    proc = run_cli("batch", _plan(tmp_path, bad))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "sources[0]: metadata" in lines[0] and "general.tags" in lines[0]
    assert not (tmp_path / "out").exists()
