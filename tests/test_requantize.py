"""`ggufsmith quantize` and `convert --outtype PRESET` against llama.cpp's own quantizer.

Oracle: llama_model_quantize (llama-cpp-python) run on the F32 GGUF of the same checkpoint with the
same options; the files must be identical byte for byte (metadata, tensor order, types, data).
The importance matrices passed to llama.cpp are computed here from the sums and counts written to
the imatrix file (sums / count per expert, 1 for unused experts: llama-quantize's normalization).
Models: a llama with GQA (8 heads, 2 kv heads), a mixtral with 8 experts and a qwen3moe with 8
experts (issue 15's per-expert layout: its own arch name, q/k norms), hidden 256, feed-forward 320
so that ffn_down's rows of 320 make the 256-block K-quants fall back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.constants import GGMLType
from ggufsmith.converters.requantize import quantize_gguf
from ggufsmith.quantize.imatrix import read_imatrix, write_imatrix
from ggufsmith.quantize.presets import get_preset
from tests.llama_models import VARIANTS, randomize_weights
from ggufsmith.converters.plan import OUTTYPES
from tests.requant_models import (
    ALL_PRESETS,
    REPO,
    build_models,
    check_convert_preset,
    check_quantize,
    imatrix_files,
    preset_cases,
)
from tests.requant_oracle import PRESETS_NEEDING_IMATRIX, assert_same_file, llama_quantize
from tests.terminal import run_on_terminal

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

SHAPE = dict(hidden_size=256, intermediate_size=320, num_attention_heads=8, num_key_value_heads=2, head_dim=32)
MODELS = {
    "llama": ("llama_gqa", dict(SHAPE, num_hidden_layers=4)),
    "mixtral": ("mixtral", dict(SHAPE, num_hidden_layers=2, num_local_experts=8)),
    "qwen3moe": ("qwen3moe", dict(SHAPE, num_hidden_layers=2, num_experts=8, moe_intermediate_size=320)),
}
# Models beside tests/llama_models.py's: (transformers class, config fields)
OTHER_VARIANTS = {
    "qwen3moe": ("Qwen3MoeForCausalLM", dict(num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=512)),
}
# Run by default: one of each family (legacy, K mixes with attn_v/ffn_down rules, floats); the
# rest of the presets are in the slow matrix.
FAST_PRESETS = ["Q4_0", "Q2_K", "Q4_K_M", "F16"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF folder, our F32 GGUF of it)."""
    return build_models(MODELS, tmp_path_factory, _build)


def _build(model_dir: Path, variant: str, config: dict) -> None:
    import torch
    import transformers

    class_name, fields = VARIANTS[variant] if variant in VARIANTS else OTHER_VARIANTS[variant]
    model_class = getattr(transformers, class_name)
    torch.manual_seed(3)
    model = model_class(model_class.config_class(vocab_size=2000, bos_token_id=1, eos_token_id=2, **{**fields, **config}))
    randomize_weights(model.eval(), 3)
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def imatrices(models, tmp_path_factory):
    return imatrix_files(models, tmp_path_factory)


@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("preset", FAST_PRESETS)
@pytest.mark.parametrize("model", list(MODELS))
def test_quantize_is_llama_quantize(models, imatrices, tmp_path, model, preset, with_imatrix):
    check_quantize(models, imatrices, tmp_path, model, preset, with_imatrix)


# Some presets need an importance matrix (the refusal without one: test_q2_k_s_needs_an_imatrix,
# tests/test_presets.py)
SLOW_CASES = [
    (p, with_imatrix)
    for p in ALL_PRESETS if p not in FAST_PRESETS
    for with_imatrix in (False, True) if with_imatrix or p not in PRESETS_NEEDING_IMATRIX
]


# qwen3moe's every-preset tests are in tests/test_requantize_qwen3moe.py (a file of their own, run
# beside this one under --dist loadfile)
@pytest.mark.slow
@preset_cases(SLOW_CASES)
@pytest.mark.parametrize("model", [model for model in MODELS if model != "qwen3moe"])
def test_quantize_is_llama_quantize_every_preset(models, imatrices, tmp_path, model, preset, with_imatrix):
    check_quantize(models, imatrices, tmp_path, model, preset, with_imatrix)


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q4_0"])
@pytest.mark.parametrize("model", list(MODELS))
def test_convert_outtype_preset_is_llama_quantize_of_the_f32_file(models, imatrices, tmp_path, model, preset):
    check_convert_preset(models, imatrices, tmp_path, model, preset, with_imatrix=False, run=True)


