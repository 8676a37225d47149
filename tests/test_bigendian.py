"""`convert --bigendian`: a big-endian GGUF v3 file, compared with what llama.cpp's converter writes
with --bigendian (convert_hf_to_gguf.py from the llama-cpp-python sdist) and read back by gguf-py's
reader (which detects the byte order) and by ggufsmith's own reader and inspect.

llama.cpp's converter swaps the F32 and F16 tensors and leaves BF16 and quantized blocks as they
are; a big-endian ggml reads all of them in its own byte order. ggufsmith swaps BF16 too and
refuses quantized types (converters/plan.py says why): the BF16 check below is the reference's
bytes swapped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.gguf_writer.reader import GGUFReader
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file, gguf_contents, reference_conversions

OUTTYPES = ("f32", "f16", "bf16")


@pytest.fixture(scope="session")
def references(tmp_path_factory) -> dict[str, Path]:
    """outtype -> convert_hf_to_gguf.py --bigendian's file of the example model."""
    out = tmp_path_factory.mktemp("bigendian-reference")
    return reference_conversions(EXAMPLE_MODEL, out, OUTTYPES, extra=("--bigendian",))


@pytest.fixture(scope="session")
def ours(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(outtype, "big" or "little") -> ggufsmith's file of the example model."""
    out = tmp_path_factory.mktemp("bigendian-ours")
    made = {}
    for outtype in OUTTYPES:
        for order in ("big", "little"):
            made[outtype, order] = out / f"{outtype}-{order}.gguf"
            ggufsmith.convert(EXAMPLE_MODEL, made[outtype, order], outtype, bigendian=order == "big")
    return made


def test_header_is_gguf_v3_big_endian(ours):
    head = ours["f16", "big"].read_bytes()[:24]
    assert head[:4] == b"GGUF" and head[4:8] == (3).to_bytes(4, "big")
    little = ours["f16", "little"].read_bytes()[:24]
    assert head[8:16] == little[8:16][::-1] and head[16:24] == little[16:24][::-1]  # tensor and key counts


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_same_file_as_convert_hf_to_gguf_bigendian(ours, references, outtype):
    """Every key and value, every tensor's stored bytes, as the reference writes them."""
    assert_same_file(ours[outtype, "big"], references[outtype], TOKENIZER_KEY_DIFFERENCES)


def test_bf16_tensors_are_swapped_where_the_reference_leaves_them(ours, references):
    _, our_tensors = gguf_contents(ours["bf16", "big"])
    _, their_tensors = gguf_contents(references["bf16"])
    assert list(our_tensors) == list(their_tensors)
    bf16 = 30  # GGMLQuantizationType.BF16
    for name, (shape, ttype, data) in their_tensors.items():
        if ttype == bf16:
            data = np.frombuffer(data, "<u2").astype(">u2").tobytes()
        assert our_tensors[name] == (shape, ttype, data), name
    assert any(ttype == bf16 for _, ttype, _ in their_tensors.values())


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_readers_give_the_little_endian_files_values(ours, outtype):
    big, little = GGUFReader(ours[outtype, "big"]), GGUFReader(ours[outtype, "little"])
    assert big.byteorder == "big" and little.byteorder == "little"
    assert {k: _plain(v.value) for k, v in big.metadata.items()} == {k: _plain(v.value) for k, v in little.metadata.items()}
    for t in little.tensors:
        np.testing.assert_array_equal(big.tensor(t.name).to_float32(), t.to_float32(), err_msg=t.name)
    import gguf  # gguf-py detects the byte order too

    theirs = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(ours[outtype, "big"]).tensors}
    for t in gguf.GGUFReader(ours[outtype, "little"]).tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.BF16:  # gguf-py hands BF16 out as bytes
            np.testing.assert_array_equal(theirs[t.name], np.asarray(t.data), err_msg=t.name)


def _plain(value):
    """A metadata value as Python values (arrays as lists), for comparing."""
    if isinstance(value, (str, bytes, int, float)):
        return value
    return np.asarray(value).tolist() if hasattr(value, "dtype") else [_plain(v) for v in value]


def test_inspect_reports_big_endian(ours):
    proc = run_cli("inspect", "--json", ours["f16", "big"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["version"], report["byte_order"]) == (3, "big")


def test_split_parts_are_big_endian(tmp_path):
    ggufsmith.convert(EXAMPLE_MODEL, tmp_path / "model.gguf", "f16", bigendian=True,
                      split=ggufsmith.converters.split.SplitRule(max_tensors=20))
    parts = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert len(parts) == 2
    assert all(GGUFReader(p).byteorder == "big" for p in parts)


@pytest.mark.parametrize("outtype", ["q8_0", "q4_k_m"])
def test_quantized_outtypes_are_refused(outtype, tmp_path):
    target = tmp_path / "out.gguf"
    assert_clean_failure(run_cli("convert", EXAMPLE_MODEL, target, "--outtype", outtype, "--bigendian"),
                         f"--bigendian with --outtype {outtype}", target)


def test_quantize_to_a_float_preset_writes_big_endian(ours, tmp_path):
    """quantize --bigendian: the same tensors and keys as without it, in big-endian order."""
    src = ours["f32", "little"]
    big, little = tmp_path / "big.gguf", tmp_path / "little.gguf"
    for out, extra in ((big, ("--bigendian",)), (little, ())):
        proc = run_cli("quantize", src, out, "F16", *extra)
        assert proc.returncode == 0, proc.stderr
    big_reader, little_reader = GGUFReader(big), GGUFReader(little)
    assert big_reader.byteorder == "big"
    assert {k: _plain(v.value) for k, v in big_reader.metadata.items()} == \
        {k: _plain(v.value) for k, v in little_reader.metadata.items()}
    for t in little_reader.tensors:
        assert big_reader.tensor(t.name).ggml_type == t.ggml_type
        np.testing.assert_array_equal(big_reader.tensor(t.name).to_float32(), t.to_float32(), err_msg=t.name)


def test_quantize_to_a_quantized_preset_is_refused(ours, tmp_path):
    target = tmp_path / "q8.gguf"
    assert_clean_failure(run_cli("quantize", ours["f32", "little"], target, "Q8_0", "--bigendian"),
                         "--bigendian: tensor", target)
