"""F32, F16 and BF16 convert exactly as ggml does: same bytes as ggml_quantize_chunk for every kind
of float32 (NaN with any payload, +-Inf, subnormals, -0.0, rounding ties, overflow), and decoding
equal bit for bit to ggml's to_float over all 65536 half-width patterns."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.quantize import dequantize, quantize
from tests.ggml_oracle import ggml_dequantize, ggml_quantize
from tests.quant_checks import assert_same_bits

FLOAT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16]


def _interesting_float32_bits() -> np.ndarray:
    rng = np.random.default_rng(11)
    special = np.array(
        [
            0x00000000, 0x80000000,  # +-0
            0x7F800000, 0xFF800000,  # +-Inf
            0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7FC0FFFF,  # NaNs
            0x00000001, 0x807FFFFF, 0x00400000,  # float32 subnormals
            0x7F7FFFFF, 0xFF7FFFFF,  # +-FLT_MAX
            0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FFFFF,  # around the float16 overflow threshold
            0x387FC000, 0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF,  # float16 subnormal range, ties
            0x3F808000, 0x3F818000, 0x3F800001, 0x3F807FFF,  # bf16 ties to even, either way
        ],
        dtype=np.uint32,
    )
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    # Values on and next to float16 rounding ties across the whole float16 exponent range.
    halves = np.arange(0, 0x7C00, 7, dtype=np.uint32)
    f32_of_halves = halves.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    ties = np.concatenate([f32_of_halves.astype(np.int64) + 0x1000 + d for d in (-1, 0, 1)]).astype(np.uint32)
    # bf16 ties: the low 16 bits exactly 0x8000, or one either side.
    bf16_ties = (rng.integers(0, 2**16, 5000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    bits = np.concatenate([special, random_bits, ties, ties | np.uint32(0x80000000), bf16_ties, bf16_ties + np.uint32(1), bf16_ties - np.uint32(1)])
    return bits[: bits.size // 64 * 64]


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_every_kind_of_float32(ggml_type):
    bits = _interesting_float32_bits()
    rows = bits.view(np.float32).reshape(-1, 64)
    expected = ggml_quantize(rows, int(ggml_type))
    ours = quantize(rows, ggml_type)
    width = {GGMLType.F32: np.uint32, GGMLType.F16: np.uint16, GGMLType.BF16: np.uint16}[ggml_type]
    assert_same_bits(ours.view(width), expected.view(width), f"{ggml_type.name} quantize")


@pytest.mark.parametrize("ggml_type", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_all_16_bit_patterns(ggml_type):
    data = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    expected = ggml_dequantize(data, int(ggml_type), 2**16)
    ours = dequantize(data, ggml_type, (256, 256))
    assert_same_bits(ours.view(np.uint32), expected.view(np.uint32), f"{ggml_type.name} dequantize")


def test_f32_round_trip_keeps_every_bit():
    # ggml has no to_float for F32: its data is the float32 itself, NaN payloads and -0.0 included.
    bits = _interesting_float32_bits()
    stored = ggml_quantize(bits.view(np.float32).reshape(-1, 64), int(GGMLType.F32))
    assert_same_bits(dequantize(stored, GGMLType.F32, (bits.size // 64, 64)).view(np.uint32), bits, "F32 dequantize")


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_types_accept_any_row_length(ggml_type):
    rows = np.random.default_rng(0).standard_normal((3, 7), dtype=np.float32)
    expected = ggml_quantize(rows, int(ggml_type))
    assert_same_bits(quantize(rows, ggml_type), expected.reshape(-1), f"{ggml_type.name} rows of 7")
