"""F32, F16 and BF16: element-wise conversions, rounding as ggml does."""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.registry import QuantFormat, register


def _f32_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return rows.astype("<f4", copy=False).view(np.uint8)


def _f32_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    return np.ascontiguousarray(data).view("<f4").astype(np.float32, copy=False)


def _f16_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    # numpy rounds to nearest even, as ggml's F16C / fp32_to_fp16 path does.
    return rows.astype("<f2").view(np.uint8)


def _f16_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    return np.ascontiguousarray(data).view("<f2").astype(np.float32)


def bf16_from_f32(rows: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (uint16) as ggml_compute_fp32_to_bf16: nearest even, NaN kept quiet."""
    bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    quiet_nan = (bits >> 16) | 64
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits).astype(np.uint32) << 16).view(np.float32)


def _bf16_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return bf16_from_f32(rows).astype("<u2", copy=False).view(np.uint8)


def _bf16_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    return bf16_to_f32(np.ascontiguousarray(data).view("<u2"))


register(QuantFormat(GGMLType.F32, _f32_quantize, _f32_dequantize, checks_finite=False))
register(QuantFormat(GGMLType.F16, _f16_quantize, _f16_dequantize, checks_finite=False))
register(QuantFormat(GGMLType.BF16, _bf16_quantize, _bf16_dequantize, checks_finite=False))
