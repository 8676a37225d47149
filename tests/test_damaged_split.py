"""Damaged split outputs and inputs (issue 19): every failure is one line naming the culprit, and
no part of a split output appears unless all do (no part, no temporary file left)."""

from __future__ import annotations

import resource
import shutil
import signal
from pathlib import Path

import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, leftovers, run_cli


@pytest.fixture(scope="session")
def split_model(tmp_path_factory) -> Path:
    """The example model as F16 parts of 5 tensors: folder/m-0000i-of-0000n.gguf."""
    folder = tmp_path_factory.mktemp("split")
    proc = run_cli("convert", EXAMPLE_MODEL, folder / "m.gguf", "--split-max-tensors", "5", "-q")
    assert proc.returncode == 0, proc.stderr
    return folder


def _parts(folder: Path) -> list[Path]:
    return sorted(folder.glob("m-*-of-*.gguf"))


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # 1 MiB: part 1 is larger, the others smaller


# Each entry: (the inputs folder, the output folder) -> (arguments, culprit named, preexec_fn).
def a_part_is_a_directory(inputs: Path, out: Path):
    (out / "tiny-00003-of-00008.gguf").mkdir()
    return ["convert", EXAMPLE_MODEL, out / "tiny.gguf", "--split-max-tensors", "5"], "tiny-00003-of-00008.gguf", None


def one_part_fails_while_the_others_complete(inputs: Path, out: Path):
    return ["convert", EXAMPLE_MODEL, out / "tiny.gguf", "--split-max-tensors", "5"], "tiny-00001-of-00008.gguf", \
        _limit_file_size


def split_of_a_part_that_is_its_own_output(inputs: Path, out: Path):
    return ["split", _parts(inputs)[0], inputs / "m", "--split-max-tensors", "5"], "m-00001-of-00008.gguf", None


def split_without_a_limit(inputs: Path, out: Path):
    return ["split", _parts(inputs)[0], out / "x"], "--split-max-tensors", None


def merge_with_a_missing_part(inputs: Path, out: Path):
    for part in _parts(inputs):
        shutil.copy(part, out)
    (out / "m-00004-of-00008.gguf").unlink()
    return ["merge", out / "m-00001-of-00008.gguf", out / "merged.gguf"], "m-00004-of-00008.gguf", None


def merge_of_a_first_part_renamed(inputs: Path, out: Path):
    shutil.copy(_parts(inputs)[0], out / "model.gguf")
    return ["merge", out / "model.gguf", out / "merged.gguf"], "model.gguf", None


def merge_of_a_single_file(inputs: Path, out: Path):
    assert run_cli("merge", _parts(inputs)[0], out / "whole.gguf", "-q").returncode == 0
    return ["merge", out / "whole.gguf", out / "merged.gguf"], "whole.gguf", None


def keep_split_with_a_split_limit(inputs: Path, out: Path):
    return ["quantize", _parts(inputs)[0], out / "q.gguf", "Q8_0", "--keep-split", "--split-max-tensors", "3"], \
        "--keep-split", None


DAMAGE = [a_part_is_a_directory, one_part_fails_while_the_others_complete, split_of_a_part_that_is_its_own_output,
          split_without_a_limit, merge_with_a_missing_part, merge_of_a_first_part_renamed, merge_of_a_single_file,
          keep_split_with_a_split_limit]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
def test_damaged_split(split_model, tmp_path, damage):
    inputs = tmp_path / "inputs"
    shutil.copytree(split_model, inputs)
    before = {p.name: p.read_bytes() for p in inputs.iterdir()}
    out = tmp_path / "out"
    out.mkdir()
    args, culprit, preexec_fn = damage(inputs, out)
    existing = {p.name for p in out.iterdir()}
    proc = run_cli(*args, preexec_fn=preexec_fn)
    assert_clean_failure(proc, culprit, None)
    assert {p.name for p in out.iterdir()} == existing, "a part was written"
    assert leftovers(out) == [] and leftovers(inputs) == []
    assert {p.name: p.read_bytes() for p in inputs.iterdir()} == before, "an input was changed"


def test_too_many_parts_for_the_open_file_limit_is_one_line(tmp_path):
    def limit_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "tiny.gguf", "--split-max-tensors", "1",
                   preexec_fn=limit_open_files)
    assert_clean_failure(proc, "ulimit -n", None)
    assert list(tmp_path.iterdir()) == []


def test_the_open_file_limit_is_raised_when_it_can_be(tmp_path):
    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (60, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = run_cli("convert", EXAMPLE_MODEL, tmp_path / "tiny.gguf", "--split-max-tensors", "1", "-q",
                   preexec_fn=low_soft_limit)
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("tiny-*-of-00039.gguf"))) == 39
