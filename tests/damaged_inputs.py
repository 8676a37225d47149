"""The harness of the damaged-input catalogue: run a ggufsmith command on a broken input and check
what a user would see. Every catalogue entry (tests/test_damaged_*.py) asserts the same contract:

  - a non-zero exit status;
  - exactly one line on stderr, starting "ggufsmith: error:", naming the culprit (file, tensor or
    key) — no traceback, no warning lines around it;
  - nothing at the target path (or, when a previous file was there, that file unchanged);
  - no temporary file left in the target's folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_MODEL = REPO / "examples" / "tiny-llama"


def copy_example(tmp_path: Path, name: str = "model") -> Path:
    """A writable copy of the example model (2.5 MB) to damage."""
    target = tmp_path / name
    shutil.copytree(EXAMPLE_MODEL, target)
    return target


CLI_CODE = "import sys; from ggufsmith.cli import main; sys.exit(main(sys.argv[1:]))"


def run_cli(*args: str | Path, timeout: float = 300, cwd: Path = REPO, preexec_fn=None) -> subprocess.CompletedProcess:
    """`ggufsmith ARGS` in a fresh interpreter, run from this checkout's sources; `preexec_fn` runs
    in the child before it starts (to set a resource limit, say)."""
    return subprocess.run([sys.executable, "-c", CLI_CODE, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)


def leftovers(folder: Path) -> list[Path]:
    """Temporary files a ggufsmith writer may have left in `folder`."""
    return [p for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name]


def assert_clean_failure(proc: subprocess.CompletedProcess, culprit: str, target: Path | None,
                         previous: bytes | None = None) -> str:
    """The contract above; `culprit` must appear in the error line. Returns that line."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode not in (0, None), f"exit 0 on a damaged input; stderr: {proc.stderr!r}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{proc.stderr}"
    line = lines[0]
    assert line.startswith("ggufsmith: error:"), line
    assert "internal error" not in line, line
    assert culprit in line, f"{culprit!r} not named in: {line}"
    if target is not None:
        if previous is None:
            assert not target.exists(), f"{target} was written"
        else:
            assert target.read_bytes() == previous, f"{target} was changed"
        assert leftovers(target.parent) == [], f"temporary files left: {leftovers(target.parent)}"
    return line


# Ways to damage a copy of a model folder, shared by the catalogue files.

def edit_json(path: Path, edit=None, **changes) -> None:
    """Rewrite the JSON file at `path`: with `edit`, to edit(its value); else with `changes` merged
    into its top-level object."""
    value = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(edit(value) if edit is not None else value | changes), encoding="utf-8")


def edit_config(model_dir: Path, **changes) -> None:
    """config.json with `changes` merged in."""
    edit_json(model_dir / "config.json", **changes)


def edit_safetensors(model_dir: Path, edit, name: str = "model.safetensors") -> None:
    """Load the checkpoint's tensors, let edit(dict) change them in place, save them back."""
    from safetensors.numpy import load_file, save_file

    path = model_dir / name
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def assert_convert_refused(original: Path, tmp_path: Path, damage, culprit: str,
                           options: tuple[str, ...] = ("--outtype", "f32")) -> str:
    """Copy the folder `original`, apply damage(copy) and assert that `ggufsmith convert` refuses the
    copy by the contract above; returns the error line."""
    model_dir = tmp_path / original.name
    shutil.copytree(original, model_dir)
    damage(model_dir)
    target = tmp_path / "out.gguf"
    return assert_clean_failure(run_cli("convert", model_dir, target, *options), culprit, target)
