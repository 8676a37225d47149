"""Checkpoints whose weights are stored already quantized (config.json `quantization_config`).

A quantized format that GGUF has too is carried over as it is: its tensors become EncodedTensors
that hold the GGUF bytes, which the pipeline copies into the file instead of decoding and encoding
them again (a lossy round trip for no reason), and which the plan keeps in that type whatever the
output type (see converters/plan.choose_type).

Formats GGUF has no type for are dequantized while read, each by its handler: FP8 and other
float formats with scales (readers/prequantized.py), integer codes with scales and zero points,
packed or not: GPTQ, AWQ, compressed-tensors int formats (readers/integer_quantized.py). The
`quantization_config` is read here once and handed to the handler its `quant_method` names; a
method without one is refused in one line.

MXFP4 (`"quant_method": "mxfp4"`, gpt-oss): each quantized weight W of shape (..., rows, cols) is
stored as two tensors, `W_blocks` (..., rows, cols / 32, 16) of uint8, two 4-bit E2M1 codes per
byte (element 2j in the low nibble of byte j, element 2j + 1 in the high one), and `W_scales`
(..., rows, cols / 32) of uint8, one power-of-two exponent (E8M0, bias 127) per block of 32.
GGML's block_mxfp4 holds the same exponent byte, then 16 bytes of the same codes, ordered
differently: element j in the low nibble of byte j, element j + 16 in the high one. The pair
becomes one EncodedTensor of shape (..., rows, cols) under the blocks' name; only the nibbles move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ggufsmith.constants import GGML_TYPE_LAYOUT, GGMLType
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import EncodedTensor, LazyTensor, RowSlicedTensor
from ggufsmith.readers.integer_quantized import dequantize_awq, dequantize_gptq, dequantize_integer_tensors
from ggufsmith.readers.prequantized import FLOAT8, dequantize_float_scaled

MXFP4_BLOCK = GGML_TYPE_LAYOUT[GGMLType.MXFP4].block_size  # 32 values per exponent
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"


def decode_quantized(tensors: Mapping[str, LazyTensor], config: HFConfig) -> dict[str, LazyTensor]:
    """The checkpoint's tensors, those of a quantized format GGUF shares as EncodedTensors, those of
    the other formats dequantized to float32 (lazily, row slice by row slice)."""
    out = dict(tensors)
    if "quantization_config" in config:
        quantization = config.sub("quantization_config")
        method = quantization.get_str("quant_method", default=None)
        handler = HANDLERS.get(method)
        if handler is None:
            raise ConversionError(f"{config.path}: quantization_config quant_method {method!r} is not supported "
                                  f"(supported: {', '.join(HANDLERS)}); convert an unquantized copy")
        out = handler(out, quantization)
    _refuse_unscaled(out, config)
    return out


def _compressed_tensors(tensors: dict[str, LazyTensor], quantization: HFConfig) -> dict[str, LazyTensor]:
    """llm-compressor's formats: integer codes (packed or one per byte) to integer_quantized.py,
    float ones (FP8) and block-scaled ones to prequantized.py."""
    fmt = quantization.get_str("format", default=None)
    groups = quantization.get_dict("config_groups")
    if len(groups) != 1:
        raise ConversionError(f"{quantization.label}: {len(groups)} config_groups; one group of weights is supported")
    weights = quantization.sub("config_groups").sub(next(iter(groups))).sub("weights")
    integer = weights.get_str("type", default="int") == "int" and weights.get("strategy", default=None) != "block"
    if fmt == "pack-quantized" or (integer and fmt in ("int-quantized", "naive-quantized")):
        return dequantize_integer_tensors(tensors, weights, packed=fmt == "pack-quantized")
    if fmt in ("float-quantized", "int-quantized", "naive-quantized"):
        return dequantize_float_scaled(tensors, "_scale", _block_of(weights))
    raise ConversionError(f"{quantization.label}: compressed-tensors format {fmt!r} is not supported "
                          "(supported: pack-quantized, int-quantized, naive-quantized, float-quantized)")


def _block_of(weights: HFConfig) -> list[int] | None:
    """The block of values one scale covers: None for a scale per channel (row) or per tensor."""
    strategy = weights.get("strategy", default=None)
    if strategy not in ("channel", "tensor", "block") or weights.get("group_size", default=None) is not None:
        raise ConversionError(f"{weights.label}: weight strategy {strategy!r} of float values is not supported "
                              "(channel, tensor, block)")
    return _checked_block(weights, "block_structure") if strategy == "block" else None


def _checked_block(quantization: HFConfig, key: str) -> list[int] | None:
    block = quantization.get_list(key, default=None)
    if block is not None and not (len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise quantization.error(key, block, "two positive integers")
    return block


HANDLERS: dict[str, Callable[[dict[str, LazyTensor], HFConfig], dict[str, LazyTensor]]] = {
    "mxfp4": lambda tensors, quantization: join_mxfp4(tensors, quantization.path),
    "fp8": lambda tensors, quantization: dequantize_float_scaled(  # DeepSeek V3/R1, Qwen3 FP8
        tensors, "_scale_inv", _checked_block(quantization, "weight_block_size")),
    "fbgemm_fp8": lambda tensors, quantization: dequantize_float_scaled(tensors, "_scale", None),  # Llama 4 FP8
    "compressed-tensors": _compressed_tensors,
    "gptq": dequantize_gptq,
    "awq": dequantize_awq,
}


PACKED_SUFFIXES = (".qweight", ".weight_packed")  # GPTQ / AWQ, compressed-tensors


def _refuse_unscaled(tensors: dict[str, LazyTensor], config: HFConfig) -> None:
    """Quantized tensors that no handler took (no quantization_config, or one of another method)."""
    for name, tensor in tensors.items():
        file = config.path.parent / tensor.source.split(":", 1)[0]
        if tensor.dtype in FLOAT8:
            raise ConversionError(f"{file}: tensor {name} is {tensor.dtype} without a scale (no {name}_scale_inv or "
                                  f"{name}_scale that config.json's quantization_config names); its values are unknown")
        if name.endswith(PACKED_SUFFIXES):
            raise ConversionError(f"{file}: tensor {name} holds packed integer codes, but config.json's "
                                  "quantization_config does not say how (quant_method gptq, awq, or compressed-tensors "
                                  "pack-quantized); its values are unknown")


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
