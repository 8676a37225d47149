"""Checkpoints whose weights are stored already quantized (config.json `quantization_config`).

A quantized format that GGUF has too is carried over as it is: its tensors become EncodedTensors
that hold the GGUF bytes, which the pipeline copies into the file instead of decoding and encoding
them again (a lossy round trip for no reason), and which the plan keeps in that type whatever the
output type (see converters/plan.choose_type).

Formats GGUF has no type for (FP8 with block or channel scales, ...) are dequantized while read:
readers/prequantized.py.

MXFP4 (`"quant_method": "mxfp4"`, gpt-oss): each quantized weight W of shape (..., rows, cols) is
stored as two tensors, `W_blocks` (..., rows, cols / 32, 16) of uint8, two 4-bit E2M1 codes per
byte (element 2j in the low nibble of byte j, element 2j + 1 in the high one), and `W_scales`
(..., rows, cols / 32) of uint8, one power-of-two exponent (E8M0, bias 127) per block of 32.
GGML's block_mxfp4 holds the same exponent byte, then 16 bytes of the same codes, ordered
differently: element j in the low nibble of byte j, element j + 16 in the high one. The pair
becomes one EncodedTensor of shape (..., rows, cols) under the blocks' name; only the nibbles move.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ggufsmith.constants import GGML_TYPE_LAYOUT, GGMLType
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import EncodedTensor, LazyTensor, RowSlicedTensor
from ggufsmith.readers.prequantized import dequantize_checkpoint

MXFP4_BLOCK = GGML_TYPE_LAYOUT[GGMLType.MXFP4].block_size  # 32 values per exponent
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"


def decode_quantized(tensors: Mapping[str, LazyTensor], config: HFConfig) -> dict[str, LazyTensor]:
    """The checkpoint's tensors with those of a quantized format GGUF shares made EncodedTensors."""
    quantization = config.get_dict("quantization_config", default=None)
    if quantization is None:
        return dequantize_checkpoint(dict(tensors), config)  # refuses float8 tensors without scales
    method = config.sub("quantization_config").get_str("quant_method", default=None)
    if method == "mxfp4":
        return join_mxfp4(tensors, config.path)
    return dequantize_checkpoint(dict(tensors), config)  # FP8 and the others GGUF has no type for


def join_mxfp4(tensors: Mapping[str, LazyTensor], config_path: str) -> dict[str, LazyTensor]:
    """Every `X_blocks` / `X_scales` pair as one MXFP4 EncodedTensor named `X_blocks`, in place of the
    blocks; every other tensor as it is."""
    out: dict[str, LazyTensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALES_SUFFIX) and name.removesuffix(SCALES_SUFFIX) + BLOCKS_SUFFIX in tensors:
            continue  # joined with its blocks
        if not name.endswith(BLOCKS_SUFFIX):
            out[name] = tensor
            continue
        scales_name = name.removesuffix(BLOCKS_SUFFIX) + SCALES_SUFFIX
        if scales_name not in tensors:
            raise ConversionError(f"{tensor.source}: the MXFP4 blocks have no {scales_name} beside them "
                                  f"({config_path} says the checkpoint is MXFP4); the checkpoint is incomplete")
        out[name] = mxfp4_tensor(tensor, tensors[scales_name])
    return out


def mxfp4_tensor(blocks: LazyTensor, scales: LazyTensor) -> EncodedTensor:
    """The weight stored as MXFP4 `blocks` (..., G, 16) and `scales` (..., G), as GGML MXFP4 rows of G * 32."""
    if blocks.dtype != "U8" or len(blocks.shape) < 2 or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ConversionError(f"{blocks.source}: MXFP4 blocks are uint8 of shape (..., blocks, {MXFP4_BLOCK // 2}); "
                              f"this one is {blocks.dtype} {list(blocks.shape)}")
    if scales.dtype != "U8" or tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise ConversionError(f"{scales.source}: MXFP4 scales are uint8 of shape {list(blocks.shape[:-1])} (one per "
                              f"block of {blocks.source}); this one is {scales.dtype} {list(scales.shape)}")
    if not (isinstance(blocks, RowSlicedTensor) and isinstance(scales, RowSlicedTensor)):
        raise ConversionError(f"{blocks.source}: MXFP4 weights are read from .safetensors files only")
    n_blocks = blocks.shape[-2]
    shape = (*blocks.shape[:-2], n_blocks * MXFP4_BLOCK)
    row_length = shape[-1]

    def raw(start: int, stop: int) -> np.ndarray:
        codes = blocks.load_rows(start * n_blocks, stop * n_blocks).reshape(stop - start, n_blocks, MXFP4_BLOCK // 2)
        exponents = scales.load_rows(start, stop).reshape(stop - start, n_blocks, 1)
        return np.concatenate([exponents, ggml_nibble_order(codes)], axis=-1).reshape(-1)

    def rows(start: int, stop: int) -> np.ndarray:
        from ggufsmith.quantize import dequantize, supported_types

        if GGMLType.MXFP4 not in supported_types():
            raise ConversionError(f"{blocks.source}: decoding MXFP4 is not supported yet; keep the experts MXFP4 "
                                  "(any --outtype but a preset that changes their type)")
        return dequantize(raw(start, stop), GGMLType.MXFP4, (stop - start, row_length))

    n_rows = int(np.prod(shape[:-1], dtype=np.int64))
    source = f"{blocks.source} + {scales.source.rsplit(':', 1)[-1]}"
    return EncodedTensor(shape, "MXFP4", lambda: rows(0, n_rows).reshape(shape), source, rows,
                         stored_type=GGMLType.MXFP4, raw_loader=raw)


def ggml_nibble_order(codes: np.ndarray) -> np.ndarray:
    """Bytes of 32 codes, pairs (2j, 2j + 1) per byte -> halves (j, j + 16) per byte (GGML's order)."""
    low, high = codes & 0x0F, codes >> 4
    values = np.stack([low, high], axis=-1).reshape(*codes.shape[:-1], MXFP4_BLOCK)  # element order
    half = MXFP4_BLOCK // 2
    return (values[..., :half] | (values[..., half:] << 4)).astype(np.uint8)
