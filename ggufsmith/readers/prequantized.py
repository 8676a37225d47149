"""Checkpoints published already quantized, dequantized while they are read.

config.json's `quantization_config` says how the weights are stored; each quantized weight comes
with scale tensors beside it, and is replaced here by a lazy tensor of its float32 values, which
the converter then treats like any other weight (and quantizes anew for the output type):

  - "fp8" (DeepSeek V3/R1, Kimi K2, Qwen3 FP8, MiniMax-M2): `X.weight` in F8_E4M3 and
    `X.weight_scale_inv`, one float per block of `weight_block_size` (e.g. 128 x 128; blocks at
    the edges are cut), or one per tensor without a block size. value = fp8 x scale_inv.
  - "compressed-tensors" with format "float-quantized" / "int-quantized" / "naive-quantized"
    (llm-compressor's FP8 and INT8): `X.weight` and `X.weight_scale`, per channel (one per output
    row), per tensor, or per block (`block_structure`). value = stored x scale.
  - "fbgemm_fp8" (Llama 4 Maverick FP8): `X.weight` and `X.weight_scale`, one per output row.

The product is computed in float32, as transformers' and llama.cpp's dequantization compute it, so
the values are theirs bit for bit. A 2-D weight stays row-sliceable: a slice of rows reads only
its rows and their scales. Activation scales (used only by FP8 matmul kernels) are dropped.
Formats not handled here are refused in one line naming the method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor, RowSlicedTensor

FLOAT8 = ("F8_E4M3", "F8_E5M2")
# Tensors beside the weights that only FP8 matmul kernels use.
ACTIVATION_SCALES = (".activation_scale", "_activation_scale", ".input_scale", ".qscale_act")


def dequantize_checkpoint(tensors: dict[str, LazyTensor], config: HFConfig) -> dict[str, LazyTensor]:
    """`tensors` with every quantized weight replaced by its float32 values, in the same order."""
    quant = config.get_dict("quantization_config", default=None)
    if quant is None:
        _refuse_unscaled(tensors, config)
        return tensors
    qc = config.sub("quantization_config")
    method = qc.get_str("quant_method", default=None)
    if method == "fp8":
        block = qc.get_list("weight_block_size", default=None)
        scales = _pairs(tensors, "_scale_inv")
    elif method == "compressed-tensors":
        block = _compressed_tensors_block(qc)
        scales = _pairs(tensors, "_scale")
    elif method == "fbgemm_fp8":
        block = None
        scales = _pairs(tensors, "_scale")
    else:
        raise ConversionError(f"{config.path}: quantization_config quant_method {method!r} is not supported "
                              "(supported: mxfp4, fp8, fbgemm_fp8, compressed-tensors float/int-quantized); convert an "
                              "unquantized copy")
    if block is not None and not (len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise qc.error("weight_block_size", block, "two positive integers")
    out: dict[str, LazyTensor] = {}
    consumed = set(scales.values())
    for name, tensor in tensors.items():
        if name in consumed or name.endswith(ACTIVATION_SCALES):
            continue
        out[name] = dequantized(tensor, tensors[scales[name]], block) if name in scales else tensor
    _refuse_unscaled(out, config)
    return out


def _pairs(tensors: dict[str, LazyTensor], suffix: str) -> dict[str, str]:
    """weight name -> its scale tensor's name, for every `<weight><suffix>` in the checkpoint."""
    pairs = {}
    for name in tensors:
        if name.endswith(".weight" + suffix):
            weight = name.removesuffix(suffix)
            if weight not in tensors:
                raise ConversionError(f"{tensors[name].source}: a scale without its weight {weight}")
            pairs[weight] = name
    return pairs


def _compressed_tensors_block(qc: HFConfig) -> list[int] | None:
    fmt = qc.get_str("format", default=None)
    if fmt not in ("float-quantized", "int-quantized", "naive-quantized"):
        raise ConversionError(f"{qc.label}: compressed-tensors format {fmt!r} is not supported "
                              "(supported: float-quantized, int-quantized, naive-quantized)")
    groups = qc.get_dict("config_groups")
    if len(groups) != 1:
        raise ConversionError(f"{qc.label}: {len(groups)} config_groups; one group of weights is supported")
    weights = qc.sub("config_groups").sub(next(iter(groups))).get_dict("weights")
    strategy = weights.get("strategy")
    if strategy not in ("channel", "tensor", "block") or weights.get("group_size") is not None:
        raise ConversionError(f"{qc.label}: weight strategy {strategy!r} is not supported (channel, tensor, block)")
    return weights.get("block_structure") if strategy == "block" else None


def _refuse_unscaled(tensors: dict[str, LazyTensor], config: HFConfig) -> None:
    for name, tensor in tensors.items():
        if tensor.dtype in FLOAT8:
            file = config.path.parent / tensor.source.split(":", 1)[0]
            raise ConversionError(f"{file}: tensor {name} is {tensor.dtype} without a scale (no {name}_scale_inv or "
                                  f"{name}_scale that config.json's quantization_config names); its values are unknown")


def dequantized(weight: LazyTensor, scale: LazyTensor, block: Sequence[int] | None) -> LazyTensor:
    """weight x scale in float32, the scale broadcast over its block (or row, or tensor)."""
    shape = weight.shape
    expand = _scale_expander(weight, scale, block)
    source = f"{weight.source} (dequantized with {scale.source.rsplit(':', 1)[-1]})"

    def load() -> np.ndarray:
        return _product(weight.load(), expand(scale.load(), 0, shape[0] if shape else 1))

    if len(shape) != 2 or not isinstance(weight, RowSlicedTensor):
        return LazyTensor(shape, "F32", load, source)

    def load_rows(start: int, stop: int) -> np.ndarray:
        return _product(weight.load_rows(start, stop), expand(scale.load(), start, stop))

    return RowSlicedTensor(shape, "F32", load, source, load_rows, None)


def _product(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return np.multiply(values.astype(np.float32, copy=False), scale, dtype=np.float32)


def _scale_expander(weight: LazyTensor, scale: LazyTensor,
                    block: Sequence[int] | None) -> Callable[[np.ndarray, int, int], np.ndarray]:
    """A function (scale data, first row, stop row) -> the scale of rows [first, stop), broadcastable."""
    shape, s = weight.shape, scale.shape
    if scale.n_elements == 1:
        return lambda data, start, stop: np.asarray(data, np.float32).reshape(())
    if block is not None and len(shape) == 2:
        rows, cols = block
        if s != (-(-shape[0] // rows), -(-shape[1] // cols)):
            raise ConversionError(f"{scale.source}: shape {list(s)} does not give one scale per {rows} x {cols} block "
                                  f"of {weight.source}'s {list(shape)}")

        def blocks(data: np.ndarray, start: int, stop: int) -> np.ndarray:
            first = start // rows
            part = np.asarray(data, np.float32)[first:-(-stop // rows)]
            part = np.repeat(np.repeat(part, rows, axis=0), cols, axis=1)
            return part[start - first * rows:stop - first * rows, :shape[1]]
        return blocks
    if len(shape) == 2 and s in ((shape[0], 1), (shape[0],)):  # one scale per output row
        return lambda data, start, stop: np.asarray(data, np.float32).reshape(-1, 1)[start:stop]
    raise ConversionError(f"{scale.source}: shape {list(s)} does not fit {weight.source}'s {list(shape)} "
                          f"(block size {list(block) if block else None})")
