"""Killed runs: after SIGKILL or SIGTERM at any moment, the target is absent or the complete previous
file, and the next run into the same folder leaves no temporary file of the killed one behind and
writes the right file. A live run's temporary file is never taken for a dead one's.

The conversions killed are of a 72 MB variant of the example model (its 4 layers repeated 192
times), so that writing lasts about a second and the signals land mid-write, at moments drawn from
a seeded generator (the fraction of the file written, in the test id).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggufsmith.gguf_writer import output
from tests.damaged_inputs import CLI_CODE, EXAMPLE_MODEL, REPO, leftovers, run_cli

LAYERS = 192
SEED = 20261124


@pytest.fixture(scope="session")
def big_model(tmp_path_factory) -> Path:
    """The example model with its layers repeated to LAYERS: same tokenizer, 72 MB of bf16 weights."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("big") / "model"
    shutil.copytree(EXAMPLE_MODEL, folder)
    state = load_file(EXAMPLE_MODEL / "model.safetensors")
    config = json.loads((EXAMPLE_MODEL / "config.json").read_text())
    layer = re.compile(r"model\.layers\.(\d+)\.(.+)")
    repeated = {name: t for name, t in state.items() if not layer.match(name)}
    for i in range(LAYERS):
        for name, t in state.items():
            m = layer.match(name)
            if m and int(m.group(1)) == i % config["num_hidden_layers"]:
                repeated[f"model.layers.{i}.{m.group(2)}"] = t.clone()
    save_file(repeated, folder / "model.safetensors", metadata={"format": "pt"})
    config["num_hidden_layers"] = LAYERS
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def expected(tmp_path_factory, big_model) -> dict[str, bytes]:
    """Complete files: the big model in f16 (its size tells how far a killed run got), and the
    example in f16 (the previous file) and q8_0 (what the next run writes)."""
    folder = tmp_path_factory.mktemp("expected")
    files = {}
    for name, src, outtype in (("big", big_model, "f16"), ("previous", EXAMPLE_MODEL, "f16"), ("next", EXAMPLE_MODEL, "q8_0")):
        proc = run_cli("convert", src, folder / f"{name}.gguf", "--outtype", outtype, "--quiet")
        assert proc.returncode == 0, proc.stderr
        files[name] = (folder / f"{name}.gguf").read_bytes()
    return files


def _same(path: Path, data: bytes) -> bool:
    """Whether the file holds exactly `data` (a plain bool: pytest would diff 72 MB of bytes)."""
    return path.read_bytes() == data


def _temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if output.is_temp_name(p.name)]


