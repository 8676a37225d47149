"""IQ2_XXS, IQ2_XS and IQ2_S: groups of 8 magnitudes on a 256-, 512- or 1024-point grid of
levels 0..2, as ggml's quantize_row_iq2_{xxs,xs,s}_impl make them. IQ2_XXS and IQ2_XS store 7 sign
bits per 8 values (even parity) and need an importance matrix (ggml asserts on its absence, we
refuse); IQ2_S stores 8 sign bits and works without one.

The search (iq_grid_search.py), sigma2 = sum(x^2) / 256 over the super-block:
- IQ2_XXS, blocks of 32: the first scale is make_qp_quants(levels 0..4)'s; trial scales
  (5 + 0.1 * is) / (3 * that scale) for is in -6 .. 6; then, if the scale is positive, every group
  is rounded again at it and the scale refitted. A block whose first scale is not positive stays
  empty, as one below 1e-15.
- IQ2_XS and IQ2_S, blocks of 16: trial scales (5 + 0.1 * is) / max for is in -9 .. 9; then the
  groups of the winner that were off the grid are rounded again and the scale refitted. IQ2_S
  takes sigma2 = 2 * sum(x^2) / 256, weights 0.25 * sigma2 + x^2 without an imatrix, and only the
  nearest neighbours.
Super-block: d = max block scale / 31 as float16 (IQ2_S: d * 0.9875), 4-bit block scales
nearest_int((scale / d - 1) / 2).

Layouts (ggml-common.h): IQ2_XXS = float16 d, then per block of 32 a uint32 of four 8-bit grid
indices and a uint32 of four 7-bit signs and the 4-bit scale at bit 28. IQ2_XS = float16 d, a
uint16 per group (9-bit grid index, 7 sign bits above), a byte of two 4-bit scales per 32 values.
IQ2_S = float16 d, the low 8 bits of the 32 grid indices, the 32 sign bytes, a byte of the high 2
bits of 4 indices per 32 values, and the scales as IQ2_XS.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.constants import QK_K, GGMLType
from ggufsmith.quantize.iq_grid_search import (
    GridSearch,
    block_inputs,
    even_parity_negatives,
    new_super_blocks,
    read_super_blocks,
    search_blocks,
    sign_bits,
    signed,
    signs_and_magnitudes,
    super_scales,
)
from ggufsmith.quantize.iq_grids import iq2_grid
from ggufsmith.quantize.numerics import F32, GROUP_MAX_EPS, float_warnings_off, transposed
from ggufsmith.quantize.registry import QuantFormat, register
from ggufsmith.quantize.search_affine import make_qp_quants

GROUP = 8
_IQ2_XXS_BLOCK = 32
_IQ2_XS_BLOCK = 16
_IQ2_XXS_BYTES = 2 + QK_K // 4
_IQ2_XS_BYTES = 2 + QK_K // 4 + QK_K // 32
_IQ2_S_BYTES = 2 + QK_K // 4 + QK_K // 16
_IQ2_S_EPS = F32(1e-8)  # GROUP_MAX_EPS_IQ2_S
# What levels 0, 1, 2 decode to (ggml's iq2xxs_grid / iq2xs_grid bytes); the stored scale's
# 0.25 brings them back to the fitted values 1, 3, 5 (roughly: 8/4 = 2 * 1, 25/4 ~ 2 * 3, ...).
_DECODED = np.array([8, 25, 43], dtype=F32)

_IQ2_XXS_SEARCH = GridSearch(lambda: iq2_grid(256), group=GROUP, bits=2, max_level=2, center=5, step=0.1,
                             trials=6, start_on_grid=False, refit_all=True, always_refit=True)
_IQ2_XS_SEARCH = GridSearch(lambda: iq2_grid(512), group=GROUP, bits=2, max_level=2, center=5, step=0.1,
                            trials=9, start_on_grid=True, refit_all=False)
_IQ2_S_SEARCH = GridSearch(lambda: iq2_grid(1024), group=GROUP, bits=2, max_level=2, center=5, step=0.1,
                           trials=9, start_on_grid=True, refit_all=False)


def _quantize_blocks(rows: np.ndarray, importance: np.ndarray | None, ggml_type: GGMLType):
    """(block scales [blocks], grid indices int32 [groups per block, blocks], sign bytes [groups per
    block, blocks], searched blocks bool [blocks])."""
    xxs, s = ggml_type == GGMLType.IQ2_XXS, ggml_type == GGMLType.IQ2_S
    spec = {GGMLType.IQ2_XXS: _IQ2_XXS_SEARCH, GGMLType.IQ2_XS: _IQ2_XS_SEARCH, GGMLType.IQ2_S: _IQ2_S_SEARCH}[ggml_type]
    block = _IQ2_XXS_BLOCK if xxs else _IQ2_XS_BLOCK
    x, weight = block_inputs(rows, importance, block, doubled_sigma2=s, sigma2_floor=s)
    xval, signs = signs_and_magnitudes(x, weight, even_parity=not s)
    block_max = np.maximum.reduce(xval, axis=0)
    active = ~(block_max < (_IQ2_S_EPS if s else GROUP_MAX_EPS))
    first_levels = np.zeros(xval.shape, dtype=np.int32)
    if xxs:  # the first scale and levels are make_qp_quants' (levels 0..4: kept only in degenerate cases)
        first_scale = np.zeros(block_max.size, dtype=F32)
        b = np.flatnonzero(active)
        if b.size:
            first_scale[b], first_levels[:, b] = make_qp_quants(xval[:, b], 4, weight[:, b])
        base = first_scale * F32(3)  # eff_max
        active &= ~(base <= 0)
    else:
        first_scale, base = block_max / F32(5), block_max
    scales, index = search_blocks(spec, ggml_type.name, active, weight, xval, signs, not s, base, first_scale, first_levels)
    signs[:, ~active] = 0  # ggml skips an empty block before storing its signs
    return scales, index, signs, active


def _scale_nibbles(block_levels: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """Two 4-bit block scales per byte, even blocks low; 0 where ggml stores none."""
    low = np.where(nonzero[:, None], block_levels, 0).astype(np.uint8)
    return low[:, 0::2] | (low[:, 1::2] << 4)


def _nibble_scales(packed: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's d * (0.5 + nibble) * 0.25 for every block of 16, [supers, 16]."""
    nibbles = np.stack([packed & 15, packed >> 4], axis=2).reshape(packed.shape[0], -1)
    return d[:, None] * (F32(0.5) + nibbles.astype(F32)) * F32(0.25)


