"""Worker counts: the default from the cores this process may use, --threads/threads=, and the
same file for every count.

Every tensor is cut into many small pieces here (SLICE_ELEMENTS of 7 rows of 256, so that pieces
straddle the experts of a stacked MoE tensor) and every quantization goes to a worker process
(PROCESS_MIN_ELEMENTS 0), so that the pieces of one tensor really are converted at once, out of
order, by several threads and processes. The oracle is llama.cpp's llama_model_quantize on the
F32 file: each worker count must give its file byte for byte. Models: test_requantize's llama
with GQA and mixtral with 8 experts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
import ggufsmith.converters.pipeline as pipeline
import ggufsmith.converters.workers as workers
from ggufsmith.constants import GGMLType
from ggufsmith.converters.quantize_plan import QuantizeRequest
from ggufsmith.converters.requantize import quantize_gguf
from ggufsmith.errors import ConversionError
from ggufsmith.quantize.imatrix import read_imatrix
from ggufsmith.quantize.presets import PRESETS, get_preset
from tests.requant_oracle import assert_same_file, llama_quantize
from tests.test_requantize import imatrices, models  # noqa: F401 - the shared model fixtures

REPO = Path(__file__).resolve().parent.parent
WORKER_COUNTS = [1, 2, None]  # None: every available core


@pytest.fixture
def many_pieces(monkeypatch):
    monkeypatch.setattr(pipeline, "SLICE_ELEMENTS", 7 * 256)
    monkeypatch.setattr(workers, "PROCESS_MIN_ELEMENTS", 0)


def _same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


SLOW = pytest.mark.slow


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q6_K", pytest.param("Q4_0", marks=SLOW), pytest.param("Q8_0", marks=SLOW), "F16"])
@pytest.mark.parametrize("model", ["llama", "mixtral"])
def test_quantize_every_worker_count_is_llama_quantize(models, tmp_path, many_pieces, model, preset):  # noqa: F811
    _, f32 = models[model]
    theirs = tmp_path / "theirs.gguf"
    assert llama_quantize(f32, theirs, get_preset(preset).file_type) == 0
    for threads in WORKER_COUNTS:
        ours = tmp_path / f"ours-{threads}.gguf"
        quantize_gguf(f32, ours, preset, threads=threads)
        assert_same_file(ours, theirs)


def test_quantize_with_imatrix_across_expert_boundaries(models, imatrices, tmp_path, many_pieces):  # noqa: F811
    """Pieces that straddle two experts take each expert's importance vector, in any worker."""
    _, f32 = models["mixtral"]
    path, values, overrides = imatrices["mixtral"]
    theirs = tmp_path / "theirs.gguf"
    assert llama_quantize(f32, theirs, get_preset("Q4_K_M").file_type, imatrix=values, kv_overrides=overrides) == 0
    for threads in WORKER_COUNTS:
        ours = tmp_path / f"ours-{threads}.gguf"
        quantize_gguf(f32, ours, QuantizeRequest("Q4_K_M", imatrix=read_imatrix(path)), threads=threads)
        assert_same_file(ours, theirs)


# Presets checked against llama-quantize above; Q1_0 has no fallback for the rows of 320 here.
OTHER_PRESETS = sorted(set(PRESETS) - {"Q4_K_M", "Q6_K", "Q4_0", "Q8_0", "F16", "Q1_0"})


@SLOW
@pytest.mark.parametrize("preset", OTHER_PRESETS)
def test_every_preset_gives_the_same_file_for_every_worker_count(models, imatrices, tmp_path, monkeypatch, preset):  # noqa: F811
    """Every other preset (the IQ and ternary types too), with the importance matrix that the
    lowest-bit ones require: one file whatever the number of threads and processes. Pieces of 37
    rows (a few per tensor, so that they are converted at once; the 7-row pieces above would
    make this test minutes long). Which file is right is test_presets.py's and
    test_requantize.py's business, against llama-quantize."""
    monkeypatch.setattr(pipeline, "SLICE_ELEMENTS", 37 * 256)
    monkeypatch.setattr(workers, "PROCESS_MIN_ELEMENTS", 0)
    _, f32 = models["llama"]
    path, _, _ = imatrices["llama"]
    request = QuantizeRequest(preset, imatrix=read_imatrix(path))
    outputs = []
    for threads in sorted({1, 2, workers.resolve_workers(None)}):  # the default, when it is neither
        outputs.append(tmp_path / f"ours-{threads}.gguf")
        quantize_gguf(f32, outputs[-1], request, threads=threads)
    for other in outputs[1:]:
        assert _same_bytes(outputs[0], other), f"{preset}: {other.name} differs from {outputs[0].name}"


