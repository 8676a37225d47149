"""Shared pieces of the state-space and hybrid families (Mamba, Mamba-2, Jamba, Granite 4, Nemotron-H,
Falcon-H1, LFM2, Qwen3-Next/3.5): which layers are recurrent, the state-spaces checkpoint layout, the
depthwise conv kernel and A = -exp(A_log), and the Mamba and Mamba-2 mixers' tensor tables, keys and
layout changes.

Mamba-2's mixer as llama.cpp's build_mamba2_layer reads it: one in_proj whose rows are z, then x B C
(the conv input), then dt per head; A, D and the dt bias one per head, A and D as {1, n_head}
(numpy (n_head, 1)); a gated RMSNorm over groups of d_inner / n_groups channels, read as one
{d_inner / n_groups, n_groups} weight (numpy (n_groups, d_inner / n_groups)). ssm_conv and ssm_scan
read the conv kernel, A and D as plain float arrays, so those stay F32 whatever the output type.
llama.cpp calls the number of heads `ssm.time_step_rank` (dt_rank in shapes).
"""

from __future__ import annotations

import math
import numpy as np

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import in_block
from ggufsmith.arch.tensors import Split, T
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

# Layer type names in config.json layer_types: transformers 5 writes the new names, older configs
# (and llama.cpp's converter, which knows only these) the legacy ones.
RECURRENT_TYPES = ("linear_attention", "mamba")
ATTENTION_TYPES = ("full_attention", "attention")

# Per-layer conditions of the tensor tables: llama.cpp's hybrids take a layer with no key/value heads
# (a 0 in the per-layer head_count_kv) for a recurrent one.
ATTENTION_LAYER = "n_head_kv > 0"
RECURRENT_LAYER = "n_head_kv == 0"

# The context length llama.cpp's converter writes for a model without rope (Mamba, hybrids without
# positions), whose configs carry no training context: an arbitrary large value, which a recurrent
# state or position-free attention is not limited by.
NO_ROPE_CONTEXT = 2**20
CONV_CHANNELS = "d_inner + 2 * n_group * d_state"
# ssm_conv reads the kernel as a plain float array; Mamba-2's ssm_a, ssm_d and ssm_norm are F32 by the plan's rules
SSM_CONV_F32 = (r"blk\.\d+\.ssm_conv1d\.weight",)


def recurrent_layers(c: HFConfig, n_layer: int, default: list[str] | None = None,
                     recurrent: tuple[str, ...] = RECURRENT_TYPES) -> list[bool]:
    """Per layer, whether config.json's layer_types makes it recurrent (one of `recurrent`), else attention."""
    types = c.get_list("layer_types", default=default)
    known = recurrent + ATTENTION_TYPES
    if len(types) != n_layer or not all(t in known for t in types):
        raise c.error("layer_types", types, f"{n_layer} of {', '.join(repr(t) for t in known)}")
    return [t in recurrent for t in types]


def only_where(table: dict[str, T | Split], condition: str) -> dict[str, T | Split]:
    """The same tensors, part of the model only in the blocks where `condition` holds."""
    def limit(spec: T) -> T:
        when = condition if spec.when is None else f"({spec.when}) and ({condition})"
        return T(spec.name, *spec.shape, optional=spec.optional, when=when, blocks=spec.blocks)
    return {hf: Split(*map(limit, s.parts), axis=s.axis) if isinstance(s, Split) else limit(s) for hf, s in table.items()}


def depthwise_conv(tensor: LazyTensor) -> LazyTensor:
    """A depthwise conv1d kernel, torch's (channels, 1, width), as llama.cpp's {width, channels}
    (numpy (channels, width)): the singleton channel-group axis dropped."""
    return tensor.reshape(tensor.shape[0], tensor.shape[-1])


def backbone(block: dict[str, T | Split], prefix: str = "backbone.") -> dict[str, T | Split]:
    """The state-spaces checkpoints' layout (Mamba, Nemotron-H): embeddings, one norm and one mixer per
    block (`block`: relative HF names), final norm_f."""
    return {
        f"{prefix}embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        f"{prefix}norm_f.weight": T("output_norm.weight", "n_embd"),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd", optional=True),
        **in_block({"norm.weight": T("attn_norm.weight", "n_embd"), **block}, hf_prefix=prefix + "layers.{bid}."),
    }


def negative_exp(tensor: LazyTensor) -> LazyTensor:
    """A = -exp(A_log), in float64 rounded once: correctly rounded whatever libm's float32 exp does."""
    return tensor.map(lambda a: (-np.exp(a.astype(np.float64))).astype(np.float32), dtype="F32")


