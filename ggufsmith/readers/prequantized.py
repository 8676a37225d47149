"""Checkpoints published already quantized, dequantized while they are read.

config.json's `quantization_config` says how the weights are stored; each quantized weight comes
with scale tensors beside it, and is replaced here by a lazy tensor of its float32 values, which
the converter then treats like any other weight (and quantizes anew for the output type):

  - "fp8" (DeepSeek V3/R1, Kimi K2, Qwen3 FP8, MiniMax-M2): `X.weight` in F8_E4M3 and
    `X.weight_scale_inv`, one float per block of `weight_block_size` (e.g. 128 x 128; blocks at
    the edges are cut), or one per tensor without a block size. value = fp8 x scale_inv.
  - "compressed-tensors" with format "float-quantized" (llm-compressor's FP8), or the int formats
    with block scales: `X.weight` and `X.weight_scale`, per channel (one per output row), per
    tensor, or per block (`block_structure`). value = stored x scale. (Integer codes per channel
    or group, with zero points, packed or not: readers/integer_quantized.py.)
  - "fbgemm_fp8" (Llama 4 Maverick FP8): `X.weight` and `X.weight_scale`, one per output row.

The product is computed in float32, as transformers' and llama.cpp's dequantization compute it, so
the values are theirs bit for bit. A 2-D weight stays row-sliceable: a slice of rows reads only
its rows and their scales. Activation scales (used only by FP8 matmul kernels) are dropped.
readers/quantized.py reads config.json's `quantization_config` and calls the handler here for the
methods it lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.lazy_tensor import LazyTensor, RowSlicedTensor

FLOAT8 = ("F8_E4M3", "F8_E5M2")
# Tensors beside the weights that only quantized-activation matmul kernels use (FP8, W8A8).
ACTIVATION_SCALES = (".activation_scale", "_activation_scale", ".input_scale", ".qscale_act", ".input_zero_point",
                     ".output_scale", ".output_zero_point")


def dequantize_float_scaled(tensors: dict[str, LazyTensor], suffix: str,
                            block: Sequence[int] | None) -> dict[str, LazyTensor]:
    """`tensors` with every weight that has a `<weight><suffix>` scale beside it replaced by its
    float32 values, in the same order; activation scales dropped."""
    scales = _pairs(tensors, suffix)
    out: dict[str, LazyTensor] = {}
    consumed = set(scales.values())
    for name, tensor in tensors.items():
        if name in consumed or name.endswith(ACTIVATION_SCALES):
            continue
        out[name] = dequantized(tensor, tensors[scales[name]], block) if name in scales else tensor
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
