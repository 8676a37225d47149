"""Files in every IQ, ternary and 1-/2-bit type made by llama.cpp itself, read by ggufsmith.

One file per type, written by llama_model_quantize (--pure, so that every weight has the type; token
embedding and output Q8_0, which ggml would otherwise refuse to make IQ2/IQ1 without importance):
- `ggufsmith inspect` reads it and lists the types llama.cpp's own GGUF parser sees;
- our reader's to_float32() equals ggml's to_float on the same bytes, bit for bit;
- `ggufsmith quantize --allow-requantize` of it to Q8_0 (dequantize, quantize) is
  llama_model_quantize's requantization of it, byte for byte.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.converters.quantize_plan import QuantizeRequest
from ggufsmith.converters.requantize import quantize_gguf
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.quantize.presets import PRESETS
from tests.damaged_inputs import run_cli
from tests.ggml_oracle import ggml_dequantize, ggml_parse_gguf
from tests.llama_gguf_models import write_llama_gguf
from tests.requant_oracle import assert_same_file, llama_quantize, random_imatrix

pytest.importorskip("llama_cpp")

T = GGMLType
# type -> the preset whose --pure file has it (IQ2_S is IQ2_M's base type, as in llama.cpp)
TYPES = {
    T.IQ4_NL: "IQ4_NL", T.IQ4_XS: "IQ4_XS", T.IQ3_XXS: "IQ3_XXS", T.IQ3_S: "IQ3_S", T.IQ2_XXS: "IQ2_XXS",
    T.IQ2_XS: "IQ2_XS", T.IQ2_S: "IQ2_M", T.IQ1_S: "IQ1_S", T.IQ1_M: "IQ1_M", T.TQ1_0: "TQ1_0", T.TQ2_0: "TQ2_0",
    T.Q1_0: "Q1_0", T.Q2_0: "Q2_0",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-cpp-quantized")
    f32 = root / "f32.gguf"
    write_llama_gguf(f32, n_layer=2, hidden=256, ff=256, vocab=256)
    return root, f32, random_imatrix(f32, root / "imatrix.gguf")


@pytest.fixture(scope="module")
def llama_cpp_files(source):
    root, f32, (_, values, _) = source
    files = {}
    for ggml_type, preset in TYPES.items():
        path = root / f"{ggml_type.name}.gguf"
        assert llama_quantize(f32, path, PRESETS[preset].file_type, imatrix=values, pure=True,
                              token_embedding_type=int(T.Q8_0), output_tensor_type=int(T.Q8_0)) == 0
        files[ggml_type] = path
    return files


@pytest.mark.parametrize("ggml_type", list(TYPES), ids=[t.name for t in TYPES])
def test_inspect_and_reader_decode_llama_cpp_files(llama_cpp_files, ggml_type):
    path = llama_cpp_files[ggml_type]
    theirs = ggml_parse_gguf(path)["tensors"]
    proc = run_cli("inspect", path, "--json")
    assert proc.returncode == 0, proc.stderr
    listed = [(t["name"], t["type"]) for t in json.loads(proc.stdout)["tensors"]]
    assert listed == [(t["name"], T(t["type"]).name) for t in theirs]
    assert sum(t["type"] == ggml_type for t in theirs) == 14  # the 7 weights of each of the two blocks

    for t in GGUFReader(path).tensors:
        if t.ggml_type == T.F32:  # the norms (ggml has no to_float for F32)
            continue
        expected = ggml_dequantize(t.data, t.ggml_type, t.n_elements).reshape(t.shape)
        ours = t.to_float32()
        assert ours.shape == expected.shape
        assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32)), f"{t.name} ({t.ggml_type.name})"


@pytest.mark.parametrize("ggml_type", list(TYPES), ids=[t.name for t in TYPES])
def test_requantizing_llama_cpp_files_is_llama_quantize(llama_cpp_files, tmp_path, ggml_type):
    path = llama_cpp_files[ggml_type]
    assert llama_quantize(path, tmp_path / "theirs.gguf", PRESETS["Q8_0"].file_type, allow_requantize=True) == 0
    quantize_gguf(path, tmp_path / "ours.gguf", QuantizeRequest("Q8_0", allow_requantize=True))
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
