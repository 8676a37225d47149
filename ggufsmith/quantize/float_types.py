"""F32, F16 and BF16: element-wise conversions, rounding as ggml does."""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.registry import QuantFormat, register


def _may_contain_nan(rows: np.ndarray) -> bool:
    """False only if no value is NaN. A sum is one fast pass and turns any NaN into NaN (it may
    also make NaN from Inf - Inf: then the caller's exact check runs for nothing, which is fine)."""
    with np.errstate(all="ignore"):
        return bool(np.isnan(np.add.reduce(rows, axis=None)))


def _f32_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return rows.astype("<f4", copy=False).view(np.uint8)


def _f32_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    return np.ascontiguousarray(data).view("<f4").astype(np.float32, copy=False)


def _f16_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    # numpy rounds to nearest even, as ggml's fp32_to_fp16 does, overflow to Inf included. ggml
    # turns every NaN into the canonical quiet NaN 0x7E00 (sign kept); numpy keeps the payload.
    with np.errstate(over="ignore"):
        half = rows.astype("<f2").view("<u2")
    if _may_contain_nan(rows):
        is_nan = np.isnan(rows)
        sign = (rows.view(np.uint32)[is_nan] >> 16).astype(np.uint16) & np.uint16(0x8000)
        half[is_nan] = sign | np.uint16(0x7E00)
    return half.view(np.uint8)


def _f16_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    values = np.ascontiguousarray(data).view("<f2").astype(np.float32)
    # ggml widens through a float multiply, which quiets signalling NaNs; numpy keeps them signalling.
    bits = values.view(np.uint32)
    bits[np.isnan(values)] |= np.uint32(0x00400000)
    return values


def bf16_from_f32(rows: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (uint16) as ggml_compute_fp32_to_bf16: nearest even, NaN kept quiet."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    bits = rows.view(np.uint32)
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits  # uint32 wrap-around only for NaN, which is replaced below
    rounded >>= 16
    out = rounded.astype(np.uint16)
    if _may_contain_nan(rows):
        is_nan = np.isnan(rows)
        out[is_nan] = ((bits[is_nan] >> 16) | 64).astype(np.uint16)
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits).astype(np.uint32) << 16).view(np.float32)


def _bf16_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return bf16_from_f32(rows).astype("<u2", copy=False).view(np.uint8)


def _bf16_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    return bf16_to_f32(np.ascontiguousarray(data).view("<u2"))


register(QuantFormat(GGMLType.F32, _f32_quantize, _f32_dequantize, checks_finite=False))
register(QuantFormat(GGMLType.F16, _f16_quantize, _f16_dequantize, checks_finite=False))
register(QuantFormat(GGMLType.BF16, _bf16_quantize, _bf16_dequantize, checks_finite=False))
