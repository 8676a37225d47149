"""Layout changes and config lookups that several architecture plugins share.

Fused attention projections: HF checkpoints of falcon, gptneox and bloom store q, k and v in one
matrix whose rows are grouped per key/value head ("kv groups": the queries of the group, then its
key, then its value). llama.cpp's build_qkv splits a fused qkv matrix into one block of all query
rows, then all key rows, then all value rows (the layout the GGUF spec calls falcon's `jploski`).
`regroup_qkv` converts the first into the second; gptneox and bloom are the special case of one
query per group (n_head_kv == n_head).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from ggufsmith.arch.tensors import T
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.sentence_transformers import SentenceTransformersFolder, read_sentence_transformers
from ggufsmith.errors import ConversionError

log = logging.getLogger(__name__)


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


SLIDING, FULL = "sliding_attention", "full_attention"  # config.json's layer_types


def layer_types(config: HFConfig, default: list[str]) -> list[str]:
    """config.json layer_types (SLIDING / FULL per layer; `default` when absent), checked against
    num_hidden_layers."""
    types = config.get_list("layer_types", default=default)
    n_layer = config.get_int("num_hidden_layers", min=1)
    if len(types) != n_layer or not all(t in (SLIDING, FULL) for t in types):
        raise config.error("layer_types", types, f"{n_layer} of '{SLIDING}' / '{FULL}'")
    return types


def periodic_layer_types(n_layer: int, period: int, *, full_first: bool = False) -> list[str]:
    """Sliding-window layers with one full-attention layer in every `period`: the last of each period
    (Gemma 2-4, Cohere2, EXAONE 4, gpt-oss), or the first (`full_first`: ModernBERT)."""
    full_at = 0 if full_first else period - 1
    return [FULL if i % period == full_at else SLIDING for i in range(n_layer)]


def sliding_flags(types: list[str]) -> list[bool]:
    """Per layer, whether it is a sliding-window layer: llama.cpp's sliding_window_pattern array."""
    return [t == SLIDING for t in types]


def weights_and_biases(table: dict[str, T | str], hf_prefix: str = "", gguf_prefix: str = "",
                       biases: str = "required") -> dict[str, T | str]:
    """{"ln_1": T("attn_norm", "n_embd")} -> {"<hf_prefix>ln_1.weight": T("<gguf_prefix>attn_norm.weight",
    "n_embd"), "<hf_prefix>ln_1.bias": T("<gguf_prefix>attn_norm.bias", "n_embd")}: a bias is as long
    as its weight's rows. biases: "required" (as the weight), "optional" (llama.cpp does without),
    "none" (not mapped: a bias in the checkpoint is then an unknown tensor). Plain strings for the
    GGUF stem map names without declaring shapes."""
    out: dict[str, T | str] = {}
    for hf, entry in table.items():
        if isinstance(entry, str):
            out[f"{hf_prefix}{hf}.weight"] = f"{gguf_prefix}{entry}.weight"
            if biases != "none":
                out[f"{hf_prefix}{hf}.bias"] = f"{gguf_prefix}{entry}.bias"
            continue
        out[f"{hf_prefix}{hf}.weight"] = T(f"{gguf_prefix}{entry.name}.weight", *entry.shape,
                                            optional=entry.optional, when=entry.when)
        if biases != "none":
            out[f"{hf_prefix}{hf}.bias"] = T(f"{gguf_prefix}{entry.name}.bias", entry.shape[0],
                                              optional=entry.optional or biases == "optional", when=entry.when)
    return out


# The classic fused-qkv transformer block (GPT-2, GPT-NeoX, BLOOM, MPT, Falcon): GGUF stems and the
# weight shapes llama.cpp loads them with, for weights_and_biases tables.
QKV_ROWS = "n_embd + 2 * n_head_kv * head_dim"
ATTN_NORM = T("attn_norm", "n_embd")
ATTN_QKV = T("attn_qkv", QKV_ROWS, "n_embd")
ATTN_OUTPUT = T("attn_output", "n_embd", "n_embd")
FFN_NORM = T("ffn_norm", "n_embd")
FFN_UP = T("ffn_up", "n_ff", "n_embd")
FFN_DOWN = T("ffn_down", "n_embd", "n_ff")
OUTPUT_NORM = T("output_norm", "n_embd")
TOKEN_EMBD = T("token_embd.weight", "n_vocab", "n_embd")
OUTPUT = T("output.weight", "n_vocab", "n_embd", optional=True)  # llama.cpp falls back to token_embd


def sentence_transformers_folder(config: HFConfig, arch: str,
                                 supported: tuple[str, ...] = ()) -> SentenceTransformersFolder | None:
    """The sentence-transformers modules beside config.json (None when there are none), refused when
    a module after pooling (a Dense projection, ...) would be left out: llama.cpp's `arch` graph has
    no such step, so its embeddings would not be the model's. `supported`: the module types the
    plugin converts itself (gemma-embedding's Dense)."""
    folder = read_sentence_transformers(config.path.parent)
    if folder and folder.unsupported_modules(supported):
        raise ConversionError(f"{folder.modules_path}: the {', '.join(folder.unsupported_modules(supported))} module(s) "
                              f"after pooling would be left out, and llama.cpp's {arch} has no such step: "
                              "its embeddings would not be the model's")
    return folder


def without_mtp(source: Mapping[str, LazyTensor], where: object,
                prefixes: tuple[str, ...] = ("mtp.",)) -> dict[str, LazyTensor]:
    """The checkpoint's tensors without its multi-token-prediction layers (names starting with one of
    `prefixes`), left out with one notice: llama.cpp runs the model without them, and their export
    as a separate file is a later feature."""
    mtp = [name for name in source if name.startswith(prefixes)]
    if mtp:
        log.warning("%s: left out %d multi-token-prediction tensors (%s); llama.cpp runs the model without them",
                    where, len(mtp), ", ".join(p + "*" for p in prefixes))
    return {name: tensor for name, tensor in source.items() if not name.startswith(prefixes)}
