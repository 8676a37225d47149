"""The damaged-input catalogue of Meta-layout checkpoints (readers/meta.py): each entry damages a
copy of a small Meta folder (two ranks, tests/meta_models.py) in one way and runs `ggufsmith
convert` on it, which must fail with the contract of tests/damaged_inputs.py."""

from __future__ import annotations

import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.damaged_inputs import assert_clean_failure, edit_json, run_cli
from tests.meta_models import LAYOUTS, make_hf_llama, write_meta_folder

torch = pytest.importorskip("torch")

MARKER = "PWNED"  # what a hostile pickle's payload would create


class _Payload:
    """A pickled object whose unpickling would run a shell command: creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _edit_rank(meta: Path, rank: int, edit: Callable[[dict], None]) -> None:
    path = meta / f"consolidated.{rank:02d}.pth"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def params_json_missing(meta: Path) -> str:
    (meta / "params.json").unlink()
    return "params.json not found"


def params_json_not_json(meta: Path) -> str:
    (meta / "params.json").write_text('{"dim": 128, ')
    return "params.json"


def params_of_another_model(meta: Path) -> str:
    edit_json(meta / "params.json", multiple_of=256)  # a feed-forward width that is not the tensors'
    return "params.json: multiple_of"


def params_dim_not_the_tensors(meta: Path) -> str:
    edit_json(meta / "params.json", dim=256)
    return "params.json: dim is 256"


def params_mixture_of_experts(meta: Path) -> str:
    edit_json(meta / "params.json", moe={"num_experts": 8, "num_experts_per_tok": 2})
    return "params.json: \"moe\""


def params_scaled_rope_of_an_unknown_shape(meta: Path) -> str:
    """use_scaled_rope without rope_scaling_factor on a shape no Meta release has: the factor (8 or 32)
    cannot be told, so it is not guessed."""
    edit_json(meta / "params.json", use_scaled_rope=True)
    return "params.json: use_scaled_rope is set without rope_scaling_factor, and dim 128 with n_heads 4"


def params_rope_scaling_factor_not_a_number(meta: Path) -> str:
    edit_json(meta / "params.json", use_scaled_rope=True, rope_scaling_factor="32")
    return "params.json: rope_scaling_factor"


def shard_shape_mismatch(meta: Path) -> str:
    def widen(state: dict) -> None:
        wq = state["layers.1.attention.wq.weight"]
        state["layers.1.attention.wq.weight"] = torch.cat([wq, wq[:, :8]], dim=1)

    _edit_rank(meta, 1, widen)
    return "consolidated.01.pth: tensor 'layers.1.attention.wq.weight' has shape (64, 136)"


def tensor_missing_from_a_rank(meta: Path) -> str:
    _edit_rank(meta, 1, lambda state: state.pop("layers.0.feed_forward.w2.weight"))
    return "'layers.0.feed_forward.w2.weight' is not in consolidated.01.pth"


def rank_file_missing(meta: Path) -> str:
    shutil.copy(meta / "consolidated.01.pth", meta / "consolidated.02.pth")
    (meta / "consolidated.01.pth").unlink()
    return "consolidated.01.pth is missing"


def unknown_tensor(meta: Path) -> str:
    def add(state: dict) -> None:
        state["layers.0.attention.gate.weight"] = torch.zeros(4)

    _edit_rank(meta, 0, add)
    _edit_rank(meta, 1, add)
    return "'layers.0.attention.gate.weight'"


def pickle_not_weights_only(meta: Path) -> str:
    """A consolidated.00.pth whose pickle would run a command: torch.load(weights_only=True) refuses it."""
    path = meta / "consolidated.00.pth"
    hostile = pickle.dumps({"norm.weight": _Payload(meta / MARKER)}, protocol=2)
    rebuilt = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as original, zipfile.ZipFile(rebuilt, "w") as out:
        for info in original.infolist():
            data = original.read(info)
            out.writestr(info, hostile if info.filename.endswith("/data.pkl") else data)
    rebuilt.replace(path)
    return "consolidated.00.pth: torch.load(weights_only=True) refuses its pickle"


def _tiktoken_file(meta: Path, lines: list[bytes]) -> None:
    """A tiktoken tokenizer.model (Llama 3's) of the 256 bytes, then `lines`."""
    import base64

    head = [base64.b64encode(bytes([b])) + b" %d" % b for b in range(256)]
    (meta / "tokenizer.model").write_bytes(b"\n".join(head + lines) + b"\n")


def tiktoken_rank_gap(meta: Path) -> str:
    _tiktoken_file(meta, [b"aGk= 257"])  # "hi" at 257: rank 256 is missing
    return "tokenizer.model: line 257 has rank 257, expected 256"


def tiktoken_not_base64(meta: Path) -> str:
    _tiktoken_file(meta, [b"a=Gk 256"])
    return "tokenizer.model: line 257"


def tiktoken_token_twice(meta: Path) -> str:
    _tiktoken_file(meta, [b"YQ== 256"])  # "a" again
    return "tokenizer.model: line 257: token b'a' is empty or listed twice"


DAMAGE = [params_json_missing, params_json_not_json, params_of_another_model, params_dim_not_the_tensors,
          params_mixture_of_experts, params_scaled_rope_of_an_unknown_shape,
          params_rope_scaling_factor_not_a_number, shard_shape_mismatch, tensor_missing_from_a_rank, rank_file_missing,
          unknown_tensor, pickle_not_weights_only, tiktoken_rank_gap, tiktoken_not_base64, tiktoken_token_twice]


@pytest.fixture(scope="session")
def meta_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("meta-damaged")
    params, config_changes, embedding_axis = LAYOUTS["llama2"]
    hf_dir = make_hf_llama(root / "hf", config_changes)
    return write_meta_folder(root / "meta", hf_dir, params, embedding_axis)


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
def test_damaged_meta_checkpoint_fails_in_one_line(meta_folder, damage, tmp_path):
    meta = tmp_path / "meta"
    shutil.copytree(meta_folder, meta)
    culprit = damage(meta)
    target = tmp_path / "out.gguf"
    assert_clean_failure(run_cli("convert", meta, target), culprit, target)
    assert not (meta / MARKER).exists()


def test_the_undamaged_folder_converts(meta_folder, tmp_path):
    """The catalogue's failures come from the damage, not from the folder."""
    proc = run_cli("convert", meta_folder, tmp_path / "out.gguf")
    assert proc.returncode == 0, proc.stderr
