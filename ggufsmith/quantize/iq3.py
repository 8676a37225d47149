"""IQ3_XXS and IQ3_S: groups of 4 magnitudes on a 256- or 512-point grid, signs apart, a 4-bit
scale per block of 32 and a float16 scale per super-block of 256, as ggml's
quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl make them.

The search (iq_grid_search.py) runs on blocks of 32 in groups of 4 levels 0..7 (fitted values
2l + 1): trial scales (15 + 0.2 * is) / max for is in -15 .. 15 (IQ3_XXS, 7 sign bits per 8 values)
or -9 .. 9 (IQ3_S, 8 sign bits); then IQ3_XXS rounds again the groups of the winner that were off
the grid, IQ3_S all of them, if any was. Super-block: d = max block scale / 31, stored as
float16(d * 1.0125) (IQ3_XXS) or d * 1.033 (IQ3_S), block scales nearest_int((scale / d - 1) / 2).

ggml's IQ3_S does not advance its qs and signs pointers past a block of zeros: the next block's
bytes land in its place, and the last slots stay zero. We place them the same way.
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
from ggufsmith.quantize.iq_grids import iq3_grid
from ggufsmith.quantize.numerics import F32, float_warnings_off, transposed
from ggufsmith.quantize.registry import QuantFormat, register

BLOCK = 32
GROUP = 4
GROUPS = BLOCK // GROUP
SUB_BLOCKS = QK_K // BLOCK
_IQ3_XXS_BYTES = 2 + QK_K // 4 + QK_K // 8
_IQ3_S_BYTES = 2 + QK_K // 4 + QK_K // 32 + QK_K // 8 + QK_K // 64
_IQ3_XXS_EPS = F32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS

_IQ3_XXS_SEARCH = GridSearch(lambda: iq3_grid(256), group=GROUP, bits=3, max_level=7, center=15, step=0.2,
                             trials=15, start_on_grid=True, refit_all=False)
_IQ3_S_SEARCH = GridSearch(lambda: iq3_grid(512), group=GROUP, bits=3, max_level=7, center=15, step=0.2,
                           trials=9, start_on_grid=False, refit_all=True)

# What a level decodes to. IQ3_S: 2l + 1, the values the quantizer fits. IQ3_XXS decodes with
# ggml's iq3xxs_grid, whose values are 4 * (2l + 1) but for the top level (62, not 60); its scale
# carries the factor 4 back as * 0.5 * 0.5.
_IQ3_XXS_VALUES = np.array([4, 12, 20, 28, 36, 44, 52, 62], dtype=F32)
_IQ3_S_VALUES = np.arange(1, 16, 2).astype(F32)


def _quantize_blocks(rows: np.ndarray, importance: np.ndarray | None, iq3_s: bool):
    """(block scales [blocks], grid indices int32 [8, blocks], sign bytes [4, blocks], searched
    blocks bool [blocks]) for every block of 32 of the chunk."""
    spec = _IQ3_S_SEARCH if iq3_s else _IQ3_XXS_SEARCH
    x, weight = block_inputs(rows, importance, BLOCK, doubled_sigma2=True)
    xval, signs = signs_and_magnitudes(x, weight, even_parity=not iq3_s)
    block_max = np.maximum.reduce(xval, axis=0)  # plain max: no NaN, and a tie of equals is equal
    active = block_max != 0 if iq3_s else ~(block_max < _IQ3_XXS_EPS)
    scales, index = search_blocks(spec, "IQ3_S" if iq3_s else "IQ3_XXS", active, weight, xval, signs, not iq3_s,
                                  block_max, block_max / F32(15))
    return scales, index, signs, active


def _grid_values(index: np.ndarray, grid_size: int, values: np.ndarray) -> np.ndarray:
    """float32 [..., 4]: the decoded values of grid points."""
    return values[iq3_grid(grid_size).levels[index]]


# --- IQ3_XXS -----------------------------------------------------------------------------------


@float_warnings_off
def _iq3_xxs_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, iq3_s=False)
    d, block_levels, nonzero = super_scales(scales, active, SUB_BLOCKS)
    n_super = d.size
    signs = transposed(signs).astype(np.uint32)  # [blocks, 4]
    signs[~active] = 0  # ggml skips a block below the epsilon before storing its signs
    words = signs[:, 0] | (signs[:, 1] << 7) | (signs[:, 2] << 14) | (signs[:, 3] << 21)
    words = words.reshape(n_super, SUB_BLOCKS) | (block_levels.astype(np.uint32) << 28)
    out = new_super_blocks(np.where(nonzero, d * F32(1.0125), F32(0)), _IQ3_XXS_BYTES)
    out[:, 2 : 2 + QK_K // 4] = transposed(index).astype(np.uint8).reshape(n_super, -1)
    out[:, 2 + QK_K // 4 :] = words.astype("<u4").view(np.uint8).reshape(n_super, -1)
    out[~nonzero, 2:] = 0  # ggml clears the whole super-block when every block scale is 0
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq3_xxs_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ3_XXS_BYTES)
    index = blocks[:, 2 : 2 + QK_K // 4].reshape(-1, SUB_BLOCKS, GROUPS)
    words = blocks[:, 2 + QK_K // 4 :].copy().view("<u4")  # [supers, 8]
    db = d[:, None] * (F32(0.5) + (words >> 28).astype(F32)) * F32(0.5)
    negative = even_parity_negatives((words[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127)
    values = db[:, :, None, None] * _grid_values(index, 256, _IQ3_XXS_VALUES).reshape(-1, SUB_BLOCKS, 4, 8)
    return signed(values, negative).reshape(data.shape[0], row_length)


# --- IQ3_S -------------------------------------------------------------------------------------


@float_warnings_off
def _iq3_s_quantize(rows: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    scales, index, signs, active = _quantize_blocks(rows, importance, iq3_s=True)
    d, block_levels, nonzero = super_scales(scales, active, SUB_BLOCKS)
    n_super = d.size
    index = transposed(index).reshape(n_super, SUB_BLOCKS, GROUPS)
    signs = transposed(signs).reshape(n_super, SUB_BLOCKS, 4)
    act = active.reshape(n_super, SUB_BLOCKS)
    # Non-zero blocks fill the qs/signs slots in order (see the module docstring).
    slot = np.cumsum(act, axis=1) - 1
    s, ib = np.nonzero(act)
    qs = np.zeros((n_super, SUB_BLOCKS, GROUPS), dtype=np.uint8)
    qs[s, slot[s, ib]] = (index[s, ib] & 255).astype(np.uint8)
    sign_bytes = np.zeros((n_super, SUB_BLOCKS, 4), dtype=np.uint8)
    sign_bytes[s, slot[s, ib]] = signs[s, ib]
    high = ((index >> 8) & 1).astype(np.uint8) << np.arange(GROUPS, dtype=np.uint8)
    qh = np.where(act, high.sum(axis=2, dtype=np.uint8), 0)

    out = new_super_blocks(np.where(nonzero, d * F32(1.033), F32(0)), _IQ3_S_BYTES)
    out[:, 2:66] = qs.reshape(n_super, -1)
    out[:, 66:74] = qh
    out[:, 74:106] = sign_bytes.reshape(n_super, -1)
    low = np.where(nonzero[:, None], block_levels, 0).astype(np.uint8)
    out[:, 106:110] = low[:, 0::2] | (low[:, 1::2] << 4)
    return out.reshape(rows.shape[0], -1)


@float_warnings_off
def _iq3_s_dequantize(data: np.ndarray, row_length: int) -> np.ndarray:
    blocks, d = read_super_blocks(data, _IQ3_S_BYTES)
    qs = blocks[:, 2:66].reshape(-1, SUB_BLOCKS, GROUPS).astype(np.int32)
    qh = blocks[:, 66:74].astype(np.int32)
    index = qs | (((qh[:, :, None] >> np.arange(GROUPS)) & 1) << 8)
    nibbles = np.stack([blocks[:, 106:110] & 15, blocks[:, 106:110] >> 4], axis=2).reshape(-1, SUB_BLOCKS)
    db = d[:, None] * (1 + 2 * nibbles.astype(np.int32)).astype(F32)
    negative = sign_bits(blocks[:, 74:106].reshape(-1, SUB_BLOCKS, 4))
    values = db[:, :, None, None] * _grid_values(index, 512, _IQ3_S_VALUES).reshape(-1, SUB_BLOCKS, 4, 8)
    return signed(values, negative).reshape(data.shape[0], row_length)


register(QuantFormat(GGMLType.IQ3_XXS, _iq3_xxs_quantize, _iq3_xxs_dequantize, supports_importance=True))
register(QuantFormat(GGMLType.IQ3_S, _iq3_s_quantize, _iq3_s_dequantize, supports_importance=True))
