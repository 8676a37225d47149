"""convert's output and metadata options: --outtype auto, a folder as output, --vocab-only,
--metadata FILE. Each is checked against an independent implementation: gguf-py reads the files and
names them (its naming_convention), llama.cpp loads them (llama-cpp-python), and llama.cpp's own
converter (convert_hf_to_gguf.py) makes the same file with the same options.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from tests.damaged_inputs import EXAMPLE_MODEL, run_cli
from tests.llamacpp_reference import run_reference_converter
from tests.test_llama_convert import assert_same_file

TEXT = "The llama reads the weights. Das Lama liest große Dateien. 12345 🦙"


def _fields(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _tensor_types(path: Path) -> set[str]:
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) >= 2}


def _with_dtype(tmp_path_factory, torch_dtype_name: str) -> Path:
    """The example model (stored as bf16) with its weights re-stored as another type."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp(f"tiny-llama-{torch_dtype_name}") / "tiny-llama"
    shutil.copytree(EXAMPLE_MODEL, folder)
    dtype = getattr(torch, torch_dtype_name)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v.to(dtype) for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory) -> Path:
    return _with_dtype(tmp_path_factory, "float16")


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory) -> Path:
    return _with_dtype(tmp_path_factory, "float32")


# -- --outtype auto ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model, expected", [("example", "BF16"), ("f16_model", "F16"), ("f32_model", "F16")])
def test_outtype_auto_is_the_16_bit_type_the_checkpoint_is_stored_in(model, expected, request, tmp_path):
    # bf16 weights stay bf16, f16 stay f16; float32 weights (no 16-bit type to follow) give f16.
    src = EXAMPLE_MODEL if model == "example" else request.getfixturevalue(model)
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", src, out, "--outtype", "auto", "-q")
    assert proc.returncode == 0, proc.stderr
    assert _tensor_types(out) == {expected}
    assert _fields(out)["general.file_type"] == {"BF16": 32, "F16": 1}[expected]


# -- an output folder: the file named by the GGUF naming convention --------------------------------

def test_a_folder_as_output_names_the_file_as_gguf_py_names_it(tmp_path):
    import gguf

    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path, "--outtype", "q8_0", "-q")
    assert proc.returncode == 0, proc.stderr
    (written,) = tmp_path.iterdir()
    fields = _fields(written)
    expected = gguf.naming_convention(fields.get("general.name"), fields.get("general.basename"),
                                      fields.get("general.finetune"), fields.get("general.version"),
                                      fields.get("general.size_label"), "Q8_0")
    assert written.name == f"{expected}.gguf"
    assert written.name == "Tiny-Llama-1.3M-Q8_0.gguf"


def test_python_api_returns_the_path_it_chose(tmp_path):
    plan = ggufsmith.convert(EXAMPLE_MODEL, tmp_path, "auto", model_name="My Model")
    assert plan.output == tmp_path / "My-Model-1.3M-BF16.gguf"
    assert plan.output.is_file()


