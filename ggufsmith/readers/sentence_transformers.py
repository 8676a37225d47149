"""A sentence-transformers model folder: `modules.json` and the Pooling module's `config.json`.

sentence-transformers saves a model as a chain of modules: the transformer (the HF checkpoint,
usually at the folder's root), then a Pooling module (one vector per text from the per-token
hidden states), then optional ones such as Normalize (L2) or Dense (a linear projection).
llama.cpp has one pooling setting per model file ({arch}.pooling_type: mean, CLS token or last
token) and normalizes at run time (llama-embedding's --embd-normalize, on by default); it has no
Dense step for these models. So what a converter needs is the pooling mode, and to know whether a
module follows that llama.cpp cannot apply.

    folder = read_sentence_transformers(model_dir)   # None: not a sentence-transformers folder
    folder.pooling                                    # PoolingType.MEAN / CLS / LAST, or None
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggufsmith.constants import PoolingType
from ggufsmith.errors import ConversionError
from ggufsmith.readers.jsonfile import read_json

MODULES_JSON = "modules.json"

# Pooling config.json flags (sentence_transformers.models.Pooling) and its newer single
# "pooling_mode" string, for the modes llama.cpp has.
_MODE_FLAGS = {
    "pooling_mode_mean_tokens": PoolingType.MEAN,
    "pooling_mode_cls_token": PoolingType.CLS,
    "pooling_mode_lasttoken": PoolingType.LAST,
}
_MODE_NAMES = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS, "lasttoken": PoolingType.LAST}
# Modes sentence-transformers has and llama.cpp does not.
_OTHER_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
# Modules after pooling that leave the vector as llama.cpp gives it (L2 normalization is llama.cpp's
# run-time option, on by default in llama-embedding and llama-server).
_HARMLESS = ("Normalize",)


@dataclass(frozen=True)
class SentenceTransformersFolder:
    modules_path: Path
    module_types: tuple[str, ...]  # class names in order: ("Transformer", "Pooling", "Normalize")
    pooling: PoolingType | None  # None: no Pooling module
    pooling_config: Path | None

    def unsupported_modules(self) -> list[str]:
        """Modules after the transformer and its pooling that llama.cpp would not apply (Dense, ...)."""
        return [t for t in self.module_types if t not in ("Transformer", "Pooling", *_HARMLESS)]


def read_sentence_transformers(model_dir: Path) -> SentenceTransformersFolder | None:
    """The folder's modules and pooling mode; None when it has no modules.json."""
    path = Path(model_dir) / MODULES_JSON
    if not path.is_file():
        return None
    modules = read_json(path, expect=list)
    types: list[str] = []
    pooling_dir: str | None = None
    for i, module in enumerate(modules):
        kind = module.get("type") if isinstance(module, dict) else None
        folder = module.get("path", "") if isinstance(module, dict) else None
        if not isinstance(kind, str) or not isinstance(folder, str):
            raise ConversionError(f"{path}: entry {i} needs a string \"type\" and \"path\"")
        short = kind.rsplit(".", 1)[-1]
        types.append(short)
        if short == "Pooling" and pooling_dir is None:
            pooling_dir = folder
    if pooling_dir is None:
        return SentenceTransformersFolder(path, tuple(types), None, None)
    config_path = _inside(Path(model_dir), pooling_dir, path) / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{config_path} not found: {path} names a Pooling module at {pooling_dir!r}")
    return SentenceTransformersFolder(path, tuple(types), _pooling_mode(config_path), config_path)


def _inside(model_dir: Path, folder: str, modules_path: Path) -> Path:
    """model_dir/folder, refusing a path that leaves the model folder (`../`, absolute)."""
    target = (model_dir / folder).resolve()
    if target != model_dir.resolve() and model_dir.resolve() not in target.parents:
        raise ConversionError(f"{modules_path}: module path {folder!r} is outside the model folder")
    return target


def _pooling_mode(config_path: Path) -> PoolingType:
    """The one pooling mode of a Pooling config.json; an error for a mode (or a mix of modes,
    which sentence-transformers concatenates) that llama.cpp cannot compute."""
    config = read_json(config_path)
    flags = {name: config.get(name) for name in (*_MODE_FLAGS, *_OTHER_FLAGS) if name in config}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConversionError(f"{config_path}: {name} is {value!r:.40}; expected true or false")
    chosen = [name for name, value in flags.items() if value]
    mode = config.get("pooling_mode")
    if not chosen and mode is not None:
        if mode not in _MODE_NAMES:
            raise ConversionError(f"{config_path}: pooling_mode {mode!r:.40} is not one llama.cpp has "
                                  f"(it has {', '.join(_MODE_NAMES)})")
        return _MODE_NAMES[mode]
    if len(chosen) != 1 or chosen[0] not in _MODE_FLAGS:
        shown = ", ".join(chosen) or "no mode"
        raise ConversionError(f"{config_path}: pooling by {shown}; llama.cpp pools by exactly one of mean, "
                              "the CLS token or the last token")
    return _MODE_FLAGS[chosen[0]]
