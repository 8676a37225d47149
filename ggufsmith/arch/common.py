"""Layout changes and config lookups that several architecture plugins share.

Fused attention projections: HF checkpoints of falcon, gptneox and bloom store q, k and v in one
matrix whose rows are grouped per key/value head ("kv groups": the queries of the group, then its
key, then its value). llama.cpp's build_qkv splits a fused qkv matrix into one block of all query
rows, then all key rows, then all value rows (the layout the GGUF spec calls falcon's `jploski`).
`regroup_qkv` converts the first into the second; gptneox and bloom are the special case of one
query per group (n_head_kv == n_head).
"""

from __future__ import annotations

import numpy as np

from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError


def regroup_qkv(tensor: LazyTensor, n_head: int, n_head_kv: int, head_dim: int) -> LazyTensor:
    """Rows [q.. k v] per kv group -> rows [all q, all k, all v]. Works for weights and biases."""
    rows = tensor.shape[0]
    if n_head % n_head_kv or rows != (n_head + 2 * n_head_kv) * head_dim:
        raise ConversionError(
            f"{tensor.source}: a fused qkv of {n_head} query and {n_head_kv} key/value heads of size "
            f"{head_dim} has {(n_head + 2 * n_head_kv) * head_dim} rows, this one has {rows}; "
            "config.json does not describe this checkpoint"
        )
    per_group = n_head // n_head_kv + 2

    def regroup(array: np.ndarray) -> np.ndarray:
        groups = array.reshape(n_head_kv, per_group, head_dim, *array.shape[1:])
        q, k, v = groups[:, :-2], groups[:, -2], groups[:, -1]
        rest = array.shape[1:]
        return np.concatenate([q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)])

    return tensor.map(regroup)


def transposed(tensor: LazyTensor) -> LazyTensor:
    """A 2-D matrix transposed (GPT-2's Conv1D stores (in, out), a Linear (out, in))."""
    if len(tensor.shape) != 2:
        raise ConversionError(f"{tensor.source}: expected a matrix to transpose, got shape {tensor.shape}")
    return tensor.map(lambda a: np.ascontiguousarray(a.T), shape=tensor.shape[::-1])


def reject(config: HFConfig, condition: bool, what: str) -> None:
    """A clear error for a config variant that llama.cpp's graph for this architecture cannot run:
    converting it anyway would give a file that loads and computes something else."""
    if condition:
        raise ConversionError(f"{config.path}: {what}, which llama.cpp cannot run for this architecture")


def weights_and_biases(table: dict[str, str], hf_prefix: str = "", gguf_prefix: str = "") -> dict[str, str]:
    """{"ln_1": "attn_norm"} -> {"<hf_prefix>ln_1.weight": "<gguf_prefix>attn_norm.weight", ... .bias}.
    A bias the checkpoint does not have simply matches nothing."""
    return {
        f"{hf_prefix}{hf}.{kind}": f"{gguf_prefix}{gguf}.{kind}"
        for hf, gguf in table.items()
        for kind in ("weight", "bias")
    }
