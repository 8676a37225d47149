"""MXFP4's own edges, beyond the data sets every low-bit type meets in test_quantize_low_bit.py:
the E8M0 exponent taken from the float32 log2f of the block maximum (which rounds up to a power
of two from a few ulps below it), exponents that wrap below 2**-125, every decoded scale, and the
nearest-level ties. The oracle is ggml (tests/ggml_oracle.py)."""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize import dequantize
from tests.ggml_oracle import ggml_dequantize
from tests.quant_checks import assert_same_floats, check_against_ggml

MXFP4 = GGMLType.MXFP4


def _around_every_power_of_two(ulps: int) -> np.ndarray:
    """Every positive finite float32 within `ulps` ulps of 2**k, for every k from -149 to 127."""
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32).view(np.int32)
    bits = (powers[:, None] + np.arange(-ulps, ulps + 1, dtype=np.int32)).reshape(-1)
    values = bits.view(np.float32)
    return values[(values > 0) & np.isfinite(values)]


def test_block_exponent_matches_ggml_around_every_power_of_two():
    """The block maximum a few ulps below 2**k: log2f rounds to k for large |k| and not for small,
    and ggml's exponent follows the rounded value. Below 2**-125 the exponent wraps."""
    amax = _around_every_power_of_two(48)
    rows = np.zeros((amax.size, 32), np.float32)
    rows[:, 3] = amax
    rows[:, 20] = -amax * np.float32(0.61)
    rows[:, 31] = amax * np.float32(0.13)
    check_against_ggml(rows, MXFP4, None, "maximum near a power of two")
    check_against_ggml(-rows, MXFP4, None, "negative maximum near a power of two")


def test_values_on_every_tie_between_levels_match_ggml():
    """Midpoints between neighbouring E2M1 levels, and a few ulps either side, at many scales."""
    levels = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    midpoints = (levels[:-1] + levels[1:]) / np.float32(2)
    near = (midpoints.view(np.int32)[:, None] + np.arange(-2, 3, dtype=np.int32)).reshape(-1).view(np.float32)
    values = np.concatenate([near, levels, -near, -levels])
    rng = np.random.default_rng(39)
    blocks = rng.choice(values, (4096, 32)).astype(np.float32)
    blocks[:, 0] = np.float32(6)  # pins the exponent: the block maximum sets the scale 2**(e - 127)
    scales = np.ldexp(np.float32(1), rng.integers(-140, 120, (4096, 1))).astype(np.float32)
    check_against_ggml(blocks * scales, MXFP4, None, "values on level ties")


def test_every_exponent_byte_decodes_as_ggml_does():
    """All 256 E8M0 bytes with every code, including the subnormal scales of e = 0, 1 and the
    scales so large (e >= 253) that big levels overflow to Inf."""
    exponents = np.repeat(np.arange(256, dtype=np.uint8), 2)
    codes = np.tile(np.array([0x10 * (j % 16) + j % 16 for j in range(16)], np.uint8), (512, 1))
    codes[1::2] = codes[1::2][:, ::-1]
    data = np.concatenate([exponents[:, None], codes], axis=1)
    assert_same_floats(
        dequantize(data, MXFP4, (512, 32)), ggml_dequantize(data, int(MXFP4), 512 * 32), "MXFP4 every exponent"
    )