@pytest.mark.slow
def test_auto_into_a_folder_gives_llamacpps_file_and_name(f16_model, tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    assert ggufsmith.convert(f16_model, ours, "auto").output is not None
    run_reference_converter(f16_model, theirs, "auto")
    (our_file,), (their_file,) = list(ours.iterdir()), list(theirs.iterdir())
    assert our_file.name == their_file.name == "Tiny-Llama-1.3M-F16.gguf"
    assert_same_file(our_file, their_file)


# -- --vocab-only -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_and_vocab(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("vocab")
    full = ggufsmith.convert(EXAMPLE_MODEL, folder / "full.gguf", "f16").output
    proc = run_cli("convert", EXAMPLE_MODEL, folder, "--vocab-only", "-q")
    assert proc.returncode == 0, proc.stderr
    return full, folder / "Tiny-Llama-vocab.gguf"


def test_vocab_only_holds_every_key_and_no_tensor(full_and_vocab):
    import gguf

    full, vocab = full_and_vocab
    assert len(gguf.GGUFReader(vocab).tensors) == 0
    full_fields, vocab_fields = _fields(full), _fields(vocab)
    # no tensors, so no parameter count to label the size with, as in llama.cpp's vocab file
    assert full_fields.keys() - vocab_fields.keys() == {"general.size_label"}
    assert all(vocab_fields[k] == v for k, v in full_fields.items() if k != "general.size_label")
    assert vocab.stat().st_size < full.stat().st_size / 20


def test_vocab_only_file_tokenizes_in_llamacpp_like_the_full_file(full_and_vocab):
    import llama_cpp

    tokens = []
    for path in full_and_vocab:
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        try:
            tokens.append(llm.tokenize(TEXT.encode("utf-8"), add_bos=True))
        finally:
            llm.close()
    assert tokens[0] == tokens[1]
    assert len(tokens[0]) > 10


@pytest.mark.slow
def test_vocab_only_is_llamacpps_vocab_file(full_and_vocab, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    run_reference_converter(EXAMPLE_MODEL, theirs, "f16", "--vocab-only")
    (their_file,) = list(theirs.iterdir())
    assert their_file.name == full_and_vocab[1].name
    assert_same_file(full_and_vocab[1], their_file)


# -- --metadata FILE --------------------------------------------------------------------------------

OVERRIDES = {
    "general.name": "Override Name", "general.author": "Someone", "general.quantized_by": "Me",
    "general.version": "v2", "general.url": "https://example.org/model", "general.tags": ["a", "b"],
    "general.base_models": [{"name": "Base", "organization": "Org", "repo_url": "https://huggingface.co/Org/Base"}],
    "general.sampling.temp": 0.5, "general.sampling.top_k": 7,
}


@pytest.fixture
def overrides_file(tmp_path) -> Path:
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(OVERRIDES))
    return path


def test_metadata_file_replaces_the_general_keys(overrides_file, tmp_path):
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, out, "--metadata", overrides_file, "-q")
    assert proc.returncode == 0, proc.stderr
    fields = _fields(out)
    for key in ("general.name", "general.author", "general.quantized_by", "general.version", "general.url",
                "general.tags", "general.sampling.top_k"):
        assert fields[key] == OVERRIDES[key], key
    assert np.float32(fields["general.sampling.temp"]) == np.float32(0.5)
    assert fields["general.base_model.count"] == 1
    assert fields["general.base_model.0.repo_url"] == "https://huggingface.co/Org/Base"
    assert fields["general.size_label"] == "1.3M"  # a key not overridden is still found as before


def test_model_name_wins_over_the_metadata_file(overrides_file, tmp_path):
    plan = ggufsmith.convert(EXAMPLE_MODEL, tmp_path / "out.gguf", metadata=overrides_file, model_name="CLI Name")
    assert _fields(plan.output)["general.name"] == "CLI Name"
    assert _fields(plan.output)["general.author"] == "Someone"


