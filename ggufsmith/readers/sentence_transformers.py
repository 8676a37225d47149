"""A sentence-transformers model folder: `modules.json` and the Pooling module's `config.json`.

sentence-transformers saves a model as a chain of modules: the transformer (the HF checkpoint,
usually at the folder's root), then a Pooling module (one vector per text from the per-token
hidden states), then optional ones such as Normalize (L2) or Dense (a linear projection).
llama.cpp has one pooling setting per model file ({arch}.pooling_type: mean, CLS token or last
token) and normalizes at run time (llama-embedding's --embd-normalize, on by default); only some
architectures (gemma-embedding) apply Dense projections after pooling, stored as tensors. So what a
converter needs is the pooling mode, the Dense modules (read on request: their config and weights),
and to know whether a module follows that llama.cpp cannot apply.

    folder = read_sentence_transformers(model_dir)   # None: not a sentence-transformers folder
    folder.pooling                                    # PoolingType.MEAN / CLS / LAST, or None
    folder.dense_modules()                            # [DenseModule(in_features, out_features, weight, ...)]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggufsmith.constants import PoolingType
from ggufsmith.errors import ConversionError
from ggufsmith.readers.jsonfile import read_json
from ggufsmith.readers.lazy_tensor import LazyTensor

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


# A Dense module's activation that leaves its output as it is (sentence-transformers' default).
IDENTITY = "torch.nn.modules.linear.Identity"


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers Dense module: activation(weight @ x + bias)."""

    folder: Path
    in_features: int
    out_features: int
    activation: str  # the activation's class path, IDENTITY for none
    weight: LazyTensor  # (out_features, in_features)
    bias: LazyTensor | None


@dataclass(frozen=True)
class SentenceTransformersFolder:
    modules_path: Path
    module_types: tuple[str, ...]  # class names in order: ("Transformer", "Pooling", "Normalize")
    pooling: PoolingType | None  # None: no Pooling module
    pooling_config: Path | None
    module_folders: tuple[Path, ...] = ()  # each module's folder, in the order of module_types

    def unsupported_modules(self, supported: tuple[str, ...] = ()) -> list[str]:
        """Modules after the transformer and its pooling that llama.cpp would not apply (Dense, ...),
        beyond the `supported` ones of the architecture."""
        return [t for t in self.module_types if t not in ("Transformer", "Pooling", *_HARMLESS, *supported)]

    def dense_modules(self) -> list[DenseModule]:
        """The Dense modules in order, with their config.json and weights read."""
        return [_read_dense(folder) for kind, folder in zip(self.module_types, self.module_folders) if kind == "Dense"]


def read_sentence_transformers(model_dir: Path) -> SentenceTransformersFolder | None:
    """The folder's modules and pooling mode; None when it has no modules.json."""
    path = Path(model_dir) / MODULES_JSON
    if not path.is_file():
        return None
    modules = read_json(path, expect=list)
    types: list[str] = []
    folders: list[Path] = []
    pooling_dir: str | None = None
    for i, module in enumerate(modules):
        kind = module.get("type") if isinstance(module, dict) else None
        folder = module.get("path", "") if isinstance(module, dict) else None
        if not isinstance(kind, str) or not isinstance(folder, str):
            raise ConversionError(f"{path}: entry {i} needs a string \"type\" and \"path\"")
        short = kind.rsplit(".", 1)[-1]
        types.append(short)
        folders.append(_inside(Path(model_dir), folder, path))
        if short == "Pooling" and pooling_dir is None:
            pooling_dir = folder
    if pooling_dir is None:
        return SentenceTransformersFolder(path, tuple(types), None, None, tuple(folders))
    config_path = _inside(Path(model_dir), pooling_dir, path) / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{config_path} not found: {path} names a Pooling module at {pooling_dir!r}")
    return SentenceTransformersFolder(path, tuple(types), _pooling_mode(config_path), config_path, tuple(folders))


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


def _read_dense(folder: Path) -> DenseModule:
    """A Dense module's config.json (in/out features, bias, activation) and its linear.weight/.bias,
    from model.safetensors or pytorch_model.bin, checked against each other."""
    from ggufsmith.readers.safetensors import SafetensorsFile
    from ggufsmith.readers.torch_bin import read_torch_bin

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{config_path} not found: a sentence-transformers Dense module needs it")
    config = read_json(config_path)
    features = {}
    for name in ("in_features", "out_features"):
        value = config.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConversionError(f"{config_path}: {name} is {value!r:.40}; expected a positive integer")
        features[name] = value
    activation = config.get("activation_function", IDENTITY)
    if not isinstance(activation, str):
        raise ConversionError(f"{config_path}: activation_function is {activation!r:.40}; expected a class name")
    if (folder / "model.safetensors").is_file():
        weights_path = folder / "model.safetensors"
        with SafetensorsFile(weights_path) as weights_file:
            tensors = {name: LazyTensor.from_array(t.load(), t.dtype, t.source) for name, t in weights_file.tensors.items()}
    elif (folder / "pytorch_model.bin").is_file():
        weights_path = folder / "pytorch_model.bin"
        tensors = read_torch_bin(weights_path)
    else:
        raise ConversionError(f"{folder}: neither model.safetensors nor pytorch_model.bin: the Dense module's weights are missing")
    weight, bias = tensors.get("linear.weight"), tensors.get("linear.bias")
    expected = (features["out_features"], features["in_features"])
    if weight is None or tuple(weight.shape) != expected:
        shape = "missing" if weight is None else f"of shape {list(weight.shape)}"
        raise ConversionError(f"{weights_path}: linear.weight is {shape}; {config_path} asks for {list(expected)}")
    if config.get("bias", bias is not None) != (bias is not None):
        raise ConversionError(f"{config_path}: bias is {config.get('bias')!r:.20} but {weights_path} "
                              f"{'has' if bias is not None else 'has no'} linear.bias")
    if bias is not None and tuple(bias.shape) != expected[:1]:
        raise ConversionError(f"{weights_path}: linear.bias has shape {list(bias.shape)}; expected [{expected[0]}]")
    return DenseModule(folder, features["in_features"], features["out_features"], activation, weight, bias)