def mamba1_mixer(prefix: str) -> dict[str, T]:
    """The (first) Mamba mixer of one block (relative HF names under `prefix`): per channel A and D,
    dt from a low-rank projection. Layout changes: mamba1_transform."""
    return {
        prefix + "in_proj.weight": T("ssm_in.weight", "2 * d_inner", "n_embd"),
        prefix + "conv1d.weight": T("ssm_conv1d.weight", "d_inner", "d_conv"),
        prefix + "conv1d.bias": T("ssm_conv1d.bias", "d_inner"),
        prefix + "x_proj.weight": T("ssm_x.weight", "dt_rank + 2 * d_state", "d_inner"),
        prefix + "dt_proj.weight": T("ssm_dt.weight", "d_inner", "dt_rank"),
        prefix + "dt_proj.bias": T("ssm_dt.bias", "d_inner"),
        prefix + "A_log": T("ssm_a", "d_inner", "d_state"),  # llama.cpp names these two without ".weight"
        prefix + "D": T("ssm_d", "d_inner"),
        prefix + "out_proj.weight": T("ssm_out.weight", "n_embd", "d_inner"),
    }


MAMBA1_F32 = SSM_CONV_F32 + (r"blk\.\d+\.ssm_a", r"blk\.\d+\.ssm_d")


