"""A checkpoint in Meta's own layout (Llama 1-3, Mistral's first releases): `params.json`,
`consolidated.00.pth` ... `consolidated.0N.pth` (one file per model-parallel rank) or
`consolidated.safetensors`, and `tokenizer.model`.

It is presented to the architecture plugins exactly as the Hugging Face layout of the same weights
would be (the `Checkpoint` of readers/checkpoint.py): a config.json built from params.json, the
tensors under the Hugging Face names, the shards joined, and q/k in Hugging Face's rotary order.
The llama plugin then converts it as it converts any Hugging Face llama, so a Meta folder and its
Hugging Face copy give the same tensors.

How the ranks split each tensor (Meta's model code, fairscale's parallel layers): column-parallel
wq, wk, wv, w1, w3 and `output` along their rows (axis 0), row-parallel wo and w2 along their
columns (axis 1); the embedding along its columns in Llama 1-2 (ParallelEmbedding) but along its
rows in Llama 3 (VocabParallelEmbedding), told apart here by the shapes; 1-D norms are copied
whole in every rank. Meta's q and k rows are in the interleaved rotary order llama.cpp uses;
transformers' converter permutes them to rotate by halves, which is undone here so that the plugin's
usual permutation gives back Meta's rows exactly (a reordering of rows: no value changes).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.jsonfile import read_json
from ggufsmith.readers.lazy_tensor import LazyTensor

PARAMS_JSON = "params.json"
CONSOLIDATED_SAFETENSORS = "consolidated.safetensors"
_SHARD = re.compile(r"consolidated\.(\d\d)\.pth")

# Meta's names -> Hugging Face's ({bid}: the block number).
_GLOBAL_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_BLOCK = re.compile(r"layers\.(\d+)\.(.+)")
# Row-parallel layers: each rank holds a slice of the columns.
_JOINED_BY_COLUMNS = ("attention.wo.weight", "feed_forward.w2.weight")
# Precomputed rotary frequencies some releases store (Llama 1-2): not a weight.
_IGNORED = ("rope.freqs",)

# use_scaled_rope asks for Llama 3.1's frequency scaling, whose constants Meta's reference code
# (llama-models, models/llama3/model.py: apply_scaling) hard-codes, factor 8 included, for every model.
# The Hugging Face releases of Llama 3.2 1B and 3B (and Llama Guard 3 1B) were made with factor 32
# instead (transformers' converter picks it from the version the user names), and params.json does not
# say which: the factor is read from params.json's rope_scaling_factor (the key Meta's Llama 4 code
# reads) when given, else told from the model's shape, (dim, n_heads), the one Meta's releases with
# use_scaled_rope have (llama-models' sku_list), so that llama.cpp gets the rope of the Hugging Face copy.
_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_ROPE_FACTOR_OF_RELEASE = {
    (2048, 32): 32.0,    # Llama 3.2 1B, Llama Guard 3 1B
    (3072, 24): 32.0,    # Llama 3.2 3B
    (4096, 32): 8.0,     # Llama 3.1 8B (and Llama 3.2 11B Vision's text model)
    (8192, 64): 8.0,     # Llama 3.1 70B, Llama 3.3 70B (and Llama 3.2 90B Vision's)
    (16384, 128): 8.0,   # Llama 3.1 405B
}


def is_meta_checkpoint(model_dir: Path) -> bool:
    """A folder in Meta's layout: consolidated weights and no config.json (a folder with both is
    read as Hugging Face's)."""
    return not (model_dir / "config.json").is_file() and bool(_weight_files(model_dir))


def _weight_files(model_dir: Path) -> list[Path]:
    shards = sorted(p for p in model_dir.glob("consolidated.*.pth") if _SHARD.fullmatch(p.name))
    if shards:
        return shards
    single = model_dir / CONSOLIDATED_SAFETENSORS
    return [single] if single.is_file() else []


def open_meta_checkpoint(model_dir: Path):
    """The Checkpoint of a Meta-layout folder (see the module docstring)."""
    from ggufsmith.readers.checkpoint import Checkpoint

    files = _weight_files(model_dir)
    params_path = model_dir / PARAMS_JSON
    if not params_path.is_file():
        raise ConversionError(f"{params_path} not found: a Meta checkpoint ({files[0].name}) needs its params.json "
                              "(dim, n_layers, n_heads, ...) beside it")
    _check_shard_numbers(model_dir, files)
    params = HFConfig(read_json(params_path), params_path)
    checkpoint = Checkpoint(model_dir, HFConfig({}), {}, files)
    try:
        ranks = [_read_rank(path, checkpoint) for path in files]
        joined = _join_ranks(ranks, files, params)
        checkpoint.config = HFConfig(_hf_config(params, joined), params_path)
        checkpoint.tensors = _hf_tensors(joined, checkpoint.config)
    except BaseException:
        checkpoint.close()
        raise
    return checkpoint


