"""`ggufsmith batch` (issue 13): many models by many types, each source read once, resumable, isolated.

The reference for every output is a separate `ggufsmith.convert` of the same model with the same
options (itself checked against llama.cpp by the convert tests): the batch files must be the same
bytes. Three tiny random-weight models, two architectures (llama in float32 and in bfloat16, qwen2),
rows of 256 so that the k-quant presets really use their k-quant types.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.converters.split import SplitRule
from ggufsmith.batch import batch, load_plan
from ggufsmith.batch.state import STATE_FILE
from ggufsmith.errors import BatchError
from tests.damaged_inputs import REPO, leftovers, run_cli

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TYPES = ["f16", "q8_0", "q4_k_m", "q6_k"]
FIELDS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
VOCAB = 600


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """plan folder with models/llama-a (f32), models/llama-b (bf16), models/qwen-c, and an imatrix for llama-a."""
    import torch
    from safetensors.torch import load_file, save_file

    from ggufsmith.quantize.imatrix import write_imatrix
    from tests.family_models import build_model
    from tests.tokenizer_helpers import train_bpe, train_sentencepiece

    root = tmp_path_factory.mktemp("batch")
    llama = dict(FIELDS, vocab_size=VOCAB + 8, bos_token_id=1, eos_token_id=2)
    for name, seed in (("llama-a", 0), ("llama-b", 1)):
        model_dir = root / "models" / name
        train_sentencepiece(model_dir, vocab_size=VOCAB)
        build_model("LlamaConfig", "LlamaForCausalLM", model_dir, seed=seed, **llama)
    bf16 = root / "models" / "llama-b" / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(bf16).items()}, bf16, metadata={"format": "pt"})
    qwen = root / "models" / "qwen-c"
    train_bpe(qwen, "qwen2", vocab_size=VOCAB)
    build_model("Qwen2Config", "Qwen2ForCausalLM", qwen, seed=2, **dict(FIELDS, vocab_size=VOCAB + 8, bos_token_id=0,
                                                                         eos_token_id=0))
    rng = np.random.default_rng(0)
    plan = ggufsmith.convert(root / "models" / "llama-a", root / "unused.gguf", "f32", dry_run=True)
    entries = {t.name: (rng.uniform(0.1, 5.0, t.shape[-1]).astype(np.float32), np.array([10.0], np.float32))
               for t in plan.tensors if len(t.shape) == 2}
    write_imatrix(root / "imatrix.gguf", entries, ["calibration.txt"], chunk_count=3, chunk_size=64)
    return root


_references: dict[tuple, bytes] = {}


def reference(root: Path, model: str, outtype: str, **options) -> bytes:
    """The bytes of a separate `convert` of models/MODEL to OUTTYPE (cached for the session)."""
    key = (str(root), model, outtype, json.dumps(options, sort_keys=True, default=str))
    if key not in _references:
        out = root / "reference" / f"{model}-{outtype}-{len(_references)}.gguf"
        out.parent.mkdir(exist_ok=True)
        ggufsmith.convert(root / "models" / model, out, outtype, **options)
        _references[key] = out.read_bytes()
    return _references[key]


def three_by_four(root: Path, out: str) -> Path:
    plan = root / f"plan-{out}.yaml"
    plan.write_text(f"""
output_dir: {out}
defaults:
  outtypes: [{", ".join(TYPES)}]
sources:
  - path: models/llama-a
    imatrix: imatrix.gguf
  - path: models/llama-b
  - path: models/qwen-c