@pytest.mark.parametrize("outtype", [pytest.param("f32", marks=SLOW), "f16", pytest.param("bf16", marks=SLOW),
                                     pytest.param("q8_0", marks=SLOW), "q4_k_m", pytest.param("q6_k", marks=SLOW)])
def test_convert_every_worker_count_writes_the_same_file(models, tmp_path, many_pieces, outtype):  # noqa: F811
    """From the checkpoint: the rotary-permuted attn_q/attn_k are loaded whole and their row
    ranges quantized at once; presets are also llama-quantize's file."""
    model_dir, f32 = models["llama"]
    outputs = []
    for threads in WORKER_COUNTS:
        outputs.append(tmp_path / f"ours-{threads}.gguf")
        ggufsmith.convert(model_dir, outputs[-1], outtype, threads=threads)
    for other in outputs[1:]:
        assert _same_bytes(outputs[0], other), f"{other.name} differs from {outputs[0].name}"
    if outtype in ("q4_k_m", "q6_k"):
        theirs = tmp_path / "theirs.gguf"
        assert llama_quantize(f32, theirs, get_preset(outtype).file_type) == 0
        assert_same_file(outputs[0], theirs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_convert_from_half_precision_reads_rows_in_the_worker_processes(models, tmp_path, many_pieces, dtype):  # noqa: F811
    """A bf16 or f16 checkpoint's rows are read and widened by the quantizer processes themselves
    (readers/file_rows.py), in pieces that straddle tensors' rows: every worker count gives
    llama-quantize's file of the same values in F32."""
    import torch
    from safetensors.torch import load_file, save_file

    model_dir, _ = models["llama"]
    half = tmp_path / f"llama-{dtype}"
    half.mkdir()
    for item in model_dir.iterdir():
        if item.suffix != ".safetensors":
            (half / item.name).write_bytes(item.read_bytes())
    weights = {name: t.to(getattr(torch, dtype)) for name, t in load_file(model_dir / "model.safetensors").items()}
    save_file(weights, half / "model.safetensors", metadata={"format": "pt"})
    f32, theirs = tmp_path / "f32.gguf", tmp_path / "theirs.gguf"
    ggufsmith.convert(half, f32, "f32", threads=1)  # widening is exact: the same values
    assert llama_quantize(f32, theirs, get_preset("Q4_K_M").file_type) == 0
    for threads in WORKER_COUNTS:
        ours = tmp_path / f"ours-{threads}.gguf"
        ggufsmith.convert(half, ours, "q4_k_m", threads=threads)
        assert_same_file(ours, theirs)


def test_quantize_from_f16_reads_rows_in_the_worker_processes(models, tmp_path, many_pieces, monkeypatch):  # noqa: F811
    """An F16 GGUF's rows are read and widened by the quantizer processes themselves, as a
    checkpoint's are (readers/file_rows.py): this process decodes none of the K-quants' rows (only
    those of the tensors whose rows of 320 fall back to a legacy type, quantized in threads), and
    every worker count gives llama-quantize's file from the same F16 file."""
    import ggufsmith.readers.gguf_source as gguf_source

    _, f32 = models["llama"]
    f16, theirs = tmp_path / "f16.gguf", tmp_path / "theirs.gguf"
    quantize_gguf(f32, f16, "F16", threads=1)
    assert llama_quantize(f16, theirs, get_preset("Q4_K_M").file_type) == 0
    decoded_here = []
    decode = gguf_source.dequantize
    monkeypatch.setattr(gguf_source, "dequantize", lambda data, ggml_type, shape: (
        decoded_here.append((GGMLType(ggml_type).name, shape[-1])), decode(data, ggml_type, shape))[1])
    for threads in WORKER_COUNTS:
        decoded_here.clear()
        ours = tmp_path / f"ours-{threads}.gguf"
        quantize_gguf(f16, ours, "Q4_K_M", threads=threads)
        assert_same_file(ours, theirs)
        decoded_f16 = {row_length for ggml_type, row_length in decoded_here if ggml_type == "F16"}
        assert decoded_f16 == ({320} if workers.resolve_workers(threads) > 1 else {256, 320})


def test_cli_threads_option(models, tmp_path):  # noqa: F811
    _, f32 = models["llama"]
    runs = {}
    for threads in ("1", "2"):
        runs[threads] = tmp_path / f"t{threads}.gguf"
        proc = subprocess.run([sys.executable, "-m", "ggufsmith", "quantize", str(f32), str(runs[threads]), "Q4_K_S",
                               "--threads", threads, "--quiet"], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert _same_bytes(runs["1"], runs["2"])
    proc = subprocess.run([sys.executable, "-m", "ggufsmith", "quantize", str(f32), str(tmp_path / "x.gguf"), "Q4_K_S",
                           "--threads", "-2"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "--threads" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("threads", [-1, 1.5, "2"])
def test_api_rejects_a_bad_worker_count_before_writing(models, tmp_path, threads):  # noqa: F811
    model_dir, f32 = models["llama"]
    with pytest.raises(ConversionError, match="threads"):
        ggufsmith.convert(model_dir, tmp_path / "a.gguf", "f16", threads=threads)
    with pytest.raises(ConversionError, match="threads"):
        ggufsmith.quantize_gguf(f32, tmp_path / "b.gguf", "Q4_0", threads=threads)
    assert list(tmp_path.iterdir()) == []


def test_error_in_a_worker_process_names_the_tensor(models, tmp_path, many_pieces):  # noqa: F811
    """A NaN reaches the quantizer in a worker process: the error comes back naming the tensor,
    and nothing is written."""
    gguf = pytest.importorskip("gguf")
    _, f32 = models["llama"]
    damaged = tmp_path / "nan.gguf"
    damaged.write_bytes(f32.read_bytes())
    reader = gguf.GGUFReader(damaged, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    tensor.data.reshape(-1)[300] = np.nan
    reader.data.flush()
    del reader
    with pytest.raises(ggufsmith.GgufsmithError, match=r"blk\.1\.ffn_up\.weight.*NaN"):
        quantize_gguf(damaged, tmp_path / "out.gguf", "Q4_K_M", threads=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.gguf"]


# -- the default worker count ------------------------------------------------------------------

def test_default_follows_the_cpu_affinity():
    """Restricted to one CPU (as `taskset -c 0` does), the default is one worker whatever the host has."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from ggufsmith.converters.workers import resolve_workers; print(resolve_workers(None))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"
    assert workers.available_cores() == min(len(os.sched_getaffinity(0)), workers.available_cores())


def _cgroup_v2(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 tree under tmp_path/fs with cpu.max files, the process in /outer/inner."""
    root = tmp_path / "fs"
    for where, text in limits.items():
        (root / where).mkdir(parents=True, exist_ok=True)
        (root / where / "cpu.max").write_text(text + "\n")
    (root / "outer" / "inner").mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/outer/inner\n")
    return root, proc


@pytest.mark.parametrize(("limits", "quota"), [
    ({"outer/inner": "150000 100000"}, 1.5),  # docker --cpus 1.5
    ({"outer": "200000 100000", "outer/inner": "max 100000"}, 2.0),  # the parent's limit applies
    ({".": "400000 100000"}, 4.0),  # a container sees its own cgroup at the root
    ({"outer/inner": "max 100000"}, None),
    ({}, None),
])
def test_cgroup_v2_cpu_quota(tmp_path, limits, quota):
    root, proc = _cgroup_v2(tmp_path, limits)
    assert workers.cgroup_cpu_quota(root, proc) == quota


@pytest.mark.parametrize(("quota_us", "expected"), [("50000", 0.5), ("-1", None)])
def test_cgroup_v1_cpu_quota(tmp_path, quota_us, expected):
    controller = tmp_path / "fs" / "cpu,cpuacct" / "job"
    controller.mkdir(parents=True)
    (controller / "cpu.cfs_quota_us").write_text(quota_us + "\n")
    (controller / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("5:memory:/job\n4:cpu,cpuacct:/job\n0::/\n")
    assert workers.cgroup_cpu_quota(tmp_path / "fs", proc) == expected


def test_a_quota_caps_the_default(monkeypatch):
    monkeypatch.setattr(workers, "cgroup_cpu_quota", lambda: 0.5)
    assert workers.resolve_workers(None) == 1
    assert workers.resolve_workers(3) == 3  # an explicit count is obeyed


def test_lookahead_grows_with_workers_within_the_budget():
    sizes = [workers.lookahead_bytes(n) for n in (1, 2, 4, 16, 64, 256)]
    assert sizes == sorted(sizes) and sizes[0] == workers.LOOKAHEAD_MIN_BYTES
    assert sizes[3] == 16 * workers.LOOKAHEAD_BYTES_PER_WORKER and sizes[-1] == workers.LOOKAHEAD_MAX_BYTES


def test_a_quantizer_process_that_dies_is_a_clean_error():
    """Killed (the OOM killer, a user), a quantizer process gives a one-line ConversionError, not a hang."""
    from ggufsmith.converters.processes import QuantizerProcesses
    from ggufsmith.quantize import quantize

    rows = np.random.default_rng(0).standard_normal((8, 256), dtype=np.float32)
    processes = QuantizerProcesses(1)
    try:
        assert np.array_equal(processes.quantize(rows, GGMLType.Q4_K, None), quantize(rows, GGMLType.Q4_K))
        (worker,) = processes._started
        worker.kill()
        with pytest.raises(ConversionError, match="quantizer worker process stopped"):
            processes.quantize(rows, GGMLType.Q4_K, None)
    finally:
        processes.close()
