"""Reading PyTorch pytorch_model*.bin state dicts, through torch itself (imported only here).

torch.load runs with weights_only=True, so a checkpoint's pickle can build tensors and plain
containers but never call arbitrary code, and with mmap=True, so tensors stay on disk until used.
Parsing the zip and the pickle is left to torch (no parser of our own); its refusals become one
line naming the file.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np

from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.safetensors import RowSlicedTensor, bf16_bits_to_f32
from ggufsmith.errors import ConversionError
from ggufsmith.readers.jsonfile import shown


def _import_torch(path: Path):
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"{path} is a PyTorch checkpoint and reading it needs torch: pip install ggufsmith[torch] "
            "(or convert it to safetensors, which ggufsmith reads without torch)"
        ) from None
    return torch


def _dtype_names(torch) -> dict:
    return {
        torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
        torch.uint8: "U8", torch.bool: "BOOL",
    }


def read_torch_bin(path: Path) -> dict[str, LazyTensor]:
    """name -> lazy tensor for every tensor of one .bin file, in the file's order."""
    path = Path(path)
    torch = _import_torch(path)
    state = _load_state_dict(torch, path)
    if not isinstance(state, dict):
        raise ConversionError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    names = _dtype_names(torch)
    tensors: dict[str, LazyTensor] = {}
    for name, tensor in state.items():
        if not isinstance(name, str):
            raise ConversionError(f"{path}: has an entry named {shown(name)}, not a tensor name")
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"{path}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype not in names:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, which ggufsmith cannot read")
        tensors[name] = _lazy(torch, tensor, names[tensor.dtype], f"{path.name}:{name}")
    return tensors


def _load_state_dict(torch, path: Path) -> object:
    """torch.load(weights_only=True), memory-mapped when the file allows it; any failure -> ConversionError."""
    # torch warns about things like the pickle protocol: a note for developers that would add lines
    # to the user's one-line error (or to a successful run's output).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise _refused(path, e) from None
        except Exception as e:  # UnpicklingError from weights_only, truncated zip, EOFError, ...
            raise _refused(path, e) from None
        # Files in torch's legacy (pre-zip) format cannot be memory-mapped; read them whole.
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise _refused(path, e) from None


# Lines of torch.load's messages that are advice to torch users, not the reason.
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation",
                      "This is an internal miniz error")


def _refused(path: Path, e: Exception) -> ConversionError:
    lines = [line.strip() for line in str(e).replace(". This is an internal", ".\nThis is an internal").splitlines()]
    reason = " ".join(line for line in lines if line and not line.startswith(_TORCH_BOILERPLATE))
    reason = reason.removeprefix("WeightsUnpickler error: ")[:200] or type(e).__name__
    if isinstance(e, pickle.UnpicklingError):  # a pickle asking for more than tensors, or not a pickle
        return ConversionError(
            f"{path}: torch.load(weights_only=True) refuses its pickle ({reason}); ggufsmith never runs code "
            "from a checkpoint: if it comes from a trusted source, re-save it as safetensors there"
        )
    return ConversionError(
        f"{path}: not a readable PyTorch checkpoint ({reason}); the file is damaged or not a state dict, "
        "download it again"
    )


def _lazy(torch, tensor, dtype_name: str, source: str) -> RowSlicedTensor:
    shape = tuple(int(d) for d in tensor.shape)
    row_length = shape[-1] if shape else 1

    def to_numpy(t) -> np.ndarray:
        if dtype_name == "BF16":
            return bf16_bits_to_f32(t.contiguous().view(torch.int16).numpy().view(np.uint16))
        return t.contiguous().numpy().copy()

    def load_rows(start: int, stop: int) -> np.ndarray:
        return to_numpy(tensor.reshape(-1, row_length)[start:stop])

    def load() -> np.ndarray:
        return to_numpy(tensor).reshape(shape)

    def load_stored_rows(start: int, stop: int) -> np.ndarray:
        rows = tensor.reshape(-1, row_length)[start:stop].contiguous()
        if dtype_name == "BF16":
            return rows.view(torch.int16).numpy().view(np.uint16).copy()
        return rows.numpy().copy()

    return RowSlicedTensor(shape, dtype_name, load, source, load_rows, load_stored_rows)
