"""ggml's own C code, reached through ctypes from the libraries llama-cpp-python bundles.

This is the reference our quantizer, writer and reader are compared against: the same machine code
that llama.cpp runs. Nothing here is ours except the ctypes declarations.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest


def _lib_dir() -> Path:
    if os.environ.get("CI"):
        import llama_cpp  # in CI the oracle must be there: fail, never skip
    else:
        llama_cpp = pytest.importorskip("llama_cpp")
    return Path(llama_cpp.__file__).parent / "lib"


@lru_cache(maxsize=None)
def ggml_base() -> ctypes.CDLL:
    lib_dir = _lib_dir()
    candidates = [lib_dir / "libggml-base.so", lib_dir / "libggml-base.dylib", lib_dir / "ggml-base.dll"]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        raise RuntimeError(f"libggml-base not found in {lib_dir}")
    lib = ctypes.CDLL(str(path))

    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    for name, restype in [
        ("gguf_get_version", ctypes.c_uint32),
        ("gguf_get_alignment", ctypes.c_size_t),
        ("gguf_get_data_offset", ctypes.c_size_t),
        ("gguf_get_n_kv", ctypes.c_int64),
        ("gguf_get_n_tensors", ctypes.c_int64),
    ]:
        getattr(lib, name).restype = restype
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.gguf_get_key.restype = ctypes.c_char_p
    lib.gguf_get_key.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_kv_type.restype = ctypes.c_int
    lib.gguf_get_kv_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_name.restype = ctypes.c_char_p
    lib.gguf_get_tensor_name.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_offset.restype = ctypes.c_size_t
    lib.gguf_get_tensor_offset.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_type.restype = ctypes.c_int
    lib.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_size.restype = ctypes.c_size_t
    lib.gguf_get_tensor_size.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    return lib


class _TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
        ("from_float_ref", ctypes.c_void_p),
    ]


class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def ggml_quantize(rows: np.ndarray, ggml_type: int, importance: np.ndarray | None = None) -> np.ndarray:
    """ggml_quantize_chunk over all rows of a 2-D float32 array; returns uint8[n_rows, row_bytes]."""
    lib = ggml_base()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if rows.ndim == 1:
        rows = rows.reshape(1, -1)
    n_rows, n_per_row = rows.shape
    row_bytes = lib.ggml_row_size(int(ggml_type), n_per_row)
    out = np.zeros((n_rows, row_bytes), dtype=np.uint8)
    imatrix_ptr = None
    if importance is not None:
        importance = np.ascontiguousarray(importance, dtype=np.float32)
        imatrix_ptr = importance.ctypes.data
    written = lib.ggml_quantize_chunk(
        int(ggml_type), rows.ctypes.data, out.ctypes.data, 0, n_rows, n_per_row, imatrix_ptr
    )
    assert written == out.nbytes, (written, out.nbytes)
    return out


def ggml_dequantize(data: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """ggml's to_float for a type, over `n_elements` values; returns float32[n_elements]."""
    traits = ggml_base().ggml_get_type_traits(int(ggml_type)).contents
    data = np.ascontiguousarray(np.asarray(data).view(np.uint8).reshape(-1))
    out = np.empty(n_elements, dtype=np.float32)
    traits.to_float(data.ctypes.data, out.ctypes.data, n_elements)
    return out


def ggml_parse_gguf(path: str | os.PathLike) -> dict | None:
    """What ggml's C GGUF parser sees in a file, or None if it rejects the file."""
    lib = ggml_base()
    ctx = lib.gguf_init_from_file(os.fsencode(path), _GGUFInitParams(True, None))
    if not ctx:
        return None
    try:
        n_kv = lib.gguf_get_n_kv(ctx)
        n_tensors = lib.gguf_get_n_tensors(ctx)
        return {
            "version": lib.gguf_get_version(ctx),
            "alignment": lib.gguf_get_alignment(ctx),
            "data_offset": lib.gguf_get_data_offset(ctx),
            "keys": [lib.gguf_get_key(ctx, i).decode() for i in range(n_kv)],
            "key_types": [lib.gguf_get_kv_type(ctx, i) for i in range(n_kv)],
            "tensors": [
                {
                    "name": lib.gguf_get_tensor_name(ctx, i).decode(),
                    "offset": lib.gguf_get_tensor_offset(ctx, i),
                    "type": lib.gguf_get_tensor_type(ctx, i),
                    "size": lib.gguf_get_tensor_size(ctx, i),
                }
                for i in range(n_tensors)
            ],
        }
    finally:
        lib.gguf_free(ctx)
