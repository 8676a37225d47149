"""Reading PyTorch pytorch_model*.bin state dicts, through torch itself (imported only here).

torch.load runs with weights_only=True, so a checkpoint's pickle can build tensors and plain
containers but never call arbitrary code, and with mmap=True, so tensors stay on disk until used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.safetensors import RowSlicedTensor, bf16_bits_to_f32
from ggufsmith.errors import ConversionError


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
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise ConversionError(f"{path}: torch cannot read it ({' '.join(str(e).split())[:300]})") from None
        # Files in torch's legacy (pre-zip) format cannot be memory-mapped; read them whole.
        state = _load_unmapped(torch, path)
    except Exception as e:  # UnpicklingError from weights_only, truncated zip, ...
        raise _refused(path, e) from None
    if not isinstance(state, dict):
        raise ConversionError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    names = _dtype_names(torch)
    tensors: dict[str, LazyTensor] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"{path}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype not in names:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, which ggufsmith cannot read")
        tensors[name] = _lazy(torch, tensor, names[tensor.dtype], f"{path.name}:{name}")
    return tensors


def _load_unmapped(torch, path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise _refused(path, e) from None


def _refused(path: Path, e: Exception) -> ConversionError:
    reason = " ".join(str(e).split())[:200]
    return ConversionError(
        f"{path}: torch.load(weights_only=True) cannot read it ({type(e).__name__}: {reason}); "
        "ggufsmith never runs code from a checkpoint: re-save it as safetensors from a trusted environment"
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