def _start(src: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLI_CODE, "convert", str(src), str(out), "--outtype", "f16"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def _wait_until_written(proc: subprocess.Popen, folder: Path, nbytes: int, timeout: float = 60) -> bool:
    """Wait until the run's temporary file holds `nbytes`; False if the run ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for path in _temp_files(folder):
            try:
                if path.stat().st_size >= nbytes:
                    return True
            except FileNotFoundError:
                pass
        time.sleep(0.002)
    return False


def _moments() -> list[tuple[str, float]]:
    rng = random.Random(SEED)
    cases = []
    for sig in ("SIGKILL", "SIGTERM"):
        for previous in ("no-previous", "previous"):
            cases.append((sig, previous, "starting", round(rng.uniform(0.05, 0.8), 2)))  # seconds after start
            cases += [(sig, previous, "writing", round(rng.uniform(0.0, 0.95), 2)) for _ in range(2)]  # fraction
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("sig,previous,phase,when", _moments(), ids=lambda v: str(v))
def test_kill_mid_conversion(sig, previous, phase, when, tmp_path, big_model, expected):
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "model.gguf"
    if previous == "previous":
        target.write_bytes(expected["previous"])
    proc = _start(big_model, target)
    if phase == "starting":
        time.sleep(when)
    else:
        assert _wait_until_written(proc, folder, int(when * len(expected["big"]))), proc.communicate()
    if proc.poll() is not None:
        # On a fast machine the whole conversion can end before a "starting" moment: then the
        # target must be the new file, whole, and nothing may be left behind.
        assert phase == "starting" and proc.returncode == 0, proc.communicate()
        assert _same(target, expected["big"]) and _temp_files(folder) == []
        return
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate(timeout=60)
    killed_mid_write = phase == "writing"
    if proc.returncode == 0:  # finished between the check above and the signal
        assert _same(target, expected["big"]) and _temp_files(folder) == []
        return

    # The target: absent, or the previous file, whole — or, when the signal came after the rename
    # that completes the run, the new file, whole. Never anything partial.
    complete = {expected["big"]} | ({expected["previous"]} if previous == "previous" else set())
    if previous == "previous" or target.exists():
        assert any(_same(target, whole) for whole in complete), "the target is neither the previous nor the new file"
    if sig == "SIGTERM":
        assert proc.returncode in (143, -signal.SIGTERM), stderr  # -15: killed before Python set its handler
        if killed_mid_write:
            assert proc.returncode == 143 and stderr.splitlines() == ["ggufsmith: stopped by SIGTERM"], stderr
        assert _temp_files(folder) == [], "SIGTERM left a temporary file"
    else:
        assert proc.returncode == -signal.SIGKILL
        if killed_mid_write:
            assert len(_temp_files(folder)) == 1  # SIGKILL cannot be cleaned up after: the debris is there

    # The next run into the folder removes the killed run's file and writes its own.
    proc = run_cli("convert", EXAMPLE_MODEL, target, "--outtype", "q8_0", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert _same(target, expected["next"]), "the next run did not write its own file"
    assert leftovers(folder) == [], leftovers(folder)


# -- live and dead writers, made to wait --------------------------------------------------------

# A writer that writes its header and first tensor, then waits for a line on stdin before finishing.
_PAUSED_WRITER = """
import sys
import numpy as np
from ggufsmith.constants import GGMLType
from ggufsmith.gguf_writer import GGUFWriter, Metadata
md = Metadata()
md.add_string("general.architecture", "llama")
with GGUFWriter(sys.argv[1], md) as w:
    w.add_tensor("a", (64, 64), GGMLType.F32)
    w.add_tensor("b", (64, 64), GGMLType.F32)
    w.write_tensor("a", np.ones((64, 64), np.float32))
    print("writing", flush=True)
    sys.stdin.readline()
    w.write_tensor("b", np.ones((64, 64), np.float32))
"""


def _paused_writer(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_WRITER, str(target)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == "writing\n"
    return proc


def test_a_live_runs_temporary_file_is_never_removed(tmp_path):
    live = _paused_writer(tmp_path / "live.gguf")
    try:
        [temp] = _temp_files(tmp_path)
        proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "other.gguf", "--outtype", "f16", "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert _temp_files(tmp_path) == [temp]
        live.stdin.write("go on\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
    from ggufsmith.gguf_writer.reader import GGUFReader

    with GGUFReader(tmp_path / "live.gguf") as reader:
        assert [t.name for t in reader.tensors] == ["a", "b"]
    assert _temp_files(tmp_path) == []


def test_a_dead_runs_temporary_file_is_removed_by_the_next_run(tmp_path):
    dead = _paused_writer(tmp_path / "dead.gguf")
    dead.kill()
    dead.wait(timeout=60)
    [temp] = _temp_files(tmp_path)
    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "other.gguf", "--outtype", "f16", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert not temp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf"]


def test_files_that_only_look_like_temporary_files_are_kept(tmp_path):
    """Only regular files named exactly as ggufsmith names them, and unlocked, are removed."""
    kept = [".model.gguf.tmp", ".model.gguf.ggufsmith-1234567.tmp", "model.gguf.ggufsmith-12345678.tmp",
            ".model.gguf.ggufsmith-1234567g.tmp", ".model.gguf.ggufsmith-12345678.tmp.bak"]
    for name in kept:
        (tmp_path / name).write_bytes(b"x")
    os.mkfifo(tmp_path / ".fifo.gguf.ggufsmith-12345678.tmp")
    (tmp_path / ".link.gguf.ggufsmith-12345678.tmp").symlink_to(tmp_path / kept[0])
    dead = tmp_path / ".model.gguf.ggufsmith-0123abcd.tmp"
    dead.write_bytes(b"x")
    assert output.remove_dead_temp_files(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + [".fifo.gguf.ggufsmith-12345678.tmp",
                                                                          ".link.gguf.ggufsmith-12345678.tmp"])


def test_a_file_cleaned_away_before_its_writer_locks_it_is_made_again(tmp_path, monkeypatch):
    """The window between creating a temporary file and locking it: another run that cleans the
    folder right then sees an unlocked file and deletes it. The writer notices and makes another."""
    real_lock = output._lock
    cleaned: list[Path] = []

    def lock_after_another_run_cleaned(fd, blocking):
        if blocking and not cleaned:  # the writer's first lock; the cleaning run's locks do not block
            monkeypatch.setattr(output, "_lock", real_lock)
            cleaned.extend(output.remove_dead_temp_files(tmp_path))
            monkeypatch.setattr(output, "_lock", lock_after_another_run_cleaned)
        return real_lock(fd, blocking)

    monkeypatch.setattr(output, "_lock", lock_after_another_run_cleaned)
    temp = output.TempFile(output.check_target(tmp_path / "out.gguf"))
    try:
        assert len(cleaned) == 1 and cleaned[0] != temp.path
        assert _temp_files(tmp_path) == [temp.path]
        monkeypatch.setattr(output, "_lock", real_lock)
        assert output.remove_dead_temp_files(tmp_path) == []  # locked: live
    finally:
        temp.discard()
    assert list(tmp_path.iterdir()) == []
