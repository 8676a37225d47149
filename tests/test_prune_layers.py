"""`--prune-layers` (ggufsmith quantize and convert --outtype PRESET) against llama.cpp's own.

Oracle: llama_model_quantize with its prune_layers parameter (llama-cpp-python 0.3.36), on the same
F32 file with the same options: the files must be identical byte for byte (the pruned blocks gone,
the others renumbered, block_count set last, the type rules counting as llama.cpp does, the
importance of a renamed tensor taken from its original name). The pruned files load and run in
llama.cpp. The one deliberate difference, per-layer arrays, is checked against llama.cpp's loader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.constants import GGMLType, GGUFValueType, Keys, arch_key
from ggufsmith.converters.quantize_plan import QuantizeRequest
from ggufsmith.converters.requantize import quantize_gguf
from ggufsmith.gguf_writer import GGUFWriter, Metadata
from ggufsmith.gguf_writer.reader import GGUFReader
from ggufsmith.quantize.imatrix import read_imatrix
from ggufsmith.quantize.presets import get_preset
from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, run_cli
from tests.ggml_oracle import ggml_parse_gguf
from tests.llama_gguf_models import write_llama_gguf
from tests.requant_oracle import assert_same_file, assert_same_tensors, llama_quantize, prune_param, random_imatrix

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def llama8(tmp_path_factory):
    """An 8-layer llama F32 GGUF (rows of 256: no fallbacks) and an importance matrix for it."""
    root = tmp_path_factory.mktemp("prune")
    f32 = root / "llama8-f32.gguf"
    write_llama_gguf(f32, n_layer=8, ff=256)
    return f32, random_imatrix(f32, root / "imatrix.gguf")


@pytest.fixture(scope="module")
def example_f32(tmp_path_factory):
    """The example model (4 layers, with its tokenizer: it runs) converted to F32."""
    f32 = tmp_path_factory.mktemp("prune-example") / "example-f32.gguf"
    ggufsmith.convert(EXAMPLE_MODEL, f32, "f32")
    return f32


def _theirs(src: Path, dst: Path, preset: str, layers: list[int], imatrix=None) -> None:
    prune, keep = prune_param(layers)
    kwargs = {}
    if imatrix is not None:
        _, values, overrides = imatrix
        kwargs = dict(imatrix=values, kv_overrides=overrides)
    assert llama_quantize(src, dst, get_preset(preset).file_type, prune_layers=prune, **kwargs) == 0
    del keep


# (preset, blocks pruned, with an importance matrix). Q4_K_M: attn_v's use_more_bits counts the
# pruned model's attn_v tensors, ffn_down's the original block count; Q3_K_M/Q4_0 with an imatrix:
# the entries of renamed tensors; the first, the last and several blocks.
CASES = [("Q4_K_M", [3, 5], False), ("Q4_0", [0], True), ("Q3_K_M", [7], True), ("Q2_K", [1, 2, 3, 4], False)]


@pytest.mark.parametrize(("preset", "layers", "with_imatrix"), CASES,
                         ids=[f"{p}-{'-'.join(map(str, b))}{'-imatrix' if i else ''}" for p, b, i in CASES])
def test_quantize_prune_is_llama_quantize(llama8, tmp_path, preset, layers, with_imatrix):
    f32, imatrix = llama8
    _theirs(f32, tmp_path / "theirs.gguf", preset, layers, imatrix if with_imatrix else None)
    request = QuantizeRequest(preset, prune_layers=layers, imatrix=read_imatrix(imatrix[0]) if with_imatrix else None)
    quantize_gguf(f32, tmp_path / "ours.gguf", request)
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    names = [t["name"] for t in ggml_parse_gguf(tmp_path / "ours.gguf")["tensors"]]
    assert f"blk.{7 - len(layers)}.ffn_down.weight" in names and f"blk.{8 - len(layers)}.ffn_down.weight" not in names


@pytest.mark.parametrize("preset", ["IQ2_XXS", "IQ1_S"])
def test_lowest_bit_rules_count_the_original_blocks(llama8, tmp_path, preset):
    """The IQ2/IQ1 presets give the first n_layer/8 ffn_down tensors more bits, n_layer being the
    input's block count: 8 blocks, one pruned, llama.cpp still upgrades blk.0.ffn_down."""
    f32, imatrix = llama8
    _theirs(f32, tmp_path / "theirs.gguf", preset, [4], imatrix)
    theirs = {t["name"]: GGMLType(t["type"]) for t in ggml_parse_gguf(tmp_path / "theirs.gguf")["tensors"]}
    plan = quantize_gguf(f32, tmp_path / "ours.gguf", QuantizeRequest(preset, prune_layers=[4], imatrix=read_imatrix(imatrix[0])),
                         dry_run=True)
    assert {t.name: t.ggml_type for t in plan.tensors} == theirs
    assert theirs["blk.0.ffn_down.weight"] == GGMLType.Q2_K