@pytest.mark.slow
def test_metadata_file_gives_llamacpps_file(overrides_file, tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    ggufsmith.convert(EXAMPLE_MODEL, ours, "bf16", metadata=overrides_file)
    run_reference_converter(EXAMPLE_MODEL, theirs, "bf16", "--metadata", str(overrides_file))
    (our_file,), (their_file,) = list(ours.iterdir()), list(theirs.iterdir())
    assert our_file.name == their_file.name
    assert_same_file(our_file, their_file)


# -- set-metadata -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def example_gguf(tmp_path_factory) -> Path:
    return ggufsmith.convert(EXAMPLE_MODEL, tmp_path_factory.mktemp("edit") / "example.gguf", "q8_0").output


def _llamacpp_metadata_and_logits(path: Path) -> tuple[dict, np.ndarray]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    try:
        llm.eval(llm.tokenize(TEXT.encode("utf-8"), add_bos=True))
        return dict(llm.metadata), np.array(llm.scores[: llm.n_tokens])
    finally:
        llm.close()


def test_set_metadata_changes_what_llamacpp_reads_and_nothing_else(example_gguf, tmp_path):
    import gguf

    edited = tmp_path / "edited.gguf"
    shutil.copyfile(example_gguf, edited)
    proc = run_cli("set-metadata", edited, "general.name=Renamed Model", "llama.context_length=96",
                   'general.tags:string[]=["chat", "tiny"]', "my.ratio:float32=0.25", "my.flags:bool[]=[true, false]",
                   "--remove", "general.size_label", "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    before, after = _fields(example_gguf), _fields(edited)
    assert after["general.name"] == "Renamed Model"
    assert after["llama.context_length"] == 96
    assert after["general.tags"] == ["chat", "tiny"]
    assert after["my.flags"] == [True, False]
    assert "general.size_label" not in after
    untouched = before.keys() - {"general.name", "llama.context_length", "general.size_label"}
    assert all(after[k] == before[k] for k in untouched)
    # types kept: llama.cpp reads context_length only as an unsigned 32-bit integer
    reader = gguf.GGUFReader(edited)
    assert reader.fields["llama.context_length"].types == [gguf.GGUFValueType.UINT32]
    assert reader.fields["my.ratio"].types == [gguf.GGUFValueType.FLOAT32]
    theirs_before = {t.name: bytes(t.data) for t in gguf.GGUFReader(example_gguf).tensors}
    assert {t.name: bytes(t.data) for t in reader.tensors} == theirs_before

    metadata_before, logits_before = _llamacpp_metadata_and_logits(example_gguf)
    metadata_after, logits_after = _llamacpp_metadata_and_logits(edited)
    assert metadata_after["general.name"] == "Renamed Model"
    assert metadata_after["llama.context_length"] == "96"
    assert np.array_equal(logits_before, logits_after)


def test_set_metadata_to_another_file_leaves_the_input(example_gguf, tmp_path):
    before = example_gguf.read_bytes()
    out = ggufsmith.set_metadata(example_gguf, ["general.description=Edited"], output=tmp_path / "copy.gguf")
    assert example_gguf.read_bytes() == before
    assert _fields(out)["general.description"] == "Edited"
    # an existing array key takes a JSON list of its element type
    ggufsmith.set_metadata(out, ["general.tags:string[]=[\"a\"]"])
    ggufsmith.set_metadata(out, ['general.tags=["b", "c"]'])
    assert _fields(out)["general.tags"] == ["b", "c"]


# -- sources by repository id: the local Hugging Face cache -----------------------------------------

REPO_ID = "TinyOrg/Tiny-Llama-v1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """A Hugging Face cache holding the example model as REPO_ID, laid out as huggingface_hub lays
    out a download (blobs, snapshots/<commit> of links to them, refs/main), and checked by
    huggingface_hub's own cache scanner."""
    import hashlib

    from huggingface_hub import scan_cache_dir
    from huggingface_hub.file_download import repo_folder_name

    cache = tmp_path / "hub"
    repo = cache / repo_folder_name(repo_id=REPO_ID, repo_type="model")
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in EXAMPLE_MODEL.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the test must never reach the network
    (cached,) = scan_cache_dir(cache).repos
    assert cached.repo_id == REPO_ID and {f.file_name for r in cached.revisions for f in r.files} == \
        {p.name for p in EXAMPLE_MODEL.iterdir()}
    return cache


def test_a_repo_id_converts_the_model_in_the_hf_cache(hf_cache, tmp_path):
    import gguf

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli("convert", REPO_ID, out_dir, "-q")  # run from the repository root: no such folder there
    assert proc.returncode == 0, proc.stderr
    (written,) = out_dir.iterdir()
    # named after the repository, not after the snapshot folder (a commit hash)
    assert written.name == "Tiny-Llama-1.3M-v1-F16.gguf"
    fields = _fields(written)
    assert fields["general.organization"] == "TinyOrg"
    assert COMMIT not in json.dumps({k: v for k, v in fields.items() if k.startswith("general.")}, default=str)
    from_folder = ggufsmith.convert(EXAMPLE_MODEL, tmp_path / "from-folder.gguf").output
    tensors = {t.name: bytes(t.data) for t in gguf.GGUFReader(written).tensors}
    assert tensors == {t.name: bytes(t.data) for t in gguf.GGUFReader(from_folder).tensors}


def test_a_snapshot_folder_given_by_path_is_named_after_its_repository(hf_cache, tmp_path):
    """The path of a cache snapshot (what a batch plan's repo id, or a user copying a path out of
    ~/.cache/huggingface, gives) names the file as the repo id does, not by the commit hash."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    snapshot = hf_cache / f"models--TinyOrg--Tiny-Llama-v1/snapshots/{COMMIT}"
    proc = run_cli("convert", snapshot, out_dir, "-q")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in out_dir.iterdir()] == ["Tiny-Llama-1.3M-v1-F16.gguf"]
    assert _fields(out_dir / "Tiny-Llama-1.3M-v1-F16.gguf")["general.organization"] == "TinyOrg"


def test_an_existing_folder_wins_over_a_repo_id_of_the_same_spelling(hf_cache, tmp_path):
    from ggufsmith.readers.hub import resolve_source

    assert resolve_source("examples/tiny-llama") == (Path("examples/tiny-llama"), None)
    assert resolve_source(REPO_ID) == (hf_cache / f"models--TinyOrg--Tiny-Llama-v1/snapshots/{COMMIT}", REPO_ID)


def test_type_template_in_the_output_name_is_filled_with_the_type_auto_chose(tmp_path):
    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "tiny-{ftype}-{OUTTYPE}.gguf", "--outtype", "auto", "-q")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-bf16-BF16.gguf"]