""")
    return plan


def assert_outputs_are_the_converts(root: Path, report, imatrix_for=("llama-a",)) -> None:
    assert report.ok, report.table()
    for r in report.results:
        model = Path(r.source).name
        options = {"imatrix": root / "imatrix.gguf"} if model in imatrix_for and r.outtype in ("q4_k_m", "q6_k") else {}
        assert Path(r.file).read_bytes() == reference(root, model, r.outtype, **options), (r.source, r.outtype)


@pytest.mark.slow
def test_the_issue_yaml_works_as_written_with_conventional_names(models):
    plan = models / "issue.yaml"
    plan.write_text("output_dir: out\nsources:\n  - path: models/llama-a\n    outtypes: [f16, q8_0, q4_k_m]\n"
                    "  - path: models/qwen-c\n    outtypes: [q6_k]\n")
    report = batch(plan)
    assert report.ok and [r.status for r in report.results] == ["done"] * 4
    for r in report.results:
        path = Path(r.file)
        assert path.parent == models / "out"
        fields = {f.name: f.contents() for f in gguf.GGUFReader(path).fields.values() if f.name.startswith("general.")}
        expected = gguf.naming_convention(fields.get("general.name"), fields.get("general.basename"),
                                          fields.get("general.finetune"), fields.get("general.version"),
                                          fields.get("general.size_label"), r.outtype)
        assert path.name == expected + ".gguf"
        assert path.read_bytes() == reference(models, Path(r.source).name, r.outtype)


@pytest.mark.slow
def test_three_models_by_four_types_in_worker_processes_are_the_separate_converts(models):
    report = batch(three_by_four(models, "local"), jobs=2)
    assert len(report.results) == 12
    assert_outputs_are_the_converts(models, report)
    sizes = {r.outtype: r.bits_per_weight for r in report.results if r.source == "models/llama-a"}
    assert sizes["f16"] > sizes["q8_0"] > sizes["q6_k"] > sizes["q4_k_m"]


@pytest.mark.slow
def test_threads_option_makes_the_same_files(models):
    """`--threads 1`: each source converted on one thread, the same bytes as a `convert` on every core."""
    plan = models / "threads.yaml"
    plan.write_text("output_dir: threads-out\nsources:\n  - path: models/llama-b\n    outtypes: [q8_0, q4_k_m]\n"
                    "  - path: models/qwen-c\n    outtypes: [q6_k]\n")
    proc = run_cli("batch", plan, "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["outputs"]
    assert [r["status"] for r in results] == ["done"] * 3
    for r in results:
        assert Path(r["file"]).read_bytes() == reference(models, Path(r["source"]).name, r["outtype"]), r


def test_threads_per_source_set_how_many_sources_run_at_once(models, monkeypatch):
    from ggufsmith.batch import local

    monkeypatch.setattr(local, "available_cores", lambda: 8)
    sources = load_plan(three_by_four(models, "unused")).sources  # three sources
    assert local.worker_count(sources, None, None) == 3  # one per source, the 8 cores shared out
    assert local.worker_count(sources, None, None, threads=4) == 2  # 8 cores / 4 threads each
    assert local.worker_count(sources, None, None, threads=8) == 1
    assert local.worker_count(sources, 3, None, threads=8) == 3  # --jobs still decides when given


def test_bad_threads_is_refused_before_anything_runs(models):
    plan = three_by_four(models, "bad-threads")
    proc = run_cli("batch", plan, "--threads", "-2")
    assert proc.returncode == 2 and "--threads" in proc.stderr and "'-2'" in proc.stderr
    with pytest.raises(ggufsmith.errors.ConversionError, match="threads must be a positive number"):
        batch(plan, threads=-1)
    assert not (models / "bad-threads").exists()


def test_the_plans_threads_reach_each_source_and_the_flag_wins(models, monkeypatch):
    """A plan's `threads` is each source's conversion threads (as --threads), --threads/threads= wins."""
    from ggufsmith.batch import local

    seen = []
    convert_source = local.run_source  # the real conversion, its threads recorded on the way
    monkeypatch.setattr(local, "run_source", lambda spec, **kw: seen.append(kw["threads"]) or convert_source(spec, **kw))
    plan = models / "plan-threads.yaml"
    plan.write_text("output_dir: plan-threads-out\njobs: 1\nthreads: 1\nsources:\n  - path: models/llama-b\n"
                    "    outtypes: [q8_0]\n")
    report = batch(plan)
    assert report.ok and seen == [1]
    assert Path(report.results[0].file).read_bytes() == reference(models, "llama-b", "q8_0")
    assert batch(plan, threads=2, force=True).ok and seen == [1, 2]
    plan.write_text(plan.read_text().replace("threads: 1", "threads: 0"))
    with pytest.raises(BatchError, match=r"plan-threads.yaml: `threads` must be a whole number of at least 1, got 0"):
        load_plan(plan)


@pytest.mark.slow
def test_toml_plan_names_by_pattern_and_spills_to_disk(models, monkeypatch):
    """A TOML plan with a name pattern, explicit names and preset options; early tensors of the f16 file
    wait in a spill file on disk (its memory budget set to 0) and still land in the right place."""
    from ggufsmith.converters import fanout

    monkeypatch.setattr(fanout, "SPILL_MEMORY", 0)
    plan = models / "plan.toml"
    plan.write_text("""
