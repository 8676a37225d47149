"""A Hugging Face model folder: its config and its weights as lazy tensors.

Weights are found the way Hugging Face saves them, in this order of preference:
  model.safetensors.index.json + shards, model.safetensors,
  pytorch_model.bin.index.json + shards, pytorch_model.bin.
Tensors come in the order of their files (sorted by name, as llama.cpp's converter reads them)
and, within a file, in the file's own order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor
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
    config = HFConfig.from_dir(model_dir)
    files, weight_map = _weight_files(model_dir)
    checkpoint = Checkpoint(model_dir, config, {}, files)
    try:
        for path in files:
            if path.suffix == ".safetensors":
                st = SafetensorsFile(path)
                checkpoint._open_files.append(st)
                part = st.tensors
            else:
                from ggufsmith.readers.torch_bin import read_torch_bin

                part = read_torch_bin(path)
            for name, tensor in part.items():
                if name in checkpoint.tensors:
                    raise ConversionError(f"tensor {name!r} is in {path} and in {checkpoint.tensors[name].source}")
                checkpoint.tensors[name] = tensor
        if weight_map is not None:
            _check_index(model_dir, weight_map, checkpoint.tensors)
    except BaseException:
        checkpoint.close()
        raise
    return checkpoint


def _weight_files(model_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files to read, and the index's weight map when the checkpoint is sharded."""
    for index_name, single_name in ((SAFETENSORS_INDEX, SAFETENSORS_SINGLE), (TORCH_INDEX, TORCH_SINGLE)):
        index_path = model_dir / index_name
        if index_path.is_file():
            weight_map = _read_weight_map(index_path)
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


def _read_weight_map(index_path: Path) -> dict[str, str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{index_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConversionError(f"{index_path}: has no valid \"weight_map\" of tensor name -> shard file")
    for shard in weight_map.values():
        if Path(shard).name != shard:
            raise ConversionError(f"{index_path}: shard {shard!r} is not a plain file name in the model folder")
    return weight_map


def _check_index(model_dir: Path, weight_map: dict[str, str], tensors: dict[str, LazyTensor]) -> None:
    """The index and the shards must agree: a missing tensor means a truncated or mixed download."""
    missing = [n for n in weight_map if n not in tensors]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ConversionError(
            f"{model_dir}: tensor(s) {shown} are in the index but not in shard {weight_map[missing[0]]}; "
            "the shard is incomplete, download it again"
        )
    extra = [n for n in tensors if n not in weight_map]
    if extra:
        raise ConversionError(
            f"{model_dir}: tensor {extra[0]!r} ({tensors[extra[0]].source}) is not in the index; "
            "the index and the shards come from different downloads"
        )
