"""`ggufsmith inspect` on real files we did not write (llama.cpp's vocab files, files from gguf-py's
writer), compared with what gguf-py reads; and its one-line refusal of corrupted copies."""

from __future__ import annotations

import json
from functools import lru_cache
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ggufsmith.constants import GGMLType, GGUFValueType  # noqa: E402
from ggufsmith.gguf_writer import GGUFWriter, Metadata  # noqa: E402
from ggufsmith.gguf_writer.inspect import check_file_name  # noqa: E402
from ggufsmith.gguf_writer.metadata import make_value  # noqa: E402
from tests.ggml_oracle import ggml_parse_gguf  # noqa: E402
from tests.gguf_helpers import VOCAB_FILES, ggufpy_metadata, same_metadata  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=None)
def gguf_py_reader(path: Path):
    """gguf-py's view of a file (cached: it takes seconds on a vocabulary)."""
    return gguf.GGUFReader(path)


def inspect(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ggufsmith", "inspect", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def inspect_json(path: Path) -> dict:
    result = inspect("--json", path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def metadata_from_json(report: dict) -> dict[str, tuple]:
    def plain(entry):
        if entry["type"] == "ARRAY" and entry["element_type"] == "ARRAY":
            return [plain(e) for e in entry["value"]]
        return entry["value"]

    return {
        key: (
            int(GGUFValueType[e["type"]]),
            int(GGUFValueType[e["element_type"]]) if e["type"] == "ARRAY" else None,
            plain(e),
        )
        for key, e in report["metadata"].items()
    }


def compare_with_gguf_py(path: Path) -> dict:
    report = inspect_json(path)
    theirs = gguf_py_reader(path)
    same_metadata(metadata_from_json(report), ggufpy_metadata(theirs))
    assert report["version"] == int(theirs.fields["GGUF.version"].parts[0][0])
    assert report["n_kv"] == int(theirs.fields["GGUF.kv_count"].parts[0][0])
    assert report["n_tensors"] == len(theirs.tensors)
    assert report["alignment"] == theirs.alignment
    assert report["data_offset"] == theirs.data_offset
    assert [(t["name"], t["ne"], t["type"], t["offset"], t["nbytes"], t["n_elements"]) for t in report["tensors"]] == [
        (t.name, t.shape.tolist(), GGMLType(int(t.tensor_type)).name, int(t.data_offset), int(t.n_bytes), int(t.n_elements))
        for t in theirs.tensors
    ]
    return report


def test_vocab_files_are_real():
    assert len(VOCAB_FILES) >= 2
    for path in VOCAB_FILES:
        assert path.read_bytes()[:4] == b"GGUF", f"{path} is not a GGUF file (a Git LFS pointer?)"


@pytest.mark.parametrize("path", VOCAB_FILES, ids=lambda p: p.name)
def test_inspect_matches_gguf_py_on_llama_cpp_vocab_files(path):
    report = compare_with_gguf_py(path)
    assert report["metadata"]["tokenizer.ggml.tokens"]["length"] > 1000
    assert report["warnings"] == []
    seen = ggml_parse_gguf(path)
    assert seen is not None and seen["keys"] == list(report["metadata"])


@pytest.mark.parametrize("path", VOCAB_FILES, ids=lambda p: p.name)
def test_inspect_text_output(path):
    result = inspect(path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    theirs = gguf_py_reader(path)
    n_tokens = len(theirs.fields["tokenizer.ggml.tokens"].data)
    assert f"({n_tokens:,} values)" in out  # long arrays are summarized, not printed
    assert len(out) < 20_000
    first_token = theirs.fields["tokenizer.ggml.tokens"].contents(0)
    assert json.dumps(first_token, ensure_ascii=False) in out
    assert f"architecture" in out and theirs.fields["general.architecture"].contents() in out
    assert "does not follow the GGUF naming convention" in out


@pytest.mark.parametrize("endian", ["little", "big"])
def test_inspect_matches_gguf_py_on_files_with_tensors(tmp_path, endian):
    path = tmp_path / "Tiny-Llama-1K-v1.0-F32.gguf"
    w = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG if endian == "big" else gguf.GGUFEndian.LITTLE)
    w.add_custom_alignment(64)
    w.add_block_count(2)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    rng = np.random.default_rng(0)
    for name, shape, dtype in [("token_embd.weight", (3, 16), np.float32), ("blk.0.attn_q.weight", (16, 16), np.float16),
                               ("output_norm.weight", (16,), np.float32), ("pos", (5,), np.int32)]:
        w.add_tensor(name, rng.standard_normal(shape).astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    report = compare_with_gguf_py(path)
    assert report["byte_order"] == endian
    assert report["totals"]["parameters"] == 3 * 16 + 16 * 16 + 16 + 5
    assert report["totals"]["bytes_by_type"] == {"F32": (48 + 16) * 4, "F16": 256 * 2, "I32": 20}
    assert report["naming"] == {
        "follows_convention": True,
        "parts": {"BaseName": "Tiny-Llama", "SizeLabel": "1K", "Version": "v1.0", "Encoding": "F32"},
    }
    text = inspect(path).stdout
    assert "blk.0.attn_q.weight" in text and "16x16" in text and "F16" in text
    if endian == "little":
        seen = ggml_parse_gguf(path)
        assert [(t["name"], t["offset"] + seen["data_offset"], t["size"]) for t in seen["tensors"]] == [
            (t["name"], t["offset"], t["nbytes"]) for t in report["tensors"]
        ]
    else:
        assert any("big-endian" in w for w in report["warnings"])


def _corruptions(data: bytes) -> dict[str, bytes]:
    # The value type of the first key-value pair follows its key: magic, version, two counts, key.
    key_len = struct.unpack_from("<Q", data, 24)[0]
    type_at = 32 + key_len
    return {
        "truncated": data[: len(data) // 2],
        "truncated_header": data[:20],
        "flipped_type_byte": data[:type_at] + bytes([data[type_at] ^ 0xF0]) + data[type_at + 1 :],
        "bad_magic": b"GGUG" + data[4:],
        "huge_tensor_count": data[:8] + struct.pack("<Q", 2**63) + data[16:],
    }


@pytest.mark.parametrize("corruption", ["truncated", "truncated_header", "flipped_type_byte", "bad_magic", "huge_tensor_count"])
@pytest.mark.parametrize("path", VOCAB_FILES, ids=lambda p: p.name)
def test_inspect_rejects_corrupted_copies_in_one_line(tmp_path, path, corruption):
    bad = tmp_path / path.name
    bad.write_bytes(_corruptions(path.read_bytes())[corruption])
    for args in ([bad], ["--json", bad]):
        result = inspect(*args)
        assert result.returncode != 0
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("ggufsmith: error: ") and str(bad) in lines[0]
        assert "Traceback" not in result.stderr
    assert ggml_parse_gguf(bad) is None  # the oracle agrees the copy is broken


def test_inspect_missing_file_and_verbose_traceback(tmp_path):
    result = inspect(tmp_path / "nope.gguf")
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 40)
    verbose = inspect("--verbose", bad)
    assert verbose.returncode != 0 and "Traceback" in verbose.stderr


def test_inspect_warns_about_nested_arrays(tmp_path):
    md = Metadata()
    md.add_array("test.nested", [make_value("x", [1, 2], GGUFValueType.ARRAY, GGUFValueType.INT32)], GGUFValueType.ARRAY)
    path = tmp_path / "nested.gguf"
    with GGUFWriter(path, md):
        pass
    result = inspect(path)
    assert result.returncode == 0
    assert "llama.cpp refuses to load files with nested arrays" in result.stdout
    assert ggml_parse_gguf(path) is None  # and llama.cpp's loader does refuse it


def test_inspect_copy_of_real_file_keeps_its_name_check(tmp_path):
    named = tmp_path / "Llama-7B-v1.0-vocab.gguf"
    shutil.copy(VOCAB_FILES[0], named)
    report = inspect_json(named)
    assert report["naming"]["follows_convention"] is True
    assert report["naming"]["parts"]["Type"] == "vocab"


# The examples of the GGUF spec's "Validating Above Naming Convention", with its expected parts.
SPEC_NAMING_EXAMPLES = {
    "Mixtral-8x7B-v0.1-KQ2.gguf": {"BaseName": "Mixtral", "SizeLabel": "8x7B", "Version": "v0.1", "Encoding": "KQ2"},
    "Grok-100B-v1.0-Q4_0-00003-of-00009.gguf": {
        "BaseName": "Grok", "SizeLabel": "100B", "Version": "v1.0", "Encoding": "Q4_0", "Shard": "00003-of-00009"
    },
    "Hermes-2-Pro-Llama-3-8B-v1.0-F16.gguf": {
        "BaseName": "Hermes-2-Pro-Llama-3", "SizeLabel": "8B", "Version": "v1.0", "Encoding": "F16"
    },
    "Phi-3-mini-3.8B-ContextLength4k-instruct-v1.0.gguf": {
        "BaseName": "Phi-3-mini", "SizeLabel": "3.8B-ContextLength4k", "FineTune": "instruct", "Version": "v1.0"
    },
    "not-a-known-arrangement.gguf": None,
}


@pytest.mark.parametrize("name", list(SPEC_NAMING_EXAMPLES))
def test_naming_convention_matches_the_spec_examples(name):
    result = check_file_name(name)
    expected = SPEC_NAMING_EXAMPLES[name]
    assert result["follows_convention"] is (expected is not None)
    assert result["parts"] == (expected or {})


NAMES_FOR_NODE = list(SPEC_NAMING_EXAMPLES) + [
    "ggml-vocab-llama-spm.gguf", "Llama-7B-v1.0-vocab.gguf", "A-1B-v2-LoRA.gguf", "x-1-2-v1.gguf",
    "Model-7B-v1.0-Q4_K_M.gguf", "Model-7B-chat-v1.0.gguf", "a b-7B-v1.gguf", "Model-7B-v1.0-00001-of-00002.gguf",
    "model.gguf", "-7B-v1.gguf", "M-7b-v1.gguf",
]


def test_naming_convention_agrees_with_the_spec_javascript_regex(tmp_path):
    # Run the spec's own JavaScript regular expression when node is installed.
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    spec_regex = (
        r"/^(?<BaseName>[A-Za-z0-9\s]*(?:(?:-(?:(?:[A-Za-z\s][A-Za-z0-9\s]*)|(?:[0-9\s]*)))*))-(?:(?<SizeLabel>(?:\d+x)?"
        r"(?:\d+\.)?\d+[A-Za-z](?:-[A-Za-z]+(\d+\.)?\d+[A-Za-z]+)?)(?:-(?<FineTune>[A-Za-z0-9\s-]+))?)?-(?:(?<Version>v\d+"
        r"(?:\.\d+)*))(?:-(?<Encoding>(?!LoRA|vocab)[\w_]+))?(?:-(?<Type>LoRA|vocab))?(?:-(?<Shard>\d{5}-of-\d{5}))?\.gguf$/"
    )
    script = tmp_path / "naming.js"
    script.write_text(
        f"const re = {spec_regex};\n"
        f"const names = {json.dumps(NAMES_FOR_NODE)};\n"
        "const out = names.map(n => { const m = re.exec(n); if (!m) return null;\n"
        "  return Object.fromEntries(Object.entries(m.groups).filter(([k, v]) => v !== undefined)); });\n"
        "console.log(JSON.stringify(out));\n"
    )
    results = json.loads(subprocess.run([node, str(script)], capture_output=True, text=True, check=True).stdout)
    for name, expected in zip(NAMES_FOR_NODE, results):
        ours = check_file_name(name)
        assert ours["follows_convention"] is (expected is not None), name
        assert ours["parts"] == (expected or {}), name


def test_inspect_into_a_closed_pipe_is_not_an_error():
    # `ggufsmith inspect --json x.gguf | head -c 100`
    proc = subprocess.Popen(
        [sys.executable, "-m", "ggufsmith", "inspect", "--json", str(VOCAB_FILES[0])],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout.read(100).startswith(b"{")
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""
