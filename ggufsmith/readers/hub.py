"""A model given by its Hugging Face repository id ("Org/Model") instead of a folder.

The id is looked up in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME, as huggingface_hub
lays it out: models--Org--Model/snapshots/<commit>/), through huggingface_hub itself, so that a
model already downloaded by transformers or `hf download` converts without a copy. Nothing is
fetched unless asked (`download`): a conversion never touches the network by surprise. An existing
folder always wins over an id of the same spelling.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ggufsmith.errors import ConversionError

# owner/name as the Hub spells them: letters, digits, '-', '_', '.'; one slash.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")

# Files a conversion reads; with --download only these are fetched (not .gguf, ONNX, TF, Flax ...).
_WANTED = ["*.json", "*.safetensors", "*.bin", "*.pth", "*.model", "*.tiktoken", "*.txt", "*.md", "LICENSE*"]


def looks_like_repo_id(src: str | Path) -> bool:
    return isinstance(src, str) and not Path(src).exists() and _REPO_ID.fullmatch(src) is not None


def resolve_source(src: str | Path, *, download: bool = False, files: list[str] | None = None) -> tuple[Path, str | None]:
    """(the model folder, the repository id or None): `src` itself when it is not an id. `files`:
    the patterns of the files a download fetches (default: those a conversion reads)."""
    if not looks_like_repo_id(src):
        return Path(src), None
    return snapshot_folder(str(src), download=download, files=files), str(src)


def repo_id_of_cached_folder(model_dir: Path) -> str | None:
    """"Org/Model" when `model_dir` is a snapshot in a Hugging Face cache (models--Org--Model/
    snapshots/<commit>), so that a model found there by path, or by a batch plan's repo id, is named
    after its repository rather than after a commit hash; else None. The Hub forbids "--" in ids,
    so the folder name splits back unambiguously."""
    model_dir = Path(model_dir).resolve()
    repo_folder = model_dir.parent.parent
    if model_dir.parent.name != "snapshots" or not repo_folder.name.startswith("models--"):
        return None
    repo_id = "/".join(repo_folder.name[len("models--"):].split("--"))
    return repo_id if _REPO_ID.fullmatch(repo_id) or "/" not in repo_id else None


def snapshot_folder(repo_id: str, revision: str | None = None, *, download: bool = False,
                    files: list[str] | None = None) -> Path:
    """The folder of `repo_id`'s snapshot (at `revision`, default the main branch) in the local
    Hugging Face cache, fetched into it first only with `download` (the files matching `files`,
    default: those a conversion reads); ConversionError naming the id."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ConversionError(f"{repo_id}: no such folder; to read it as a Hugging Face repository id, "
                              "install huggingface_hub") from None
    cache = _cache_dir()
    try:
        if not download:
            return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=files or _WANTED))
    except LocalEntryNotFoundError:
        if download:
            raise ConversionError(f"{repo_id}: cannot download it (no connection to the Hugging Face Hub?)") from None
        raise ConversionError(f"{repo_id}: not in the local Hugging Face cache ({cache}), and no such folder; "
                              "add --download to fetch it") from None
    except HfHubHTTPError as e:
        raise ConversionError(f"{repo_id}: the Hugging Face Hub refused it ({_first_line(e)})") from None
    except ValueError as e:  # huggingface_hub's check of the id's spelling
        raise ConversionError(f"{repo_id}: not a folder nor a valid repository id ({_first_line(e)})") from None


def _cache_dir() -> str:
    """HF_HUB_CACHE as set now (huggingface_hub reads it once, when first imported), else its default."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
