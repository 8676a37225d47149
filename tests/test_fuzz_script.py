"""scripts/fuzz.py's harness: it must tell our errors from foreign exceptions, catch a hang with its
timeout and go on, survive a worker that dies, save a reproducer of each distinct finding, and
build seeds (scripts/fuzz_cases.py) that every real reader reads cleanly (or a long run fuzzes nothing but its first check)."""

from __future__ import annotations

import os
import random
import time

import pytest

from ggufsmith.errors import GGUFError
from scripts import fuzz
from scripts.fuzz_cases import TARGETS, Target


def _toy_reader(path):
    """Behaves by the case's length: our error, a foreign exception, a hang, a crash, or fine."""
    kind = path.stat().st_size % 5
    if kind == 0:
        raise GGUFError(f"{path}: bad")
    if kind == 1:
        raise KeyError("foreign")
    if kind == 2:
        time.sleep(30)
    if kind == 3:
        os._exit(3)


@pytest.fixture
def toy_target(monkeypatch):
    monkeypatch.setitem(TARGETS, "toy", Target("toy.bin", lambda: [b"0123456789" * 3], _toy_reader))
    return "toy"


def test_the_harness_counts_every_outcome_and_saves_reproducers(toy_target, tmp_path):
    tally = fuzz.fuzz(toy_target, 25, random.Random(1), timeout=1.0, memory_limit=2**30, findings=tmp_path)
    counts = tally.counts
    assert tally.cases == 25 == sum(counts.values())
    assert all(counts[k] > 0 for k in ("ok", "ours", "foreign", "hang", "crash")), counts
    found = sorted(tally.distinct_foreign)
    assert found[1:] == ["crash", "hang"] and found[0].startswith("KeyError at test_fuzz_script.py:"), found
    saved = sorted(p.name for p in (tmp_path / "toy").iterdir())
    assert len([n for n in saved if n.endswith(".bin")]) == 3, saved
    reproducer = next(p for p in (tmp_path / "toy").iterdir() if p.name.startswith("KeyError") and p.suffix == ".bin")
    assert reproducer.stat().st_size % 5 == 1  # the very case that raised it


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_reads_cleanly(name, tmp_path):
    target = TARGETS[name]
    folder = tmp_path / name
    folder.mkdir()
    for file_name, text in target.companions.items():
        (folder / file_name).write_text(text)
    for seed in target.seeds():
        (folder / target.file_name).write_bytes(seed)
        target.read(folder / target.file_name)