def _check_shard_numbers(model_dir: Path, files: list[Path]) -> None:
    numbers = [int(_SHARD.fullmatch(p.name).group(1)) for p in files if _SHARD.fullmatch(p.name)]
    missing = sorted(set(range(max(numbers, default=-1) + 1)) - set(numbers))
    if missing:
        raise ConversionError(f"{model_dir}: consolidated.{missing[0]:02d}.pth is missing; a Meta checkpoint has one "
                              f"file per model-parallel rank, 00 to {max(numbers):02d}: download it")


def _read_rank(path: Path, checkpoint) -> dict[str, LazyTensor]:
    if path.suffix == ".safetensors":
        from ggufsmith.readers.safetensors import SafetensorsFile

        st = SafetensorsFile(path)
        checkpoint._open_files.append(st)
        return dict(st.tensors)
    from ggufsmith.readers.torch_bin import read_torch_bin

    return read_torch_bin(path)  # torch.load(weights_only=True, mmap=True)


def _join_ranks(ranks: list[dict[str, LazyTensor]], files: list[Path], params: HFConfig) -> dict[str, LazyTensor]:
    """Meta name -> the whole tensor, each joined from its slices along its split axis."""
    first = ranks[0]
    for rank, path in zip(ranks[1:], files[1:]):
        if set(rank) != set(first):
            name = next(iter(set(rank) ^ set(first)))
            holder, lacking = (path, files[0]) if name in rank else (files[0], path)
            raise ConversionError(f"{holder}: tensor {name!r} is not in {lacking.name}; the consolidated.*.pth "
                                  "files come from different checkpoints")
    joined = {}
    for name in first:
        if name in _IGNORED:
            continue
        slices = [rank[name] for rank in ranks]
        joined[name] = slices[0] if len(slices) == 1 else _join(name, slices, files, params)
    return joined


def _join(name: str, slices: list[LazyTensor], files: list[Path], params: HFConfig) -> LazyTensor:
    shape = slices[0].shape
    if len(shape) == 1:  # norms: every rank holds the whole vector
        axis = None
    elif name.endswith(_JOINED_BY_COLUMNS):
        axis = 1
    elif name == "tok_embeddings.weight":
        # Llama 1-2 split the embedding's columns (each rank: all tokens, dim/n values), Llama 3 its rows.
        axis = 1 if shape[1] * len(slices) == params.get_int("dim", min=1) else 0
    else:
        axis = 0
    for piece, path in zip(slices[1:], files[1:]):
        if len(piece.shape) != len(shape) or any(a != b for i, (a, b) in enumerate(zip(piece.shape, shape)) if i != axis):
            along = "" if axis is None else f" (they are joined along axis {axis})"
            raise ConversionError(f"{path}: tensor {name!r} has shape {piece.shape} but {shape} in {files[0].name}"
                                  f"{along}; the consolidated.*.pth files come from different checkpoints")
    if axis is None:
        return slices[0]
    return LazyTensor.concatenate(slices, axis=axis, source=f"{files[0].parent.name}/consolidated.*:{name}")