@pytest.mark.parametrize("model", list(MODELS))
def test_convert_outtype_preset_with_imatrix(models, imatrices, tmp_path, model):
    check_convert_preset(models, imatrices, tmp_path, model, "Q3_K_M", with_imatrix=True)


# Every preset through `convert --outtype PRESET` with an importance matrix, and without one where
# llama-quantize allows it (issue 18), on the llama; the quantize path above covers every preset on
# every model, qwen3moe's convert path is in tests/test_requantize_qwen3moe.py (`convert --outtype
# PRESET` plans convert + quantize).
# The plain outtypes f32/f16/bf16/q8_0 take no imatrix: convert refuses one for them.
def _every_case(presets):
    return [(p, i) for p in presets for i in (False, True)
            if not (i and p.lower() in OUTTYPES) and (i or p not in PRESETS_NEEDING_IMATRIX)]


LLAMA_CONVERT_CASES = _every_case(ALL_PRESETS)


@pytest.mark.slow
@preset_cases(LLAMA_CONVERT_CASES)
def test_convert_every_preset_loads_and_runs(models, imatrices, tmp_path, preset, with_imatrix):
    check_convert_preset(models, imatrices, tmp_path, "llama", preset, with_imatrix, run=True)


# Q1_0 (blocks of 128, no fallback type) on the llama and the mixtral with feed-forward rows of 384.
Q1_0_MODELS = {name: (variant, dict(config, intermediate_size=384)) for name, (variant, config) in MODELS.items()
               if name in ("llama", "mixtral")}


@pytest.fixture(scope="module")
def q1_0_models(tmp_path_factory):
    return build_models(Q1_0_MODELS, tmp_path_factory, _build)


@pytest.fixture(scope="module")
def q1_0_imatrices(q1_0_models, tmp_path_factory):
    return imatrix_files(q1_0_models, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("model", list(Q1_0_MODELS))
def test_q1_0_is_llama_quantize(q1_0_models, q1_0_imatrices, tmp_path, model, with_imatrix):
    """quantize and convert --outtype q1_0 both, and the file runs."""
    check_quantize(q1_0_models, q1_0_imatrices, tmp_path, model, "Q1_0", with_imatrix)
    check_convert_preset(q1_0_models, q1_0_imatrices, tmp_path, model, "Q1_0", with_imatrix, run=True)


@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
def test_mxfp4_moe_on_qwen3moe_is_llama_quantize(models, imatrices, tmp_path, with_imatrix):
    """MXFP4_MOE: the expert stacks MXFP4, everything else quantizable Q8_0, from `convert
    --outtype` and from `quantize`, and the file runs in llama.cpp. Both types ignore an imatrix,
    so with one only the quantize.imatrix.* keys differ, as in llama-quantize."""
    check_convert_preset(models, imatrices, tmp_path, "qwen3moe", "MXFP4_MOE", with_imatrix, run=True)
    check_quantize(models, imatrices, tmp_path, "qwen3moe", "MXFP4_MOE", with_imatrix)
    types = {t.name: GGMLType(int(t.tensor_type)) for t in gguf.GGUFReader(tmp_path / "ours.gguf").tensors}
    assert types["blk.0.ffn_up_exps.weight"] == types["blk.1.ffn_down_exps.weight"] == GGMLType.MXFP4
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == GGMLType.Q8_0


def test_mxfp4_moe_file_is_read_back_for_requantizing_and_inspect(models, tmp_path):
    """An MXFP4 input is decoded (dequantize) as llama.cpp decodes it: requantizing the MXFP4_MOE
    file to Q4_K_M gives llama-quantize's bytes; the command line takes the preset and the type."""
    model_dir, f32 = models["qwen3moe"]
    mxfp4 = tmp_path / "mxfp4.gguf"
    _cli("convert", model_dir, mxfp4, "--outtype", "mxfp4_moe", "-q")
    assert llama_quantize(f32, tmp_path / "theirs-mxfp4.gguf", get_preset("MXFP4_MOE").file_type) == 0
    assert_same_file(mxfp4, tmp_path / "theirs-mxfp4.gguf")
    assert llama_quantize(mxfp4, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type, allow_requantize=True) == 0
    _cli("quantize", mxfp4, tmp_path / "ours.gguf", "Q4_K_M", "--allow-requantize", "-q")
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    # MXFP4 as a tensor type wherever types are accepted
    assert llama_quantize(f32, tmp_path / "theirs-tt.gguf", get_preset("Q8_0").file_type,
                          tensor_types=[("ffn_.*_exps", GGMLType.MXFP4)]) == 0
    _cli("quantize", f32, tmp_path / "ours-tt.gguf", "Q8_0", "--tensor-type", "ffn_.*_exps=mxfp4", "-q")
    assert_same_file(tmp_path / "ours-tt.gguf", tmp_path / "theirs-tt.gguf")
    listing = _cli("inspect", mxfp4).stdout
    assert "blk.0.ffn_gate_exps.weight" in listing and "MXFP4" in listing


def test_q2_k_s_needs_an_imatrix(models, imatrices, tmp_path):
    _, f32 = models["llama"]
    assert llama_quantize(f32, tmp_path / "theirs.gguf", get_preset("Q2_K_S").file_type) != 0
    with pytest.raises(ggufsmith.errors.QuantizationError, match="importance matrix"):
        quantize_gguf(f32, tmp_path / "ours.gguf", "Q2_K_S")
    assert not (tmp_path / "ours.gguf").exists()


def _cli(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "ggufsmith", *map(str, args)], cwd=REPO, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr)
    return result