def _decoded_values(index: np.ndarray, grid_size: int) -> np.ndarray:
    return _DECODED[iq2_grid(grid_size).levels[index]]


# --- IQ2_XXS -----------------------------------------------------------------------------------


@float_warnings_off
def _iq2_xxs_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, GGMLType.IQ2_XXS)
    per_super = QK_K // _IQ2_XXS_BLOCK
    d, block_levels, nonzero = super_scales(scales, active, per_super)
    n_super = d.size
    signs = transposed(signs).astype(np.uint32)  # [blocks, 4]
    words = np.empty((signs.shape[0], 2), dtype="<u4")
    words[:, 0] = transposed(index).astype(np.uint8).copy().view("<u4")[:, 0]
    words[:, 1] = signs[:, 0] | (signs[:, 1] << 7) | (signs[:, 2] << 14) | (signs[:, 3] << 21)
    words = words.reshape(n_super, per_super, 2)
    words[:, :, 1] |= block_levels.astype(np.uint32) << 28
    out = new_super_blocks(np.where(nonzero, d, F32(0)), _IQ2_XXS_BYTES)
    out[:, 2:] = words.view(np.uint8).reshape(n_super, -1)
    out[~nonzero, 2:] = 0  # ggml clears the super-block's quants when every block scale is 0
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq2_xxs_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ2_XXS_BYTES)
    per_super = QK_K // _IQ2_XXS_BLOCK
    quants = blocks[:, 2:].reshape(-1, per_super, 2, 4)
    index = quants[:, :, 0, :]  # [supers, 8, 4]
    words = quants[:, :, 1, :].copy().view("<u4")[..., 0]  # [supers, 8]
    db = d[:, None] * (F32(0.5) + (words >> 28).astype(F32)) * F32(0.25)
    negative = even_parity_negatives((words[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127)
    values = db[:, :, None, None] * _decoded_values(index, 256)  # [supers, 8, 4, 8]
    return signed(values, negative).reshape(data.shape[0], row_length)


# --- IQ2_XS ------------------------------------------------------------------------------------


@float_warnings_off
def _iq2_xs_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, GGMLType.IQ2_XS)
    per_super = QK_K // _IQ2_XS_BLOCK
    d, block_levels, nonzero = super_scales(scales, active, per_super)
    n_super = d.size
    codes = transposed(index | (signs.astype(np.int32) << 9)).astype("<u2")  # [blocks, 2]
    out = new_super_blocks(np.where(nonzero, d, F32(0)), _IQ2_XS_BYTES)
    out[:, 2 : 2 + QK_K // 4] = codes.view(np.uint8).reshape(n_super, -1)
    out[~nonzero, 2 : 2 + QK_K // 4] = 0
    out[:, 2 + QK_K // 4 :] = _scale_nibbles(block_levels, nonzero)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq2_xs_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ2_XS_BYTES)
    codes = blocks[:, 2 : 2 + QK_K // 4].copy().view("<u2").reshape(-1, QK_K // 16, 2)  # [supers, 16, 2]
    db = _nibble_scales(blocks[:, 2 + QK_K // 4 :], d)
    negative = even_parity_negatives(codes >> 9)
    values = db[:, :, None, None] * _decoded_values(codes & 511, 512)  # [supers, 16, 2, 8]
    return signed(values, negative).reshape(data.shape[0], row_length)


# --- IQ2_S -------------------------------------------------------------------------------------


@float_warnings_off
def _iq2_s_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, GGMLType.IQ2_S)
    per_super = QK_K // _IQ2_XS_BLOCK
    d, block_levels, nonzero = super_scales(scales, active, per_super)
    n_super = d.size
    index = transposed(index).reshape(n_super, QK_K // GROUP)  # group i8 = 2 * block + k
    index[~active.reshape(n_super, per_super).repeat(2, axis=1)] = 0
    out = new_super_blocks(np.where(nonzero, d * F32(0.9875), F32(0)), _IQ2_S_BYTES)
    out[:, 2:34] = (index & 255).astype(np.uint8)
    out[:, 34:66] = transposed(signs).reshape(n_super, -1)
    high = ((index >> 8) & 3).reshape(n_super, QK_K // 32, 4) << (2 * np.arange(4))
    out[:, 66:74] = high.sum(axis=2).astype(np.uint8)
    out[:, 74:82] = _scale_nibbles(block_levels, nonzero)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq2_s_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ2_S_BYTES)
    high = (blocks[:, 66:74, None].astype(np.int32) >> (2 * np.arange(4))) & 3  # [supers, 8, 4]
    index = blocks[:, 2:34].astype(np.int32) | (high.reshape(-1, QK_K // GROUP) << 8)
    db = _nibble_scales(blocks[:, 74:82], d)  # [supers, 16]
    negative = sign_bits(blocks[:, 34:66]).reshape(-1, QK_K // 16, 2, 8)
    values = db[:, :, None, None] * _decoded_values(index, 1024).reshape(-1, QK_K // 16, 2, 8)
    return signed(values, negative).reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.IQ2_XXS, _iq2_xxs_quantize, _iq2_xxs_dequantize, supports_importance=True, requires_importance=True))
register(QuantFormat(GGMLType.IQ2_XS, _iq2_xs_quantize, _iq2_xs_dequantize, supports_importance=True, requires_importance=True))
register(QuantFormat(GGMLType.IQ2_S, _iq2_s_quantize, _iq2_s_dequantize, supports_importance=True))
