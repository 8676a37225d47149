"""MXFP4: the OCP microscaling 4-bit float format, as ggml's quantize_row_mxfp4_ref and
dequantize_row_mxfp4 make and read it.

A block of 32 values is one E8M0 byte e (a bare power-of-two exponent) and 32 four-bit codes. A
code's low three bits index the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and its top bit is the
sign. ggml keeps the magnitudes doubled, as the small integers 0, 1, 2, 3, 4, 6, 8, 12, and halves
the scale instead: a code decodes to level * 2**(e - 128), exact in float32 (or Inf where e is so
large that the product overflows, which a quantizer never writes but a file may hold).

Quantizing (ggml ignores an importance matrix; so do we):
- amax = the block's largest magnitude; e = floor(log2f(amax)) - 2 + 127, converted to a byte, or 0
  for an all-zero block. In units of 2**(e - 127), amax is then in [4, 8): values beyond 6, the
  largest E2M1 magnitude, are written as 6.
- every value takes the first code, in table order (+0, +levels, -0, -levels), whose doubled level
  times 2**(e - 128) is nearest to it in float32: ties go to the smaller magnitude, and a negative value that rounds to
  zero is written as +0 (code 0).

Two details of the C code matter at the edges, and both are reproduced:
- floor(log2f(amax)) is taken on the float32 logarithm, so an amax a few ulps below a power of two
  can round up to it. We compute log2 in float64 and round it to float32, which is what a correctly
  rounded log2f returns.
- For amax below 2**-125 the exponent is negative, and the C cast to uint8_t keeps its low byte
  (x86-64 converts through a 32-bit integer; the tests check it against the compiled ggml). The
  scale is then enormous and every value of the block is written as code 0.

Layout (ggml-common.h's block_mxfp4): e, then qs[16]; byte j holds value j in its low nibble and
value j + 16 in its high nibble.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize.numerics import F32, float_warnings_off
from ggufsmith.quantize.registry import QuantFormat, register

BLOCK = 32
BLOCK_BYTES = 1 + BLOCK // 2
# The E2M1 magnitudes doubled, in code order; code | 8 is the same magnitude negated.
MAGNITUDES = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=F32)
# Every code's doubled value, as ggml's kvalues_mxfp4 table holds them: code 8 ("-0") is +0.
CODE_VALUES = np.concatenate([MAGNITUDES, -MAGNITUDES]) + F32(0)
# E8M0 byte e means 2**(e - 127); halved, to pair with the doubled magnitudes: 2**(e - 128).
_HALF_SCALES = np.ldexp(F32(1), np.arange(256) - 128).astype(F32)


def exponent_bytes(amax: np.ndarray) -> np.ndarray:
    """The E8M0 byte ggml writes for blocks whose largest magnitude is amax (finite, >= 0)."""
    log2 = np.log2(amax.astype(np.float64), where=amax > 0, out=np.zeros(amax.shape)).astype(F32)
    exponent = np.floor(log2).astype(np.int32) + (127 - 2)
    exponent[amax == 0] = 0
    return (exponent & 0xFF).astype(np.uint8)


def nearest_codes(values: np.ndarray, half_scale: np.ndarray) -> np.ndarray:
    """best_index_mxfp4 for every value: the first code in table order with the least
    |code value * half_scale - value| in float32.

    A negative table entry is never strictly nearer to a value >= 0 than its positive twin, which
    comes first, and for a value < 0 the positive entries are no nearer than +0: so the search is
    over the eight magnitudes against |value|, and the sign bit is set afterwards for negative
    values whose nearest level is not zero.

    Over the ascending magnitudes the float32 distances fall, then rise (weakly: rounding is
    monotone, so it keeps the order of the exact distances but may make neighbours equal). The
    first least one is therefore the last magnitude whose distance is strictly below its
    predecessor's (or the first, if none is): a running maximum, with no per-element selects."""
    magnitude = np.abs(values)
    previous = magnitude.copy()  # the distance to level 0
    distance = np.empty_like(magnitude)
    fell = np.empty(magnitude.shape, dtype=bool)
    codes = np.zeros(magnitude.shape, dtype=np.uint8)
    for code in range(1, MAGNITUDES.size):
        np.multiply(MAGNITUDES[code], half_scale, out=distance)
        np.subtract(distance, magnitude, out=distance)
        np.abs(distance, out=distance)
        np.less(distance, previous, out=fell)
        np.maximum(codes, fell.view(np.uint8) * np.uint8(code), out=codes)
        previous, distance = distance, previous
    negative = (values < 0) & (codes > 0)
    codes |= negative.view(np.uint8) << np.uint8(3)
    return codes


@float_warnings_off
def _quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    blocks = rows.reshape(-1, BLOCK)
    exponents = exponent_bytes(np.abs(blocks).max(axis=1))
    codes = nearest_codes(blocks, _HALF_SCALES[exponents][:, None])
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, 0] = exponents
    out[:, 1:] = codes[:, : BLOCK // 2] | (codes[:, BLOCK // 2 :] << 4)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, BLOCK_BYTES)
    half_scale = _HALF_SCALES[blocks[:, 0]][:, None]
    packed = blocks[:, 1:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=1)
    return (CODE_VALUES[codes] * half_scale).reshape(data.shape[0], row_length)


def _invalid_rows(data: np.ndarray) -> np.ndarray:
    """Rows with an exponent byte of 0xFF: NaN in E8M0, which ggml decodes as 2**127 but its
    ggml_validate_row_data (and so llama-quantize reading a file) rejects."""
    return (data.reshape(data.shape[0], -1, BLOCK_BYTES)[:, :, 0] == 0xFF).any(axis=1)


register(QuantFormat(GGMLType.MXFP4, _quantize, _dequantize, supports_importance=True, invalid_rows=_invalid_rows))
