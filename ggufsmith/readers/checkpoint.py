"""A Hugging Face model folder: its config and its weights as lazy tensors.

Weights are found the way Hugging Face saves them, in this order of preference:
  model.safetensors.index.json + shards, model.safetensors,
  pytorch_model.bin.index.json + shards, pytorch_model.bin.
Tensors come in the order of their files (sorted by name, as llama.cpp's converter reads them)
and, within a .safetensors file, sorted by name as llama.cpp's converter lists them (the file
itself orders its data by dtype first); within a .bin file, in the file's own order. A folder in
Meta's own layout (params.json, consolidated.*.pth) is read by readers/meta.py into the same form. Weights of a
release published quantized (config.json quantization_config) come either as tensors that keep
their bytes, for a format GGUF shares (MXFP4), or dequantized (FP8, GPTQ, AWQ, compressed-tensors):
readers/quantized.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.hub import repo_id_of_cached_folder
from ggufsmith.readers.jsonfile import read_json, shown as _shown
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.meta import is_meta_checkpoint, open_meta_checkpoint
from ggufsmith.readers.quantized import decode_quantized
from ggufsmith.readers.safetensors import SafetensorsFile
from ggufsmith.errors import ConversionError

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_SINGLE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"


@dataclass
class Checkpoint:
    """An opened model folder. Close it (or use `with`) to release the file maps."""

    model_dir: Path
    config: HFConfig
    tensors: dict[str, LazyTensor]
    files: list[Path]
    repo_id: str | None = None  # the Hugging Face repository id it was found by, if any (readers/hub.py)
    _open_files: list[SafetensorsFile] = field(default_factory=list, repr=False)

    def close(self) -> None:
        for f in self._open_files:
            f.close()
        self._open_files.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_checkpoint(model_dir: str | Path) -> Checkpoint:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConversionError(f"{model_dir} is not a directory; give the folder of a Hugging Face model")
    if is_meta_checkpoint(model_dir):
        return open_meta_checkpoint(model_dir)
    config = HFConfig.from_dir(model_dir)
    files, weight_map = _weight_files(model_dir)
    checkpoint = Checkpoint(model_dir, config, {}, files)
    checkpoint.repo_id = repo_id_of_cached_folder(model_dir)
    file_of: dict[str, Path] = {}  # tensor name -> the file it was read from
    try:
        for path in files:
            if path.suffix == ".safetensors":
                st = SafetensorsFile(path)
                checkpoint._open_files.append(st)
                part = dict(sorted(st.tensors.items()))
            else:
                from ggufsmith.readers.torch_bin import read_torch_bin

                part = read_torch_bin(path)
            for name, tensor in part.items():
                if name in file_of:
                    raise ConversionError(f"tensor {name!r} is in {path} and in {file_of[name]}; "
                                          "the shards come from different downloads")
                checkpoint.tensors[name] = tensor
                file_of[name] = path
        if weight_map is not None:
            _check_index(model_dir, weight_map, file_of)
        checkpoint.tensors = decode_quantized(checkpoint.tensors, config)
    except BaseException:
        checkpoint.close()
        raise
    return checkpoint


def _weight_files(model_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files to read, and the index's weight map when the checkpoint is sharded."""
    for index_name, single_name in ((SAFETENSORS_INDEX, SAFETENSORS_SINGLE), (TORCH_INDEX, TORCH_SINGLE)):
        index_path = model_dir / index_name
        if index_path.is_file():
            weight_map = _read_weight_map(index_path, Path(single_name).suffix)
            shards = sorted(set(weight_map.values()))
            missing = [s for s in shards if not (model_dir / s).is_file()]
            if missing:
                raise ConversionError(
                    f"{index_path} lists shard(s) {', '.join(missing)} that are not in {model_dir}; download them"
                )
            return [model_dir / s for s in shards], weight_map
        if (model_dir / single_name).is_file():
            return [model_dir / single_name], None
    raise ConversionError(
        f"{model_dir}: no weights found; expected {SAFETENSORS_SINGLE}, {SAFETENSORS_INDEX} with its shards, "
        f"{TORCH_SINGLE} or {TORCH_INDEX} with its shards"
    )


def _read_weight_map(index_path: Path, shard_suffix: str) -> dict[str, str]:
    """The index's "weight_map" (tensor name -> shard file name), every entry checked."""
    index = read_json(index_path, unique_keys=True)  # a tensor named twice could map to two shards
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(f"{index_path}: \"weight_map\" is {_shown(weight_map)}; "
                              "expected an object of tensor name -> shard file, the index is damaged")
    for name, shard in weight_map.items():
        if not (isinstance(shard, str) and shard.endswith(shard_suffix) and Path(shard).name == shard):
            raise ConversionError(
                f"{index_path}: weight_map[{name!r}] is {_shown(shard)}, not the name of a {shard_suffix} "
                "file in the model folder; the index is damaged"
            )
    return weight_map


def _check_index(model_dir: Path, weight_map: dict[str, str], file_of: dict[str, Path]) -> None:
    """The index and the shards must agree: a disagreement means a truncated or mixed download."""
    missing = [n for n in weight_map if n not in file_of]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ConversionError(
            f"{model_dir}: tensor(s) {shown} are in the index but not in shard {weight_map[missing[0]]}; "
            "the shard is incomplete, download it again"
        )
    for name, path in file_of.items():
        if name not in weight_map:
            raise ConversionError(
                f"{model_dir}: tensor {name!r} ({path.name}) is not in the index; "
                "the index and the shards come from different downloads"
            )
        if weight_map[name] != path.name:
            raise ConversionError(
                f"{model_dir}: tensor {name!r} is in {path.name} but the index puts it in {weight_map[name]}; "
                "the index and the shards come from different downloads"
            )