def _run_in_llama_cpp(path: Path) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    try:
        tokens = llm.tokenize(b"Hello world, this is a test.")
        llm.eval(tokens)
        return np.asarray(llm.scores[: len(tokens)])
    finally:
        llm.close()


def test_convert_cli_prune_is_llama_quantize_and_runs(example_f32, tmp_path):
    """`ggufsmith convert --outtype q4_k_m --prune-layers 1` straight from the checkpoint."""
    _theirs(example_f32, tmp_path / "theirs.gguf", "Q4_K_M", [1])
    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "ours.gguf", "--outtype", "q4_k_m", "--prune-layers", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    assert GGUFReader(tmp_path / "ours.gguf").metadata.get("llama.block_count") == 3
    logits = _run_in_llama_cpp(tmp_path / "ours.gguf")
    assert np.isfinite(logits).all() and logits.std() > 0


def _with_per_layer_kv_heads(src: Path, dst: Path) -> int:
    """A copy of `src` whose head_count_kv is a per-layer array (as gemma4/apertus-style files have)."""
    reader = GGUFReader(src)
    key = arch_key(Keys.Attention.HEAD_COUNT_KV, "llama")
    n_layer = int(reader.metadata.get("llama.block_count"))
    metadata = Metadata()
    for k, value in reader.metadata.items():
        if k == key:
            metadata.add(k, [int(value.value)] * n_layer, GGUFValueType.ARRAY, GGUFValueType.UINT32)
        else:
            metadata.add_read_value(k, value)
    with GGUFWriter(dst, metadata) as writer:
        for t in reader.tensors:
            writer.add_tensor(t.name, t.shape, t.ggml_type)
        for t in reader.tensors:
            writer.write_tensor(t.name, t.to_float32())
    return n_layer


def test_per_layer_arrays_lose_the_pruned_entries(example_f32, tmp_path):
    """llama.cpp 0.3.36 leaves per-layer arrays whole, and then its loader refuses its own file;
    ours drops the pruned blocks' entries and runs. The tensors are llama.cpp's."""
    src = tmp_path / "per-layer.gguf"
    n_layer = _with_per_layer_kv_heads(example_f32, src)
    assert np.isfinite(_run_in_llama_cpp(src)).all()  # the unpruned copy is a valid model
    _theirs(src, tmp_path / "theirs.gguf", "Q8_0", [2])
    with pytest.raises(ValueError):
        llama_cpp.Llama(model_path=str(tmp_path / "theirs.gguf"), verbose=False)
    quantize_gguf(src, tmp_path / "ours.gguf", QuantizeRequest("Q8_0", prune_layers=[2]))
    assert_same_tensors(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    kv_heads = GGUFReader(tmp_path / "ours.gguf").metadata.get("llama.attention.head_count_kv")
    assert list(kv_heads) == [2] * (n_layer - 1)
    logits = _run_in_llama_cpp(tmp_path / "ours.gguf")
    assert np.isfinite(logits).all() and logits.std() > 0


@pytest.mark.parametrize(("layers", "culprit"), [("4", "--prune-layers 4"), ("0,1,2,3", "all 4 blocks")],
                         ids=["past-the-last-block", "every-block"])
def test_prune_layers_the_model_cannot_lose(example_f32, tmp_path, layers, culprit):
    """llama-quantize ignores a block the model does not have and writes a model without layers;
    we refuse both before writing anything."""
    out = tmp_path / "out.gguf"
    proc = run_cli("quantize", example_f32, out, "Q4_0", "--prune-layers", layers)
    assert_clean_failure(proc, culprit, out)


def test_prune_layers_needs_block_numbers(example_f32, tmp_path):
    proc = run_cli("quantize", example_f32, tmp_path / "out.gguf", "Q4_0", "--prune-layers", "1,x")
    assert proc.returncode != 0 and "'x' is not a block number" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "out.gguf", "--outtype", "f16", "--prune-layers", "1")
    assert_clean_failure(proc, "--prune-layers", tmp_path / "out.gguf")