# (our command-line options, llama_model_quantize's parameters for the same request)
OPTION_CASES = {
    "pure": (["--pure"], dict(pure=True)),
    "output-type": (["--output-tensor-type", "q5_k"], dict(output_tensor_type=int(GGMLType.Q5_K))),
    "embd-type": (["--token-embedding-type", "Q8_0"], dict(token_embedding_type=int(GGMLType.Q8_0))),
    "leave-output": (["--leave-output-tensor"], dict(quantize_output_tensor=False)),
    "tensor-type": (["--tensor-type", "ATTN_V=q6_k", "--tensor-type", r"blk\.1\..*=q8_0"],
                    dict(tensor_types=[("attn_v", GGMLType.Q6_K), (r"blk\.1\..*", GGMLType.Q8_0)])),
    "override-kv": (["--override-kv", "llama.context_length=int:-4096", "--override-kv", "general.name=str:renamed",
                     "--override-kv", "foo.ratio=float:0.25", "--override-kv", "foo.flag=bool:true"],
                    dict(kv_overrides=[("llama.context_length", "int", -4096), ("general.name", "str", "renamed"),
                                       ("foo.ratio", "float", 0.25), ("foo.flag", "bool", True)])),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_cli_options_match_llama_quantize(models, tmp_path, case):
    _, f32 = models["llama"]
    ours_args, their_params = OPTION_CASES[case]
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    assert llama_quantize(f32, theirs, get_preset("Q3_K_M").file_type, **their_params) == 0
    _cli("quantize", f32, ours, "q3_k_m", "--quiet", *ours_args)
    assert_same_file(ours, theirs)


def test_include_and_exclude_weights_select_imatrix_entries(models, imatrices, tmp_path):
    _, f32 = models["mixtral"]
    path, values, overrides = imatrices["mixtral"]
    kept = {k: v for k, v in values.items() if "ffn_down" not in k}
    overrides = [(k, kind, len(kept) if k.endswith("entries_count") else v) for k, kind, v in overrides]
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    assert llama_quantize(f32, theirs, get_preset("Q4_K_S").file_type, imatrix=kept, kv_overrides=overrides) == 0
    _cli("quantize", f32, ours, "Q4_K_S", "--imatrix", path, "--exclude-weights", "ffn_down", "-q")
    assert_same_file(ours, theirs)
    kept = {k: v for k, v in values.items() if "attn" in k}
    overrides = [(k, kind, len(kept) if k.endswith("entries_count") else v) for k, kind, v in overrides]
    assert llama_quantize(f32, theirs, get_preset("Q4_K_S").file_type, imatrix=kept, kv_overrides=overrides) == 0
    _cli("quantize", f32, ours, "Q4_K_S", "--imatrix", path, "--include-weights", "attn", "-q")
    assert_same_file(ours, theirs)


def test_requantize_needs_the_flag_and_then_matches(models, tmp_path):
    _, f32 = models["llama"]
    q8 = tmp_path / "q8.gguf"
    assert llama_quantize(f32, q8, get_preset("Q8_0").file_type) == 0
    refused = _cli("quantize", q8, tmp_path / "ours.gguf", "Q4_K_M", check=False)
    assert refused.returncode == 1 and "--allow-requantize" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert llama_quantize(q8, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type) != 0  # refused there too
    assert llama_quantize(q8, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type, allow_requantize=True) == 0
    _cli("quantize", q8, tmp_path / "ours.gguf", "Q4_K_M", "--allow-requantize", "-q")
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")


def test_f16_input_and_same_type_copies(models, tmp_path):
    """An F16 input: F16 tensors that stay F16 are copied, the others quantized from F16."""
    model_dir, _ = models["mixtral"]
    f16 = tmp_path / "f16.gguf"
    ggufsmith.convert(model_dir, f16, "f16")
    for preset in ("Q5_K_M", "F16"):
        assert llama_quantize(f16, tmp_path / "theirs.gguf", get_preset(preset).file_type) == 0
        quantize_gguf(f16, tmp_path / "ours.gguf", preset)
        assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")


def test_dry_run_prints_the_plan_and_the_type_table(models, tmp_path):
    _, f32 = models["llama"]
    out = tmp_path / "never.gguf"
    result = _cli("quantize", f32, out, "Q4_K_M", "--dry-run")
    assert not out.exists()
    assert "blk.0.attn_v.weight" in result.stdout and "Q6_K" in result.stdout
    assert "bits per weight" in result.stderr and "Q4_K" in result.stderr and "total" in result.stderr
    assert llama_quantize(f32, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type) == 0
    # the table's total equals the tensor data llama.cpp writes
    theirs = gguf.GGUFReader(tmp_path / "theirs.gguf")
    mib = sum(int(t.n_bytes) for t in theirs.tensors) / 2**20
    assert f"{mib:.2f}" in result.stderr.splitlines()[-2]


def test_legacy_dat_imatrix_is_read_like_llama_quantize(models, imatrices, tmp_path):
    """The .dat format stores values already multiplied by the call count; llama-quantize divides."""
    import struct

    _, f32 = models["llama"]
    _, values, _ = imatrices["llama"]
    ncall = 3
    blob = [struct.pack("<i", len(values))]
    for name, v in values.items():
        blob += [struct.pack("<i", len(name)), name.encode(), struct.pack("<ii", ncall, v.size),
                 (v * np.float32(ncall)).astype("<f4").tobytes()]
    blob += [struct.pack("<i", 11), struct.pack("<i", 5), b"wiki1"]
    dat = tmp_path / "imatrix.dat"
    dat.write_bytes(b"".join(blob))
    matrix = read_imatrix(dat)
    assert matrix.is_legacy and matrix.chunk_count == 11 and matrix.datasets == ["wiki1"]
    expected = {k: (v * np.float32(ncall)) / np.float32(ncall) for k, v in values.items()}
    overrides = [("quantize.imatrix.file", "str", str(dat)), ("quantize.imatrix.dataset", "str", "wiki1"),
                 ("quantize.imatrix.entries_count", "int", len(values)), ("quantize.imatrix.chunks_count", "int", 11)]
    assert llama_quantize(f32, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type, imatrix=expected,
                          kv_overrides=overrides) == 0
    _cli("quantize", f32, tmp_path / "ours.gguf", "Q4_K_M", "--imatrix", dat, "-q")
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")


def test_imatrix_of_another_model_is_refused(models, tmp_path):
    _, f32 = models["llama"]
    wrong = {"blk.0.attn_q.weight": (np.ones(128, np.float32), np.ones(1, np.float32))}  # rows are 256 here
    path = write_imatrix(tmp_path / "wrong.gguf", wrong, ["x"], 1, 512)
    assert llama_quantize(f32, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type,
                          imatrix={"blk.0.attn_q.weight": np.ones(128, np.float32)}) != 0
    result = _cli("quantize", f32, tmp_path / "o.gguf", "Q4_K_M", "--imatrix", path, check=False)
    assert result.returncode == 1 and "computed for another model" in result.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_imatrix_file_is_valid_gguf_for_gguf_py(imatrices):
    """Our writer's layout, read by gguf-py: llama-imatrix's key names, tensor names and shapes."""
    path, values, _ = imatrices["mixtral"]
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.type"].contents() == "imatrix"
    assert reader.fields["imatrix.datasets"].contents() == ["calibration.txt"]
    assert reader.fields["imatrix.chunk_count"].contents() == 7
    assert reader.fields["imatrix.chunk_size"].contents() == 512
    names = [t.name for t in reader.tensors]
    assert names == [n for name in sorted(values) for n in (name + ".in_sum2", name + ".counts")]
    experts = {t.name: t for t in reader.tensors}["blk.0.ffn_up_exps.weight.in_sum2"]
    assert experts.shape.tolist() == [256, 8]  # ne0 = row length, ne1 = experts


def test_convert_cli_with_preset_and_imatrix(models, imatrices, tmp_path):
    model_dir, f32 = models["mixtral"]
    path, values, overrides = imatrices["mixtral"]
    assert llama_quantize(f32, tmp_path / "theirs.gguf", get_preset("Q4_K_M").file_type, imatrix=values,
                          kv_overrides=overrides) == 0
    status, stderr = run_on_terminal([sys.executable, "-m", "ggufsmith", "convert", str(model_dir), str(tmp_path / "ours.gguf"),
                                      "--outtype", "Q4_K_M", "--imatrix", str(path)], REPO)
    assert status == 0, stderr
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    assert "ours.gguf: 100%" in stderr  # one byte bar over the whole file
    assert "bits per weight" in stderr and "Q8_0" in stderr  # the type table (MoE attn_v -> Q8_0)
    misuse = _cli("convert", model_dir, tmp_path / "x.gguf", "--outtype", "f16", "--imatrix", path, check=False)
    assert misuse.returncode == 1 and "preset" in misuse.stderr


def _split(f32: Path, first: Path, n_first: int) -> list[Path]:
    """Two parts of a gguf-split model, written with our writer and llama.cpp's split keys."""
    from ggufsmith.constants import GGUFValueType
    from ggufsmith.gguf_writer import GGUFWriter, Metadata
    from ggufsmith.gguf_writer.reader import GGUFReader

    reader = GGUFReader(f32)
    parts = [reader.tensors[:n_first], reader.tensors[n_first:]]
    paths = [first, first.with_name(first.name.replace("-00001-of-", "-00002-of-"))]
    for index, (path, tensors) in enumerate(zip(paths, parts)):
        md = Metadata()
        if index == 0:
            for key, value in reader.metadata.items():
                md.add_value(key, value)
        md.add("split.no", index, GGUFValueType.UINT16)
        md.add("split.count", 2, GGUFValueType.UINT16)
        md.add("split.tensors.count", len(reader.tensors), GGUFValueType.INT32)
        with GGUFWriter(path, md) as writer:
            for t in tensors:
                writer.add_tensor(t.name, t.shape, t.ggml_type)
            for t in tensors:
                writer.write_tensor(t.name, t.data)
    return paths


def test_split_input_is_read_whole(models, tmp_path):
    _, f32 = models["llama"]
    first, _ = _split(f32, tmp_path / "model-00001-of-00002.gguf", 10)
    assert llama_quantize(first, tmp_path / "theirs.gguf", get_preset("Q4_K_S").file_type) == 0
    quantize_gguf(first, tmp_path / "ours.gguf", "Q4_K_S")
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")



def test_keep_split_writes_llama_quantizes_parts(models, tmp_path):
    _, f32 = models["mixtral"]
    first, _ = _split(f32, tmp_path / "model-00001-of-00002.gguf", 7)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "ours").mkdir()
    assert llama_quantize(first, tmp_path / "theirs" / "q", get_preset("Q3_K_M").file_type, keep_split=True) == 0
    _cli("quantize", first, tmp_path / "ours" / "q.gguf", "Q3_K_M", "--keep-split", "-q")
    names = sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert names == ["q-00001-of-00002.gguf", "q-00002-of-00002.gguf"]
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == names
    for name in names:
        assert_same_file(tmp_path / "ours" / name, tmp_path / "theirs" / name)