output_dir = "toml-out"
name_pattern = "{source}.{type}"
[[sources]]
path = "models/llama-b"
outtypes = ["f16", "q4_k_m", "q3_k_s"]
options = { pure = true, tensor_types = { attn_v = "q8_0" } }
outputs = { q3_k_s = "small.gguf" }
""")
    report = batch(plan)
    assert [Path(r.file).name for r in report.results] == ["llama-b.F16.gguf", "llama-b.Q4_K_M.gguf", "small.gguf"]
    from ggufsmith.cli.quantize import tensor_type_arg
    from ggufsmith.converters.quantize_plan import QuantizeRequest

    for r in report.results:
        request = None if r.outtype == "f16" else QuantizeRequest(r.outtype, pure=True,
                                                                   tensor_types=[tensor_type_arg("attn_v=q8_0")])
        expected = models / "reference" / f"toml-{r.outtype}.gguf"
        expected.parent.mkdir(exist_ok=True)
        ggufsmith.convert(models / "models" / "llama-b", expected, r.outtype, quantize_request=request)
        assert Path(r.file).read_bytes() == expected.read_bytes(), r.outtype


@pytest.mark.slow
def test_rerun_skips_finished_outputs_and_force_redoes_them(models):
    plan = models / "resume.yaml"
    plan.write_text("output_dir: resume\nsources:\n  - path: models/qwen-c\n    outtypes: [f16, q8_0]\n")
    first = batch(plan)
    assert [r.status for r in first.results] == ["done", "done"]
    state = json.loads((models / "resume" / STATE_FILE).read_text())["outputs"]
    for r in first.results:
        record = state[Path(r.file).name]
        assert record["size"] == Path(r.file).stat().st_size and record["sha256"] == r.sha256
    stamps = {r.file: os.stat(r.file).st_mtime_ns for r in first.results}
    second = batch(plan)
    assert [r.status for r in second.results] == ["skipped", "skipped"]
    assert {r.file: os.stat(r.file).st_mtime_ns for r in second.results} == stamps
    # a file that no longer matches its record (truncated by hand) is made again
    victim = Path(first.results[1].file)
    victim.write_bytes(victim.read_bytes()[:100])
    third = batch(plan)
    assert [r.status for r in third.results] == ["skipped", "done"]
    assert victim.read_bytes() == reference(models, "qwen-c", "q8_0")
    forced = batch(plan, force=True)
    assert [r.status for r in forced.results] == ["done", "done"]


def test_split_outputs_are_the_split_converts_and_resume_by_their_parts(models, tmp_path):
    plan = models / "split.yaml"
    plan.write_text("output_dir: split\nsources:\n  - path: models/qwen-c\n    outtypes: [f16, q8_0]\n"
                    "    split_max_tensors: 6\n    outputs: {f16: c-f16.gguf, q8_0: c-q8.gguf}\n")
    first = batch(plan)
    assert [r.status for r in first.results] == ["done", "done"], first.results
    for r, outtype, name in zip(first.results, ["f16", "q8_0"], ["c-f16", "c-q8"]):
        theirs = tmp_path / outtype
        theirs.mkdir()
        ggufsmith.convert(models / "models" / "qwen-c", theirs / f"{name}.gguf", outtype,
                          split=SplitRule(max_tensors=6))
        expected = sorted(theirs.iterdir())
        ours = sorted((models / "split").glob(f"{name}-*-of-*.gguf"))
        assert len(ours) > 1 and [p.name for p in ours] == [p.name for p in expected]
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(ours, expected))
        assert r.file == str(ours[0]) and r.size == sum(p.stat().st_size for p in ours)
    assert not (models / "split" / "c-f16.gguf").exists()
    second = batch(plan)
    assert [r.status for r in second.results] == ["skipped", "skipped"]
    # a missing part makes that output again
    next((models / "split").glob("c-q8-00002-of-*.gguf")).unlink()
    assert [r.status for r in batch(plan).results] == ["skipped", "done"]
    # other limits are other settings: made again
    plan.write_text(plan.read_text().replace("split_max_tensors: 6", "split_max_tensors: 6\n    split_max_size: 100K"))
    assert [r.status for r in batch(plan).results] == ["done", "done"]


@pytest.mark.slow
def test_a_broken_checkpoint_fails_alone_with_its_one_line_error(models, tmp_path):
    broken = models / "models" / "broken"
    if not broken.exists():
        import shutil

        shutil.copytree(models / "models" / "qwen-c", broken)
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    plan = models / "broken.yaml"
    plan.write_text("output_dir: broken-out\nsources:\n  - path: models/broken\n    outtypes: [f16, q8_0]\n"
                    "  - path: models/llama-a\n    outtypes: [q8_0]\n")
    proc = run_cli("batch", plan, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    statuses = {(Path(o["source"]).name, o["outtype"]): o["status"] for o in report["outputs"]}
    assert statuses == {("broken", "f16"): "failed", ("broken", "q8_0"): "failed", ("llama-a", "q8_0"): "done"}
    error = report["outputs"][0]["error"]
    assert "model.safetensors" in error and "\n" not in error
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ggufsmith: error: models/broken (f16, q8_0): ") and "Traceback" not in proc.stderr
    out = models / "broken-out"
    assert sorted(p.name for p in out.glob("*.gguf")) == [Path(report["outputs"][2]["file"]).name]
    assert leftovers(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sources_warnings_are_reported_once_under_its_name(models, jobs):
    """A model card whose front matter is never closed is converted with a warning: with the
    conversion in this process or in worker processes, it is printed once (not once per output
    type), labelled by the source that caused it, and is in the JSON report."""
    import shutil

    noisy = models / "models" / "noisy-card"
    if not noisy.exists():
        shutil.copytree(models / "models" / "llama-a", noisy)
        (noisy / "README.md").write_text("---\nlicense: mit\nno end to this front matter\n")
    plan = models / f"noisy-{jobs}.yaml"
    plan.write_text(f"output_dir: noisy-out-{jobs}\nsources:\n  - path: models/noisy-card\n    outtypes: [f16, q8_0]\n"
                    "  - path: models/llama-a\n    outtypes: [q8_0]\n")
    proc = run_cli("batch", plan, "--json", "--jobs", jobs)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("ggufsmith: warning: models/noisy-card: ") and "front matter" in warnings[0]
    outputs = json.loads(proc.stdout)["outputs"]
    assert [len(o["warnings"]) for o in outputs] == [1, 1, 0]


KILL_MOMENTS = ["first-temp-file", "first-output", "first-record", "second-source"]


@pytest.mark.slow
@pytest.mark.parametrize("moment", KILL_MOMENTS)
def test_sigkill_then_rerun_finishes_everything_and_redoes_only_the_unfinished(models, moment):
    out = models / f"killed-{moment}"
    plan = three_by_four(models, out.name)
    targets_done_before: dict[str, int] = {}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from ggufsmith.cli import main; sys.exit(main(sys.argv[1:]))",
                             "batch", str(plan), "--jobs", "1", "--quiet"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not _reached(out, moment):
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # every file at a target is complete (a temporary file may remain beside it, never a partial target)
    records = json.loads((out / STATE_FILE).read_text())["outputs"] if (out / STATE_FILE).exists() else {}
    for path in out.glob("*.gguf"):
        targets_done_before[path.name] = path.stat().st_mtime_ns
    rerun = batch(plan)
    assert_outputs_are_the_converts(models, rerun)
    for r in rerun.results:
        name = Path(r.file).name
        if name in records:  # recorded before the kill: not made again
            assert r.status == "skipped" and os.stat(r.file).st_mtime_ns == targets_done_before[name]
        else:
            assert r.status == "done"
    assert sum(r.status == "done" for r in rerun.results) == 12 - len(records)
    assert [p for p in out.glob("*.gguf") if p.name not in {Path(r.file).name for r in rerun.results}] == []
    assert leftovers(out) == []  # the killed run's temporary files are gone


def _reached(out: Path, moment: str) -> bool:
    if not out.exists():
        return False
    names = [p.name for p in out.iterdir()]
    if moment == "first-temp-file":
        return any(n.endswith(".tmp") and not n.startswith(STATE_FILE) for n in names)
    if moment == "first-output":
        return any(n.endswith(".gguf") for n in names)
    records = json.loads((out / STATE_FILE).read_text())["outputs"] if STATE_FILE in names else {}
    return len(records) >= (1 if moment == "first-record" else 5)


@pytest.mark.slow
def test_hf_repo_ids_come_from_the_local_cache_never_downloaded(models, tmp_path, monkeypatch):
    """A repo id is resolved by huggingface_hub in the cache (HF_HUB_CACHE); one not cached fails alone,
    saying how to fetch it, without any network access (HF_HUB_OFFLINE is not set: no download is tried)."""
    import shutil

    cache = tmp_path / "hub"
    snapshot = cache / "models--someorg--llama-a" / "snapshots" / ("0" * 40)
    shutil.copytree(models / "models" / "llama-a", snapshot)
    (cache / "models--someorg--llama-a" / "refs").mkdir()
    (cache / "models--someorg--llama-a" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    plan = models / "repo.yaml"
    plan.write_text("output_dir: repo-out\nsources:\n  - repo: someorg/llama-a\n    outtypes: [q8_0]\n"
                    "  - repo: someorg/not-cached\n    outtypes: [q8_0]\n")
    report = batch(plan)
    ok, missing = report.results
    expected = tmp_path / "expected.gguf"
    ggufsmith.convert(snapshot, expected, "q8_0")  # what `convert` makes of the cached snapshot folder
    assert ok.status == "done" and Path(ok.file).read_bytes() == expected.read_bytes()
    assert Path(ok.file).name.startswith("Llama-A-"), ok.file  # named after the repository, not the commit
    assert missing.status == "failed" and "someorg/not-cached: not in the local Hugging Face cache" in missing.error


@pytest.mark.slow
def test_ray_two_worker_cluster_makes_the_same_files(models, monkeypatch):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        report = batch(three_by_four(models, "ray-out"), ray=cluster.address)
        assert len(report.results) == 12
        assert_outputs_are_the_converts(models, report)
        again = batch(three_by_four(models, "ray-out"), ray=cluster.address)
        assert [r.status for r in again.results] == ["skipped"] * 12
        # a task reserves its --threads CPUs: more than any node has is refused, not left pending
        with pytest.raises(BatchError, match="--threads 2: no node of the Ray cluster has that many CPUs"):
            batch(three_by_four(models, "ray-out"), ray=cluster.address, threads=2, force=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


# -- plan validation: one line naming the plan file, the entry and the key ---------------------

BAD_PLANS = {
    "not-a-mapping": ("- a\n- b\n", "a mapping with a `sources` list"),
    "no-sources": ("output_dir: out\n", "`sources` must be a non-empty list"),
    "unknown-top-key": ("sorces: []\n", "the plan: unknown key 'sorces'"),
    "unknown-source-key": ("sources:\n  - path: m\n    outtypes: [f16]\n    outype: f16\n", "sources[0]: unknown key 'outype'"),
    "path-and-repo": ("sources:\n  - path: m\n    repo: a/b\n    outtypes: [f16]\n", "sources[0]: give exactly one of"),
    "no-outtypes": ("sources:\n  - path: m\n", "sources[0]: `outtypes` must be a non-empty list"),
    "unknown-outtype": ("sources:\n  - path: m\n    outtypes: [q4_k_x]\n", "sources[0]: unknown output type 'q4_k_x'"),
    "twice-the-same-type": ("sources:\n  - path: m\n    outtypes: [f16, F16]\n", "sources[0]: an output type is listed twice"),
    "bad-split-size": ("sources:\n  - path: m\n    outtypes: [f16]\n    split_max_size: 4T\n", "sources[0]: split_max_size '4T'"),
    "bad-split-tensors": ("sources:\n  - path: m\n    outtypes: [f16]\n    split_max_tensors: -2\n",
                          "sources[0]: split_max_tensors must be"),
    "bad-option": ("sources:\n  - path: m\n    outtypes: [q4_k_m]\n    options: {purr: true}\n", "sources[0].options: unknown key 'purr'"),
    "bad-tensor-type": ("sources:\n  - path: m\n    outtypes: [q4_k_m]\n    options: {tensor_types: {attn_v: q9}}\n",
                        "sources[0].options: unknown tensor type 'q9'"),
    "bad-pattern-field": ("name_pattern: '{model}-{type}'\nsources:\n  - path: m\n    outtypes: [f16]\n",
                          "sources[0]: name_pattern field {model} is unknown"),
    "bad-memory": ("max_memory: lots\nsources:\n  - path: m\n    outtypes: [f16]\n", "max_memory: 'lots' is not a memory size"),
    "bad-yaml": ("sources: [\n", "not valid YAML"),
    "bad-repo": ("sources:\n  - repo: 'not a repo'\n    outtypes: [f16]\n", "is not a Hugging Face repo id"),
}


@pytest.mark.parametrize("kind", BAD_PLANS)
def test_bad_plan_is_one_line_naming_the_plan_and_entry(tmp_path, kind):
    text, message = BAD_PLANS[kind]
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    proc = run_cli("batch", plan)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ggufsmith: error: {plan}: "), proc.stderr
    assert message in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == [plan]


def test_bad_toml_is_one_line(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("sources = [\n")
    proc = run_cli("batch", plan)
    assert proc.returncode == 1 and proc.stderr.startswith(f"ggufsmith: error: {plan}: not valid TOML")


def test_relative_paths_are_from_the_plan_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    plan_path = tmp_path / "sub" / "plan.yaml"
    plan_path.write_text("output_dir: out\nmax_memory: 1.5GiB\nsources:\n  - path: ../m\n    outtypes: [F16]\n"
                         "    imatrix: im.gguf\n  - repo: org/name\n    outtypes: q8_0\n    output_dir: /abs\n")
    plan = load_plan(plan_path)
    a, b = plan.sources
    assert a.path == tmp_path / "sub" / ".." / "m" and a.output_dir == tmp_path / "sub" / "out"
    assert a.imatrix == tmp_path / "sub" / "im.gguf" and a.outtypes == ["f16"]
    assert b.repo == "org/name" and b.outtypes == ["q8_0"] and b.output_dir == Path("/abs")
    assert plan.max_memory == int(1.5 * 2**30)
