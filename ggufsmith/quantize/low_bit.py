"""Q1_0 and Q2_0: 1- and 2-bit values times one float16 scale per block, as ggml's
quantize_row_q1_0_ref / q2_0_ref make them.

Q1_0 (blocks of 128) keeps each value's sign, 1 bit, and d = mean |x|: x >= 0 (-0.0 included)
decodes to +d, the rest to -d. Q2_0 (blocks of 64) stores round(x / amax) + 1 in 2 bits, decoded
as (q - 1) * d, so levels -d, 0, +d (ggml's rounding never writes the level 2d). ggml ignores an
importance matrix for both; so do we.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.numerics import F32, float_warnings_off, fp16_bits, fp16_value, position_major, sum_from_zero
from ggufsmith.quantize.registry import QuantFormat, register
from ggufsmith.quantize.ternary import unit_trits

Q1_BLOCK = 128
Q2_BLOCK = 64


def _scale_bytes(d: np.ndarray) -> np.ndarray:
    return fp16_bits(d).view(np.uint8).reshape(d.size, 2)


def _scale_of(blocks: np.ndarray) -> np.ndarray:
    """The block's float16 d as GGML_FP16_TO_FP32 gives it. ggml's conversion ends in a float
    multiplication, which quiets a signaling NaN; numpy's keeps it signaling. Q1_0 decodes to d
    itself, with no arithmetic that would quiet it later, so do it here (* 1 changes nothing else)."""
    return fp16_value(np.ascontiguousarray(blocks[:, :2]).view(np.uint16)[:, 0]) * F32(1)


@float_warnings_off
def _q1_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    # ggml sums |x| in index order, then divides by 128 (exact but for subnormal results).
    d = sum_from_zero(np.abs(position_major(rows, Q1_BLOCK))) / F32(Q1_BLOCK)
    blocks = rows.reshape(-1, Q1_BLOCK)
    out = np.empty((blocks.shape[0], 2 + Q1_BLOCK // 8), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    out[:, 2:] = np.packbits(blocks >= 0, axis=1, bitorder="little")
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _q1_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + Q1_BLOCK // 8)
    d = _scale_of(blocks)[:, None]
    signs = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little").astype(bool)
    return np.where(signs, d, -d).reshape(data.shape[0], row_length)


@float_warnings_off
def _q2_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    blocks = rows.reshape(-1, Q2_BLOCK)
    d = np.abs(blocks).max(axis=1)
    inverse = np.zeros_like(d)
    np.divide(F32(1), d, out=inverse, where=d > 0)
    # (int)roundf(Inf or NaN) is INT_MIN on x86, which the clamp to 0..3 makes level 0.
    levels = unit_trits(blocks * inverse[:, None], nonfinite_trit=0).reshape(-1, Q2_BLOCK // 4, 4)
    out = np.empty((blocks.shape[0], 2 + Q2_BLOCK // 4), dtype=np.uint8)
    out[:, :2] = _scale_bytes(d)
    out[:, 2:] = levels[..., 0] | (levels[..., 1] << 2) | (levels[..., 2] << 4) | (levels[..., 3] << 6)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _q2_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, 2 + Q2_BLOCK // 4)
    d = _scale_of(blocks)[:, None]
    levels = (blocks[:, 2:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
    values = (levels.reshape(blocks.shape[0], Q2_BLOCK).astype(np.int8) - np.int8(1)).astype(F32) * d
    return values.reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.Q1_0, _q1_0_quantize, _q1_0_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.Q2_0, _q2_0_quantize, _q2_0_dequantize, supports_importance=True))
