"""Damaged output paths, for `convert` and `quantize`: a target that is an input (under its own name,
a symbolic link, a hard link), a directory, a device node, a FIFO, a folder that is read-only or
missing, a full disk, a file size limit; each with and without --force. Every refusal and failure
is one line naming the output, exit status 1, the target (whatever it was) and the inputs
untouched, no temporary file left. With --force a device or FIFO is written into, never replaced.

Read-only folders and full disks are small tmpfs mounts, which needs root (CI runs as root); the
file size limit is RLIMIT_FSIZE in the child (works for anyone).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.damaged_inputs import EXAMPLE_MODEL, assert_clean_failure, copy_example, leftovers, run_cli

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="session")
def example_gguf(tmp_path_factory) -> Path:
    """The example model as an F16 GGUF: the input of `quantize`."""
    path = tmp_path_factory.mktemp("example") / "tiny-llama-f16.gguf"
    proc = run_cli("convert", EXAMPLE_MODEL, path, "--outtype", "f16", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return path


@dataclass
class Run:
    """One command on one damaged target."""

    command: str
    tmp_path: Path
    example_gguf: Path
    out: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    preexec_fn: object = None
    mounts: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.command == "convert":
            self.src = copy_example(self.tmp_path)
            self.input_file = self.src / "model.safetensors"
        else:
            self.src = self.input_file = self.tmp_path / "in.gguf"
            shutil.copyfile(self.example_gguf, self.src)

    def args(self, force: bool, out: Path | None = None) -> list:
        out = out or self.out
        args = ["convert", self.src, out, "--outtype", "f16"] if self.command == "convert" else \
            ["quantize", self.src, out, "Q8_0"]
        return args + self.extra_args + (["--force"] if force else [])

    def mount(self, name: str, *options: str) -> Path:
        point = self.tmp_path / name
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(point)], check=True)
        self.mounts.append(point)
        return point

    def unmount(self) -> None:
        for point in reversed(self.mounts):
            subprocess.run(["umount", str(point)], check=False)


def _limit_file_size() -> None:
    # Past the limit the kernel sends SIGXFSZ, which kills by default; ignored, the write fails
    # with EFBIG instead (Python ignores it too, but not before it starts).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # 1 MiB; the outputs are larger


# -- the catalogue: each builds its damaged target in `run` ------------------------------------

def output_is_the_input(run: Run) -> None:
    run.out = run.input_file


def output_is_a_symlink_to_the_input(run: Run) -> None:
    run.out = run.tmp_path / "out.gguf"
    run.out.symlink_to(run.input_file)


def output_is_a_hard_link_to_the_input(run: Run) -> None:
    run.out = run.tmp_path / "out.gguf"
    os.link(run.input_file, run.out)


def output_is_the_importance_matrix(run: Run) -> None:
    from ggufsmith.quantize.imatrix import write_imatrix

    run.out = run.tmp_path / "imatrix.gguf"
    write_imatrix(run.out, {"blk.0.attn_q.weight": (np.ones(128, np.float32), np.ones(1, np.float32))}, ["x"], 1, 512)
    run.extra_args = ["--imatrix", str(run.out)]


def output_is_a_directory(run: Run) -> None:
    run.out = run.tmp_path / "out.gguf"
    run.out.mkdir()
    (run.out / "keep.txt").write_text("mine")
    if run.command == "convert":  # convert names a file in a folder it is given: that name is the directory
        run.out = run.tmp_path / "models"
        run.out.mkdir()
        (run.out / "Model-1.3M-F16.gguf").mkdir()
        (run.out / "Model-1.3M-F16.gguf" / "keep.txt").write_text("mine")


def output_is_a_device_node(run: Run) -> None:
    run.out = _device_node(run.tmp_path)


def output_is_a_fifo(run: Run) -> None:
    run.out = run.tmp_path / "out.gguf"
    os.mkfifo(run.out)


def output_folder_is_read_only(run: Run) -> None:
    if IS_ROOT:  # root writes through permission bits: a read-only file system stops it
        run.out = run.mount("readonly", "ro", "size=1m") / "out.gguf"
    else:
        folder = run.tmp_path / "readonly"
        folder.mkdir()
        folder.chmod(0o555)
        run.out = folder / "out.gguf"


def output_folder_is_missing(run: Run) -> None:
    run.out = run.tmp_path / "no-such-folder" / "out.gguf"


def disk_is_full(run: Run) -> None:
    if not IS_ROOT:
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    run.out = run.mount("small", "size=512k") / "out.gguf"


def disk_is_full_with_a_previous_file(run: Run) -> None:
    disk_is_full(run)
    run.out.write_bytes(b"previous complete file" * 1000)


def file_is_too_large(run: Run) -> None:
    run.out = run.tmp_path / "out.gguf"
    run.preexec_fn = _limit_file_size


def file_is_too_large_with_a_previous_file(run: Run) -> None:
    file_is_too_large(run)
    run.out.write_bytes(b"previous complete file")


REFUSED_EVEN_WITH_FORCE = [output_is_the_input, output_is_a_symlink_to_the_input, output_is_a_hard_link_to_the_input,
                           output_is_a_directory, output_folder_is_read_only, output_folder_is_missing, disk_is_full,
                           disk_is_full_with_a_previous_file, file_is_too_large, file_is_too_large_with_a_previous_file]
REFUSED_WITHOUT_FORCE = [output_is_a_device_node, output_is_a_fifo]  # --force writes into them
CASES = [(damage, command, False) for damage in REFUSED_EVEN_WITH_FORCE + REFUSED_WITHOUT_FORCE
         for command in ("convert", "quantize")]
CASES += [(damage, command, True) for damage in REFUSED_EVEN_WITH_FORCE for command in ("convert", "quantize")]
CASES += [(output_is_the_importance_matrix, "quantize", force) for force in (False, True)]


def _device_node(folder: Path) -> Path:
    """A character device to write to: a fresh node like /dev/null (root), else /dev/null itself."""
    if not IS_ROOT:
        return Path("/dev/null")
    node = folder / "null-device"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return node


def _snapshot(path: Path):
    """What is at `path`, to compare before and after: kind and content."""
    if not os.path.lexists(path):
        return None
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(mode):
        return ("directory", sorted((p.name, _snapshot(p)) for p in path.iterdir()))
    if stat.S_ISREG(mode):
        return ("file", path.read_bytes())
    return ("special", stat.S_IFMT(mode), os.lstat(path).st_rdev)


def _existing_folder(path: Path) -> Path:
    while not path.is_dir():
        path = path.parent
    return path


@pytest.mark.parametrize("damage,command,force", [
    pytest.param(*case, id=f"{case[1]}-{case[0].__name__}{'-force' if case[2] else ''}") for case in CASES])
def test_damaged_output(damage, command, force, tmp_path, example_gguf):
    run = Run(command, tmp_path, example_gguf)
    try:
        damage(run)
        input_before = run.input_file.read_bytes()
        target_before = _snapshot(run.out)
        proc = run_cli(*run.args(force), preexec_fn=run.preexec_fn, timeout=120)
        assert_clean_failure(proc, str(run.out), target=None)
        assert _snapshot(run.out) == target_before, f"{run.out} was changed"
        assert run.input_file.read_bytes() == input_before
        assert leftovers(_existing_folder(run.out.parent)) == []
        assert leftovers(run.tmp_path) == []
    finally:
        run.unmount()


@pytest.mark.parametrize("command", ["convert", "quantize"])
@pytest.mark.parametrize("damage", REFUSED_WITHOUT_FORCE, ids=lambda f: f.__name__)
def test_force_writes_into_a_device_or_fifo(damage, command, tmp_path, example_gguf):
    run = Run(command, tmp_path, example_gguf)
    reference = tmp_path / "reference.gguf"
    damage(run)
    proc = run_cli(*run.args(force=False, out=reference), "--quiet")
    assert proc.returncode == 0, proc.stderr
    kind_before = _snapshot(run.out)
    received = _read_fifo_in_background(run.out) if stat.S_ISFIFO(os.stat(run.out).st_mode) else None
    proc = run_cli(*run.args(force=True), "--quiet", timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _snapshot(run.out) == kind_before, "the device or FIFO was replaced"
    if received is not None:
        received.join(timeout=60)
        assert received.data == reference.read_bytes()  # the whole file, in order, through the pipe
    assert leftovers(run.out.parent) == []


class _FifoReader(threading.Thread):
    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, b""

    def run(self) -> None:
        with open(self.path, "rb") as f:  # blocks until the writer opens its end
            self.data = f.read()


def _read_fifo_in_background(path: Path) -> _FifoReader:
    reader = _FifoReader(path)
    reader.start()
    return reader


def test_write_errors_name_the_output_through_the_library(tmp_path):
    """The library raises the same one-line error (no CLI involved): a full device named."""
    import ggufsmith
    from ggufsmith.errors import OutputError

    with pytest.raises(OutputError, match="/dev/full: no space left on the device"):
        ggufsmith.convert(EXAMPLE_MODEL, "/dev/full", "f16", force=True)
    with pytest.raises(OutputError, match="with --force ggufsmith writes into it"):
        ggufsmith.convert(EXAMPLE_MODEL, "/dev/full", "f16")


# `imatrix` checks its target before running the model: the same refusals, in a second.
IMATRIX_TARGETS = {
    "output_is_the_calibration_text": lambda model, text: text,
    "output_is_a_file_of_the_model_folder": lambda model, text: model / "tokenizer.model",
    "output_is_a_fifo": lambda model, text: _fifo(text.parent / "out.gguf"),
    "output_folder_is_missing": lambda model, text: text.parent / "missing" / "out.gguf",
}


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("damage", list(IMATRIX_TARGETS))
def test_imatrix_damaged_output(damage, tmp_path):
    model = copy_example(tmp_path)
    text = tmp_path / "calibration.txt"
    text.write_text("The llama reads the weights. " * 20)
    out = IMATRIX_TARGETS[damage](model, text)
    before = {p: _snapshot(p) for p in (out, text, *model.iterdir())}
    proc = run_cli("imatrix", model, text, out, "--chunk-size", "16", timeout=120)
    assert_clean_failure(proc, str(out), target=None)
    assert {p: _snapshot(p) for p in before} == before
    assert leftovers(tmp_path) == [] and leftovers(model) == []