def _hf_config(params: HFConfig, tensors: dict[str, LazyTensor]) -> dict:
    """The config.json transformers' converter writes for these params, the values checked
    against the tensors' shapes (a params.json from another model size is refused here)."""
    if "moe" in params:
        raise ConversionError(f"{params.path}: \"moe\" is set: Meta-layout mixture-of-experts checkpoints (Mixtral) "
                              "are not supported; convert the Hugging Face release instead")
    embedding = tensors.get("tok_embeddings.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise ConversionError(f"{params.path.parent}: no 2-D tensor 'tok_embeddings.weight' in the consolidated files; "
                              "this is not a Meta llama checkpoint")
    dim = params.get_int("dim", min=1)
    n_layers = params.get_int("n_layers", min=1)
    n_heads = params.get_int("n_heads", min=1)
    n_kv_heads = params.get_int("n_kv_heads", default=n_heads, min=1)
    vocab_size = params.get_int("vocab_size", default=-1, min=-1)
    if embedding.shape[1] != dim:
        raise params.error("dim", dim, f"{embedding.shape[1]}, the width of tok_embeddings.weight")
    if vocab_size == -1:  # Llama 1-2: the tokenizer's size, as the embedding has it
        vocab_size = embedding.shape[0]
    elif vocab_size != embedding.shape[0]:
        raise params.error("vocab_size", vocab_size, f"{embedding.shape[0]}, the rows of tok_embeddings.weight")
    w1 = tensors.get("layers.0.feed_forward.w1.weight")
    intermediate = _intermediate_size(params, dim)
    if w1 is not None and w1.shape[0] != intermediate:
        raise ConversionError(f"{params.path}: multiple_of / ffn_dim_multiplier / hidden_dim give a feed-forward width "
                              f"of {intermediate} but layers.0.feed_forward.w1.weight has {w1.shape[0]} rows; "
                              "params.json belongs to another model")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "intermediate_size": intermediate,
        "rms_norm_eps": params.get_float("norm_eps", min=0),
        "vocab_size": vocab_size,
        "max_position_embeddings": _context_length(params, vocab_size),
        "rope_parameters": {"rope_type": "default", "rope_theta": params.get_float("rope_theta", default=10000.0, min=0)},
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    # Mistral's params.json gives it; transformers' LlamaConfig always saves it
    config["head_dim"] = params.get_int("head_dim", default=dim // n_heads, min=1)
    if params.get_bool("use_scaled_rope", default=False):
        config["rope_parameters"] |= _LLAMA3_ROPE | {"factor": _rope_scaling_factor(params, dim, n_heads)}
    return config


def _rope_scaling_factor(params: HFConfig, dim: int, n_heads: int) -> float:
    """use_scaled_rope's factor: params.json's rope_scaling_factor, else that of the Meta release of
    this shape (see _ROPE_FACTOR_OF_RELEASE); a shape no release has is refused rather than guessed."""
    if "rope_scaling_factor" in params:
        return params.get_float("rope_scaling_factor", min=1)
    factor = _ROPE_FACTOR_OF_RELEASE.get((dim, n_heads))
    if factor is None:
        raise ConversionError(f"{params.path}: use_scaled_rope is set without rope_scaling_factor, and dim {dim} with "
                              f"n_heads {n_heads} is no Llama 3.1-3.3 release's (factor 8, or 32 for Llama 3.2 1B/3B): "
                              "add \"rope_scaling_factor\" to params.json, or convert the Hugging Face release")
    return factor


def _intermediate_size(params: HFConfig, dim: int) -> int:
    """The SwiGLU width, as Meta's model code computes it: 2/3 of 4*dim, times ffn_dim_multiplier,
    rounded up to multiple_of (Mistral's params.json gives it as hidden_dim)."""
    if "hidden_dim" in params:
        return params.get_int("hidden_dim", min=1)
    hidden = int(2 * 4 * dim / 3)
    multiplier = params.get_float("ffn_dim_multiplier", default=None, min=0)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    multiple_of = params.get_int("multiple_of", default=256, min=1)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _context_length(params: HFConfig, vocab_size: int) -> int:
    """params.json rarely says how long a context the model was trained for; this is the length
    transformers' converter gives each release (max_seq_len where a params.json has it)."""
    if "max_seq_len" in params:
        return params.get_int("max_seq_len", min=1)
    if params.get_bool("use_scaled_rope", default=False):
        return 131072  # Llama 3.1 and later
    if vocab_size >= 128000:
        return 8192  # Llama 3
    if "sliding_window" in params:
        return 32768  # Mistral 7B
    if params.get_float("rope_theta", default=10000.0) == 1e6:
        return 16384  # Code Llama
    return 4096 if params.get_float("norm_eps") == 1e-5 else 2048  # Llama 2 : Llama 1


def _hf_tensors(tensors: dict[str, LazyTensor], config: HFConfig) -> dict[str, LazyTensor]:
    """The tensors under Hugging Face's names, q and k rows in Hugging Face's rotary order."""
    n_heads = config.get_int("num_attention_heads")
    n_kv_heads = config.get_int("num_key_value_heads")
    hf = {}
    for name, tensor in tensors.items():
        hf_name = _hf_name(name, config)
        if name.endswith("attention.wq.weight"):
            tensor = _rotary_pairs_to_halves(tensor, n_heads)
        elif name.endswith("attention.wk.weight"):
            tensor = _rotary_pairs_to_halves(tensor, n_kv_heads)
        hf[hf_name] = tensor
    return dict(sorted(hf.items()))  # the order of a Hugging Face safetensors file's tensors


def _hf_name(name: str, config: HFConfig) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    block = _BLOCK.fullmatch(name)
    if block and block.group(2) in _BLOCK_NAMES and int(block.group(1)) < config.get_int("num_hidden_layers"):
        return f"model.layers.{block.group(1)}.{_BLOCK_NAMES[block.group(2)]}"
    raise ConversionError(f"{config.path.parent}: tensor {name!r} in the consolidated files is not part of a Meta "
                          "llama checkpoint (or its block is beyond params.json's n_layers)")


def _rotary_pairs_to_halves(tensor: LazyTensor, n_head: int) -> LazyTensor:
    """Rows (h0, s0, h1, s1, ...) of each head -> (h0, h1, ... | s0, s1, ...): Meta's rotary order to
    Hugging Face's (the inverse of transformers' permute in its Meta converter)."""
    rows = tensor.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"{tensor.source}: {rows} rows do not split into {n_head} heads of even size; "
                              "params.json's n_heads / n_kv_heads belong to another model")
    half = rows // n_head // 2
    rest = tensor.shape[1:]

    def deinterleave(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.reshape(n_head, half, 2, *rest).swapaxes(1, 2).reshape(rows, *rest))

    return tensor.map(deinterleave)
