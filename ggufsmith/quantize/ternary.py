"""TQ1_0 and TQ2_0: ternary super-blocks of 256 values in {-d, 0, +d} (BitNet b1.58, TriLMs).

Both follow ggml's quantize_row_tq{1,2}_0_ref: d is the block's largest magnitude, every value
becomes round(x / d) in {-1, 0, 1}, stored as a trit 0, 1, 2. They differ in the packing:
TQ2_0 spends 2 bits per trit; TQ1_0 packs five trits per byte (base 3, scaled to 0..255 so that
a multiplication extracts them) and four in each of its last four bytes. ggml ignores an
importance matrix for both; so do we.

Block layouts (ggml-common.h): TQ1_0 = qs[48], qh[4], float16 d; TQ2_0 = qs[64], float16 d.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.numerics import F32, float_warnings_off, fp16_bits, fp16_value
from ggufsmith.quantize.registry import QuantFormat, register

# TQ1_0's qs: 32 bytes of 5 trits (values 0..159), then 16 bytes of 5 trits (values 160..239);
# qh: 4 bytes of 4 trits (values 240..255).
_TQ1_WIDE, _TQ1_NARROW, _TQ1_HIGH = 32, 16, 4
_TQ1_QS = _TQ1_WIDE + _TQ1_NARROW
_TQ1_BYTES = _TQ1_QS + _TQ1_HIGH + 2
_TQ2_QS = QK_K // 4
_TQ2_BYTES = _TQ2_QS + 2
_HALF = F32(0.5)


def unit_trits(scaled: np.ndarray, nonfinite_trit: int) -> np.ndarray:
    """ggml's `lroundf(v) + 1` (or `(int)roundf(v) + 1` clamped to 0..3) as uint8, for values
    |v| <= 1 (x times 1/amax, maybe a rounding above 1): 0, 1 or 2, halves away from zero.

    1/amax is Inf for a subnormal amax, and v Inf or NaN: the x86 float-to-int conversion then
    gives the integer minimum, which the callers' arithmetic turns into `nonfinite_trit`."""
    trits = np.ones(scaled.shape, dtype=np.uint8)
    trits += scaled >= _HALF
    trits -= scaled <= -_HALF
    nonfinite = ~np.isfinite(scaled)
    if nonfinite.any():
        trits[nonfinite] = nonfinite_trit
    return trits