def mamba1_keys(keys: ArchKeys, c: HFConfig, d_model: int, d_inner: int, *, prefix: str = "") -> None:
    """ssm.* keys of the first Mamba's mixer from Mamba's config names (conv_kernel or d_conv, ...), or
    with `prefix` "mamba_" from Jamba's (mamba_d_conv, ...). dt_rank "auto" is Mamba's ceil(d_model / 16)."""
    def names(*plain: str) -> tuple[str, ...]:
        return (prefix + plain[-1],) if prefix else plain

    dt_rank = c.get(*names("time_step_rank", "dt_rank"), default="auto")
    keys.u32(Keys.SSM.CONV_KERNEL, c.get_int(*names("conv_kernel", "d_conv"), default=4, min=1))
    keys.u32(Keys.SSM.INNER_SIZE, d_inner)
    keys.u32(Keys.SSM.STATE_SIZE, c.get_int(*names("state_size", "d_state"), default=16, min=1))
    keys.u32(Keys.SSM.TIME_STEP_RANK, -(-d_model // 16) if dt_rank == "auto" else
             c.get_int(*names("time_step_rank", "dt_rank"), min=1))


def mamba1_transform(name: str, tensor: LazyTensor) -> LazyTensor:
    """A = -exp(A_log); the depthwise conv kernel as llama.cpp reads it."""
    if name.endswith(".ssm_a"):
        return negative_exp(tensor)
    if name.endswith(".ssm_conv1d.weight"):
        return depthwise_conv(tensor)
    return tensor


def mamba2_mixer(prefix: str, *, conv_bias: str = "required", norm: str = "required") -> dict[str, T]:
    """The Mamba-2 mixer of one block (relative HF names under `prefix`). conv_bias, norm: "required"
    or "optional" (llama.cpp's hybrids load the model without the conv bias; Falcon-H1 without the
    gated norm)."""
    return {
        prefix + "in_proj.weight": T("ssm_in.weight", "2 * d_inner + 2 * n_group * d_state + dt_rank", "n_embd"),
        prefix + "conv1d.weight": T("ssm_conv1d.weight", CONV_CHANNELS, "d_conv"),
        prefix + "conv1d.bias": T("ssm_conv1d.bias", CONV_CHANNELS, optional=conv_bias == "optional"),
        prefix + "dt_bias": T("ssm_dt.bias", "dt_rank"),
        prefix + "A_log": T("ssm_a", "dt_rank", 1),  # llama.cpp names these two without ".weight"
        prefix + "D": T("ssm_d", "dt_rank", 1),
        prefix + "norm.weight": T("ssm_norm.weight", "n_group", "d_inner // n_group", optional=norm == "optional"),
        prefix + "out_proj.weight": T("ssm_out.weight", "n_embd", "d_inner"),
    }


def _mamba2_names(prefix: str, defaults: dict[str, int] | None,
                  names: dict[str, tuple[str, ...]] | None) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """The defaults and config names of the Mamba-2 settings (see mamba2_keys)."""
    d = {"expand": 2, "n_groups": 8, "d_conv": 4, "d_state": 128, **(defaults or {})}
    n = {"expand": (f"{prefix}expand", "expand"), "n_heads": (f"{prefix}n_heads", "num_heads"),
         "n_groups": (f"{prefix}n_groups", "n_groups"), "d_conv": (f"{prefix}d_conv", "conv_kernel"),
         "d_state": (f"{prefix}d_state", "state_size"), "head_dim": ("mamba_d_head",) if prefix else ("head_dim",),
         "proj_bias": (f"{prefix}proj_bias", "use_bias"), "inner": (), **(names or {})}
    return d, n


def mamba2_size(c: HFConfig, setting: str, *, prefix: str = "", defaults: dict[str, int] | None = None,
                names: dict[str, tuple[str, ...]] | None = None) -> int:
    """One Mamba-2 size as mamba2_keys reads it (same prefix, defaults and names): n_groups, d_state,
    ..., or "inner" (the inner size, unless inner_from_heads), for the layout changes that need it."""
    d, n = _mamba2_names(prefix, defaults, names)
    if setting == "inner":
        d_inner = c.get_int(*n["inner"], default=None, min=1) if n["inner"] else None
        return d_inner or c.get_int(*n["expand"], default=d["expand"], min=1) * c.get_int("hidden_size", min=1)
    return c.get_int(*n[setting], default=d[setting], min=1) if setting in d else c.get_int(*n[setting], min=1)


def mamba2_keys(keys: ArchKeys, c: HFConfig, *, prefix: str = "", defaults: dict[str, int] | None = None,
                names: dict[str, tuple[str, ...]] | None = None, inner_from_heads: bool = False) -> None:
    """ssm.* keys from the config's Mamba-2 settings, with the variants llama.cpp cannot run refused.
    `prefix` "mamba_": hybrids that name them mamba_n_heads, mamba_d_state, ...; `names` replaces the
    config names of a setting (expand, n_heads, n_groups, d_conv, d_state, head_dim, proj_bias, and
    inner: the inner size itself, when set, in place of expand x hidden_size); inner_from_heads: the
    inner size is heads x head dim, whatever `expand` says (Nemotron-H)."""
    d, n = _mamba2_names(prefix, defaults, names)
    n_embd = c.get_int("hidden_size", min=1)
    n_head = c.get_int(*n["n_heads"], min=1)
    n_group = c.get_int(*n["n_groups"], default=d["n_groups"], min=1)
    if inner_from_heads:
        d_inner = n_head * c.get_int(*n["head_dim"], min=1)
    else:
        d_inner = mamba2_size(c, "inner", prefix=prefix, defaults=defaults, names=names)
        head_dim = c.get(*n["head_dim"], default="auto")
        if head_dim != "auto" and c.get_int(*n["head_dim"], min=1) * n_head != d_inner:
            raise ConversionError(f"{c.label}: {n_head} Mamba heads x head dim {head_dim} is not the inner size "
                                  f"{d_inner}; the in_proj cannot be split into heads")
    if d_inner % n_head or d_inner % n_group:
        raise ConversionError(f"{c.label}: the inner size {d_inner} is not a multiple of the {n_head} heads and "
                              f"{n_group} groups")
    if c.get_bool(*n["proj_bias"], default=False):
        raise ConversionError(f"{c.label}: the Mamba in/out projections have biases; llama.cpp's Mamba-2 has none")
    low, high = c.get_bounds("time_step_limit", default=(0.0, math.inf))
    if low > 0.0 or high != math.inf:  # softplus makes dt positive: a low bound of 0 clamps nothing
        raise ConversionError(f"{c.label}: time_step_limit [{low}, {high}] clamps dt; llama.cpp's Mamba-2 does not")
    keys.u32(Keys.SSM.CONV_KERNEL, c.get_int(*n["d_conv"], default=d["d_conv"], min=1))
    keys.u32(Keys.SSM.INNER_SIZE, d_inner)
    keys.u32(Keys.SSM.STATE_SIZE, c.get_int(*n["d_state"], default=d["d_state"], min=1))
    keys.u32(Keys.SSM.TIME_STEP_RANK, n_head)
    keys.u32(Keys.SSM.GROUP_COUNT, n_group)


def mamba2_transform(name: str, tensor: LazyTensor, n_group: int) -> LazyTensor:
    """The layout changes of the mixer's tensors (others are returned as they are)."""
    if name.endswith(".ssm_a"):
        return negative_exp(tensor).reshape(tensor.shape[0], 1)
    if name.endswith(".ssm_d"):
        return tensor.reshape(tensor.shape[0], 1)
    if name.endswith(".ssm_conv1d.weight"):
        return depthwise_conv(tensor)
    if name.endswith(".ssm_norm.weight"):
        return tensor.reshape(n_group, tensor.shape[0] // n_group)
    return tensor
