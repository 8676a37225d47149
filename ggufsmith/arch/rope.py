"""Rotary position embeddings: the settings of a config.json, and how llama.cpp is told about them.

transformers >= 5 writes one `rope_parameters` object (rope_type, rope_theta, factor, ...); older
configs have a top-level `rope_theta` (or an architecture's own name for it) and a `rope_scaling`
object (`type` or `rope_type`). `Rope` reads either, with types checked, and writes the
`{arch}.rope.*` keys; scaling llama.cpp cannot follow is refused or warned about in one line.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ggufsmith.arch.base import ArchKeys, HFConfig
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.readers.lazy_tensor import LazyTensor

log = logging.getLogger(__name__)

ROPE_FREQS = "rope_freqs.weight"
ROPE_FACTORS_LONG = "rope_factors_long.weight"
ROPE_FACTORS_SHORT = "rope_factors_short.weight"
LAYER_TYPES = ("full_attention", "sliding_attention")
# What llama.cpp uses for yarn whatever the file says (it reads no beta keys for most architectures).
_LLAMACPP_YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}


class Rope:
    """The rope settings of one config, from either layout."""

    def __init__(self, config: HFConfig, *legacy_theta_names: str) -> None:
        self.config = config
        section = next((n for n in ("rope_parameters", "rope_scaling") if n in config), None)
        values = dict(config.get_dict(section)) if section else {}
        # Models with sliding-window layers (transformers >= 5) keep one set per layer type:
        # {"full_attention": {...}, "sliding_attention": {...}}. The full-attention one is the
        # model's rope; the sliding one may have its own base frequency (rope.freq_base_swa).
        self.swa_theta = None
        if section and values and set(values) <= set(LAYER_TYPES) and all(isinstance(v, dict) for v in values.values()):
            sliding = config.sub(section).sub("sliding_attention", values.get("sliding_attention", {}))
            self.swa_theta = sliding.get_float("rope_theta", default=None, min=0)
            section = f"{section}.full_attention"
            values = dict(values.get("full_attention", {}))
        if "rope_theta" not in values:
            theta = config.get_float("rope_theta", *legacy_theta_names, default=None)
            if theta is not None:
                values["rope_theta"] = theta
        if "original_max_position_embeddings" not in values and "original_max_position_embeddings" in config:
            values["original_max_position_embeddings"] = config.get_int("original_max_position_embeddings")
        self.params = config.sub(section or "rope_parameters", values)
        self.type = self.params.get_str("rope_type", "type", default="default")
        self.theta = self.params.get_float("rope_theta", default=None, min=0)
        if self.theta is not None and self.theta <= 0:
            raise self.params.error("rope_theta", self.theta, "a positive number")

    def partial_rotary_factor(self, *legacy_names: str) -> float:
        """The fraction of each head that is rotated (1.0: all of it)."""
        value = self.params.get_float("partial_rotary_factor", default=None, min=0, max=1)
        if value is None:
            value = self.config.get_float("partial_rotary_factor", *legacy_names, default=1.0, min=0, max=1)
        return value

    def require_unscaled(self) -> None:
        """For architectures converted without rope scaling: refuse any."""
        if self.type != "default":
            raise ConversionError(f"{self.params.label}: rope scaling {self.type!r} is set, "
                                  "which llama.cpp cannot run for this architecture")

    def write_scaling_keys(self, keys: ArchKeys, handled: tuple[str, ...] = (), *, yarn_log_multiplier: bool = False) -> None:
        """The rope.scaling.* keys llama.cpp reads (linear, yarn; llama3 is a tensor, see
        rope_freqs; dynamic NTK only warns). rope.freq_base is the plugin's: self.theta.
        handled: yarn parameters the plugin writes itself (DeepSeek's mscale), not warned about.
        yarn_log_multiplier: the architecture reads rope.scaling.yarn_log_multiplier as mscale_all_dim
        (Mistral 3), which llama.cpp applies as if mscale were 1."""
        p = self.params
        if self.type == "linear":
            keys.string(Keys.Rope.SCALING_TYPE, "linear")
            keys.f32(Keys.Rope.SCALING_FACTOR, p.get_float("factor", min=0))
        elif self.type == "yarn":
            factor = p.get_float("factor", min=0)
            keys.string(Keys.Rope.SCALING_TYPE, "yarn")
            keys.f32(Keys.Rope.SCALING_FACTOR, factor)
            keys.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, p.get_int("original_max_position_embeddings", min=1))
            keys.f32(Keys.Rope.SCALING_YARN_EXT_FACTOR, p.get_float("extrapolation_factor", default=None))
            attention_factor = p.get_float("attention_factor", "attn_factor", default=None)
            keys.f32(Keys.Rope.SCALING_YARN_ATTN_FACTOR, attention_factor)
            if attention_factor is not None:
                # llama.cpp reads rope.scaling.attn_factor and multiplies it by its own default yarn
                # scale 1 + 0.1 ln(factor); transformers uses attention_factor instead.
                keys.f32(Keys.Rope.SCALING_ATTN_FACTOR, attention_factor / _yarn_default_attention(factor))
            keys.f32(Keys.Rope.SCALING_YARN_BETA_FAST, p.get_float("beta_fast", default=None))
            keys.f32(Keys.Rope.SCALING_YARN_BETA_SLOW, p.get_float("beta_slow", default=None))
            unsupported = {name: p.get(name) for name, value in _LLAMACPP_YARN_BETAS.items()
                           if p.get(name, default=None) not in (None, value)}
            if not p.get_bool("truncate", default=True):
                # ggml always rounds the correction range to whole dimensions (gpt-oss asks not to)
                unsupported["truncate"] = False
            mscale, mscale_all_dim = (p.get_float(name, default=None) for name in ("mscale", "mscale_all_dim"))
            if yarn_log_multiplier and attention_factor is None and mscale == 1 and mscale_all_dim:
                # transformers' yarn attention factor (1 + 0.1 ln s) / (1 + 0.1 mscale_all_dim ln s)
                keys.f32(Keys.Rope.SCALING_YARN_LOG_MUL, mscale_all_dim)
            else:
                unsupported.update({name: p.get(name) for name in ("mscale", "mscale_all_dim")
                                    if name not in handled and p.get(name, default=None)})
            if unsupported:
                log.warning("%s: llama.cpp ignores yarn %s; its rope will differ from transformers'",
                            p.label, unsupported)
        elif self.type == "llama3":
            pass  # expressed as the rope_freqs tensor, see rope_freqs()
        elif self.type == "longrope":
            # the factors are tensors (see rope_freqs); llama.cpp picks the long set when the
            # context it is given exceeds original_context_length, as transformers does per prompt
            keys.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, p.get_int("original_max_position_embeddings", min=1))
            keys.f32(Keys.Rope.SCALING_ATTN_FACTOR, self.longrope_attention_factor())
        elif self.type == "dynamic":
            # NTK scaling that transformers applies only beyond max_position_embeddings; llama.cpp
            # has no equivalent, so the file runs the same only within the trained context.
            log.warning("%s: llama.cpp has no dynamic NTK rope scaling; the model matches transformers "
                        "only up to max_position_embeddings tokens", p.label)
        elif self.type != "default":
            raise ConversionError(f"{p.label}: rope type {self.type!r} is not supported "
                                  "(supported: default, linear, yarn, llama3, longrope, dynamic)")

    def longrope_attention_factor(self) -> float:
        """The scale LongRoPE applies to cos and sin (transformers' attention_scaling): the config's
        attention_factor, else sqrt(1 + ln(s) / ln(original context)) for the context extension s
        (`factor`, else max_position_embeddings / original_max_position_embeddings)."""
        p = self.params
        given = p.get_float("attention_factor", default=None, min=0)
        if given is not None:
            return given
        # PhiMoE names its own: short_mscale within the original context, long_mscale beyond.
        short_mscale = p.get_float("short_mscale", default=None, min=0)
        if short_mscale is not None:
            if p.get_float("long_mscale", default=short_mscale, min=0) != short_mscale:
                log.warning("%s: llama.cpp has one LongRoPE attention factor; short_mscale is written, so beyond "
                            "original_max_position_embeddings the model differs from transformers", p.label)
            return short_mscale
        original = p.get_int("original_max_position_embeddings", min=1)
        scale = p.get_float("factor", default=None, min=0) or self.config.get_int("max_position_embeddings", min=1) / original
        return 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original))

    def rope_freqs(self, rotary_dims: int) -> dict[str, LazyTensor]:
        """Rope scaling that llama.cpp reads as tensors: llama3's rope_freqs, LongRoPE's long and
        short factors (one divisor per rotated pair each); {} for every other rope type."""
        p = self.params
        if self.type == "longrope":
            return {name: LazyTensor.from_array(self._longrope_factors(field, rotary_dims), source=f"{p.label}.{field}")
                    for name, field in ((ROPE_FACTORS_LONG, "long_factor"), (ROPE_FACTORS_SHORT, "short_factor"))}
        if self.type != "llama3":
            return {}
        factors = llama3_rope_factors(
            rotary_dims, rope_theta=p.get_float("rope_theta", min=0), factor=p.get_float("factor", min=0),
            low_freq_factor=p.get_float("low_freq_factor", min=0), high_freq_factor=p.get_float("high_freq_factor", min=0),
            original_max_position_embeddings=p.get_int("original_max_position_embeddings", min=1))
        return {ROPE_FREQS: LazyTensor.from_array(factors, source=f"{p.label} (llama3)")}

    def _longrope_factors(self, field: str, rotary_dims: int) -> np.ndarray:
        values = self.params.get_list(field)
        if len(values) != rotary_dims // 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise self.params.error(field, values, f"{rotary_dims // 2} numbers (one per rotated pair), not {len(values)}")
        return np.asarray(values, dtype=np.float32)


def rotary_halves_to_pairs(tensor: LazyTensor, n_head: int) -> LazyTensor:
    """Reorder the output rows of a q or k projection for GGML's normal (non-NeoX) rope.

    HF rotates row i of each head with row i + head_dim/2 (rotate_half); GGML's normal rope rotates
    rows 2i and 2i+1. So within each head, rows [first half | second half] become interleaved
    (h0, s0, h1, s1, ...). Works for the weight (rows, cols) and the bias (rows,).
    """
    rows = tensor.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"{tensor.source}: {rows} rows do not split into {n_head} heads of even size")
    half = rows // n_head // 2
    rest = tensor.shape[1:]

    def interleave(a: np.ndarray) -> np.ndarray:
        return a.reshape(n_head, 2, half, *rest).swapaxes(1, 2).reshape(rows, *rest)

    return tensor.map(interleave)


def llama3_rope_factors(head_dim: int, rope_theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: int) -> np.ndarray:
    """Llama 3.1's frequency scaling as the per-dimension divisors llama.cpp applies to its rope
    frequencies (rope_freqs.weight): 1 for short wavelengths, `factor` for long ones, and a smooth
    interpolation in between (Meta's reference implementation, `apply_scaling`). Equal low and
    high factors (Llama 4 Scout's) leave nothing in between: `factor` from the one boundary on."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = np.float32(1.0) / np.power(np.float32(rope_theta), exponent)
    wavelen = np.float32(2 * math.pi) / freqs
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    if high_freq_factor == low_freq_factor:
        between = np.full_like(wavelen, np.float32(factor))
    else:
        smooth = (np.float32(original_max_position_embeddings) / wavelen - np.float32(low_freq_factor)) / np.float32(
            high_freq_factor - low_freq_factor
        )
        between = np.float32(1.0) / ((np.float32(1.0) - smooth) / np.float32(factor) + smooth)
    divisors = np.where(wavelen < high_freq_wavelen, np.float32(1.0), np.where(wavelen > low_freq_wavelen, np.float32(factor), between))
    return divisors.astype(np.float32)


def _yarn_default_attention(factor: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
