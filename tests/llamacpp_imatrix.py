"""llama-imatrix's statistics measured inside llama.cpp itself, for the imatrix tests.

llama-cpp-python does not ship llama-imatrix, but it exposes the hook llama-imatrix is built on:
the scheduler's eval callback (`llama_context_params.cb_eval`), called for every graph node with the
node's sources. This module follows tools/imatrix/imatrix.cpp's collection rule on it: for every
MUL_MAT whose weight (src0) is named `blk.*` and whose activations (src1) are F32 with at least 16
rows, add the squares of src1's rows per column and count the rows; for MUL_MAT_ID (experts), the
same per expert over the (token, slot) pairs routed to it, read from the ids tensor (src2). Chunks
are decoded from an empty cache with every position an output, as llama-imatrix does. Only the
reading of ggml's tensor struct is ours (its layout from ggml.h).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_TYPE_F32 = 0


class GGMLTensor(ctypes.Structure):
    pass


GGMLTensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GGMLTensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(GGMLTensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]


def _op_ids() -> tuple[int, int]:
    from tests.ggml_oracle import ggml_base

    lib = ggml_base()
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    names = {lib.ggml_op_name(i): i for i in range(120) if lib.ggml_op_name(i)}
    return names[b"MUL_MAT"], names[b"MUL_MAT_ID"]


def _view(t: GGMLTensor, dtype, dims: int) -> np.ndarray:
    """A numpy view of a host tensor's data in ggml's order (ne[dims-1], ..., ne[0]) with its strides."""
    itemsize = np.dtype(dtype).itemsize
    shape = tuple(int(t.ne[i]) for i in reversed(range(dims)))
    strides = tuple(int(t.nb[i]) for i in reversed(range(dims)))
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + itemsize
    buffer = (ctypes.c_char * extent).from_address(t.data)
    return np.ndarray(shape, dtype=dtype, buffer=buffer, strides=strides)


def llamacpp_imatrix(gguf_path: Path, chunks: list[list[int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (sums float64[nmat, ne0], counts int64[nmat]) collected while llama.cpp decodes `chunks`."""
    import llama_cpp as L

    mul_mat, mul_mat_id = _op_ids()
    stats: dict[str, list[np.ndarray]] = {}

    def collect(t_ptr, ask, _user):
        t = ctypes.cast(t_ptr, ctypes.POINTER(GGMLTensor)).contents
        if t.op not in (mul_mat, mul_mat_id):
            return False if ask else True
        src0, src1 = t.src[0].contents, t.src[1].contents
        name = src0.name.decode()
        if ask:
            if t.op == mul_mat_id:
                return True
            return name.startswith("blk.") and src1.ne[1] >= 16 and src1.type == GGML_TYPE_F32
        if t.op == mul_mat_id:
            n_expert = int(src0.ne[2])
            x = _view(src1, np.float32, 3).astype(np.float64)  # (tokens, slots or 1, ne0)
            ids = _view(t.src[2].contents, np.int32, 2)  # (tokens, used experts)
            sums, counts = stats.setdefault(name, [np.zeros((n_expert, x.shape[-1])), np.zeros(n_expert, np.int64)])
            for slot in range(ids.shape[1]):
                rows = x[:, slot % x.shape[1], :]
                np.add.at(sums, ids[:, slot], rows**2)
                np.add.at(counts, ids[:, slot], 1)
        else:  # a 3-D weight (MLA's attn_k_b / attn_v_b): one matrix per slice of src1, one count
            n_mat = int(src0.ne[2] * src0.ne[3])
            x = _view(src1, np.float32, 4).astype(np.float64)  # (ne3, ne2, rows, ne0)
            sums, counts = stats.setdefault(name, [np.zeros((n_mat, x.shape[-1])), np.zeros(1, np.int64)])
            for i3 in range(x.shape[0]):
                for i2 in range(x.shape[1]):
                    sums[(i3 % src0.ne[3]) * src0.ne[2] + i2 % src0.ne[2]] += (x[i3, i2] ** 2).sum(axis=0)
            counts[0] += x.shape[0] * x.shape[1] * x.shape[2] // n_mat
        return True

    callback = L.ggml_backend_sched_eval_callback(collect)
    n = max(len(c) for c in chunks)
    model = L.llama_model_load_from_file(str(gguf_path).encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n
    params.n_threads = params.n_threads_batch = 2
    params.type_k = params.type_v = GGML_TYPE_F32
    params.cb_eval = callback
    ctx = L.llama_init_from_model(model, params)
    batch = L.llama_batch_init(n, 0, 1)
    try:
        for chunk in chunks:
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
                batch.seq_id[i][0] = 0
            assert L.llama_decode(ctx, batch) == 0
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return {name: (sums, counts) for name, (sums, counts) in stats.items()}