def ternary_trits(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d float32[blocks], trits uint8[blocks, 256]) of quantize_row_tq*_0_ref.

    d is the largest |x| (no tie rule needed: only its magnitude is used) and 1/d is taken in
    float32 before the multiplication, as ggml does. lroundf of Inf or NaN is LONG_MIN, and
    `(int)(LONG_MIN + 1)` is 1: such values become trit 1 (zero)."""
    blocks = rows.reshape(-1, QK_K)
    d = np.abs(blocks).max(axis=1)
    inverse = np.zeros_like(d)
    np.divide(F32(1), d, out=inverse, where=d != 0)
    return d, unit_trits(blocks * inverse[:, None], nonfinite_trit=1)


# --- TQ1_0 -----------------------------------------------------------------------------------


def _base3_bytes(trits: np.ndarray) -> np.ndarray:
    """[..., n_trits, n_bytes] trits -> uint16 [..., n_bytes]: the first trit most significant."""
    packed = np.zeros(trits.shape[:-2] + trits.shape[-1:], dtype=np.uint16)
    for n in range(trits.shape[-2]):
        packed *= 3
        packed += trits[..., n, :]
    return packed


def _scaled_to_byte(packed: np.ndarray) -> np.ndarray:
    """ggml's ceiling division q * 256 / 243: the byte whose multiples by 3^n expose each trit in
    their top bits."""
    return ((packed * 256 + 242) // 243).astype(np.uint8)


@float_warnings_off
def _tq1_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, trits = ternary_trits(rows)
    n_blocks = d.size
    wide_end = 5 * _TQ1_WIDE
    narrow_end = wide_end + 5 * _TQ1_NARROW
    out = np.empty((n_blocks, _TQ1_BYTES), dtype=np.uint8)
    out[:, :_TQ1_WIDE] = _scaled_to_byte(_base3_bytes(trits[:, :wide_end].reshape(n_blocks, 5, _TQ1_WIDE)))
    out[:, _TQ1_WIDE:_TQ1_QS] = _scaled_to_byte(
        _base3_bytes(trits[:, wide_end:narrow_end].reshape(n_blocks, 5, _TQ1_NARROW))
    )
    # qh: four trits per byte, then a zero trit so that the first lands in the top position too.
    high = _base3_bytes(trits[:, narrow_end:].reshape(n_blocks, 4, _TQ1_HIGH)) * 3
    out[:, _TQ1_QS : _TQ1_QS + _TQ1_HIGH] = _scaled_to_byte(high)
    out[:, -2:] = fp16_bits(d).view(np.uint8).reshape(n_blocks, 2)
    return out.reshape(rows.shape[0], -1)


_POWERS_OF_3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _unpack_base3(packed: np.ndarray, n_trits: int) -> np.ndarray:
    """uint8 [blocks, n_bytes] -> trits [blocks, n_trits, n_bytes], as ggml decodes them: the byte
    times 3^n (mod 256), times 3, top 8 of 16 bits."""
    shifted = packed[:, None, :] * _POWERS_OF_3[:n_trits, None]  # uint8: wraps as in C
    return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.int8)


def _trit_values(trits: np.ndarray, d: np.ndarray, n_rows: int, row_length: int) -> np.ndarray:
    # ggml: (float)(trit - 1) * d, one rounding.
    values = (trits.reshape(d.size, -1) - np.int8(1)).astype(F32) * d[:, None]
    return values.reshape(n_rows, row_length)


@float_warnings_off
def _tq1_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _TQ1_BYTES)
    d = fp16_value(blocks[:, -2:].copy().view(np.uint16)[:, 0])
    trits = np.concatenate(
        [
            _unpack_base3(blocks[:, :_TQ1_WIDE], 5).reshape(d.size, -1),
            _unpack_base3(blocks[:, _TQ1_WIDE:_TQ1_QS], 5).reshape(d.size, -1),
            _unpack_base3(blocks[:, _TQ1_QS : _TQ1_QS + _TQ1_HIGH], 4).reshape(d.size, -1),
        ],
        axis=1,
    )
    return _trit_values(trits, d, data.shape[0], row_length)


# --- TQ2_0 -----------------------------------------------------------------------------------


@float_warnings_off
def _tq2_0_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    d, trits = ternary_trits(rows)
    n_blocks = d.size
    # Two runs of 128 values; byte m of a run holds values m, m+32, m+64, m+96, lowest bits first.
    runs = trits.reshape(n_blocks, 2, 4, 32)
    packed = runs[:, :, 0] | (runs[:, :, 1] << 2) | (runs[:, :, 2] << 4) | (runs[:, :, 3] << 6)
    out = np.empty((n_blocks, _TQ2_BYTES), dtype=np.uint8)
    out[:, :_TQ2_QS] = packed.reshape(n_blocks, _TQ2_QS)
    out[:, -2:] = fp16_bits(d).view(np.uint8).reshape(n_blocks, 2)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _tq2_0_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks = np.ascontiguousarray(data).reshape(-1, _TQ2_BYTES)
    d = fp16_value(blocks[:, -2:].copy().view(np.uint16)[:, 0])
    packed = blocks[:, :_TQ2_QS].reshape(-1, 2, 1, 32)
    trits = (packed >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3  # [blocks, run, l, m]
    return _trit_values(trits.astype(np.int8), d, data.shape[0], row_length)


register(QuantFormat(GGMLType.TQ1_0, _tq1_0_quantize, _tq1_0_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.TQ2_0, _tq2_0_quantize, _tq2_0_dequantize, supports_importance=True))
