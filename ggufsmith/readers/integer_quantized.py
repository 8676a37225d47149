"""Checkpoints of integer codes with scales (and zero points), dequantized while they are read.

Every format here stores each quantized weight W (rows = output features, columns = inputs) as
small integer codes q, a float scale s and an integer zero point z per group of inputs of each
output row, and means W[r, c] = (q[r, c] - z[r, g(c)]) x s[r, g(c)]. They differ in how the codes
are packed into words, along which axis, and how a column finds its group g(c):

  - GPTQ (`"quant_method": "gptq"`, AutoGPTQ / GPTQModel): `X.qweight` (inputs x bits / 32,
    outputs) packs the codes of each output column along the inputs; `X.qzeros` (groups, outputs
    x bits / 32) packs the zero points along the outputs; `X.scales` (groups, outputs);
    `X.g_idx` (inputs) gives each input's group (with desc_act the groups are not in input
    order; without g_idx, input i is in group i // group_size). Words (int32, or GPTQModel's
    `pack_dtype`) are an LSB-first bit stream: code k of a column sits at bits [k x bits,
    (k + 1) x bits) of its words taken in order, so 3-bit codes straddle words. 2, 3, 4 and 8
    bits. The first format (`checkpoint_format`, GPTQModel's `format`: "gptq") stores each zero
    point minus one, "gptq_v2" stores it as it is.
  - AWQ (`"quant_method": "awq"`, AutoAWQ's GEMM layout): `X.qweight` (inputs, outputs / 8)
    packs 8 output columns per int32, not in order: nibble i holds column 8j + [0, 2, 4, 6, 1,
    3, 5, 7][i]; `X.qzeros` (groups, outputs / 8) the same way; `X.scales` (groups, outputs);
    input i is in group i // group_size. 4 bits only.
  - compressed-tensors `pack-quantized` (llm-compressor's W4A16, ...): `X.weight_packed` (rows,
    columns x bits / 32) packs each row's codes along the row, as an LSB-first bit stream;
    `X.weight_shape` the true (rows, columns); `X.weight_scale` (rows, groups) for the "group"
    strategy, (rows, 1) for "channel", one for "tensor"; when asymmetric, `X.weight_zero_point`
    (rows x bits / 32, groups), packed along the rows. Codes and zero points are signed: stored
    plus 2^(bits-1).
  - compressed-tensors `int-quantized` / `naive-quantized` with int weights: `X.weight` in int8,
    one code per byte, with the same scales and zero point (unpacked) as above.

The product is computed in float32 from the exact integer difference, as llama.cpp's converter
computes GPTQ and pack-quantized (and the libraries compute it for float32 scales), so the values
are theirs bit for bit. The dequantized weight is row-sliceable: a slice of output rows reads only
its rows (compressed-tensors), or, for GPTQ and AWQ, whose words run across the output rows, the
columns of the packed tensor that hold them, read a band of inputs at a time, so that memory holds
a slice whatever the size of the weight. A format or a variant that cannot be dequantized exactly
(Marlin / ExLlama / GEMV layouts, unknown bit widths) is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor, RowSlicedTensor
from ggufsmith.readers.prequantized import ACTIVATION_SCALES

GPTQ_BITS = (2, 3, 4, 8)
GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what to add to a stored zero point
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column AWQ_ORDER[i] of its eight
AWQ_COLUMN_NIBBLE = tuple(AWQ_ORDER.index(column) for column in range(8))  # and column j is in this nibble
BAND_ELEMENTS = 1 << 22  # packed words read at once when a slice needs columns of every row

# a function (first output row, stop row) -> an array for those rows
Rows = Callable[[int, int], np.ndarray]


def unpack_bits(words: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
    """The first `count` codes of `bits` bits packed along `axis` of `words` (any integer type) as
    an LSB-first bit stream, as a C-contiguous uint8 array (codes are at most 8 bits)."""
    axis = axis % words.ndim
    width = words.dtype.itemsize * 8
    unsigned = words.view(f"<u{words.dtype.itemsize}")
    if width % bits == 0:  # codes never straddle a word: each word shifted once per code it holds
        per_word = width // bits
        shifts = np.arange(0, width, bits, dtype=unsigned.dtype).reshape(per_word, *[1] * (words.ndim - 1 - axis))
        codes = (np.expand_dims(unsigned, axis + 1) >> shifts) & np.array((1 << bits) - 1, unsigned.dtype)
        shape = list(words.shape)
        shape[axis] *= per_word
        codes = codes.astype(np.uint8).reshape(shape)
        return np.ascontiguousarray(codes[(slice(None),) * axis + (slice(0, count),)])
    # the stream bit by bit (little-endian bytes, least significant bit first)
    stream = np.ascontiguousarray(np.moveaxis(unsigned, axis, -1))
    stream_bits = np.unpackbits(stream.view(np.uint8), axis=-1, bitorder="little")
    codes = stream_bits[..., :count * bits].reshape(*stream.shape[:-1], count, bits)
    codes = (codes.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(axis=-1)
    return np.ascontiguousarray(np.moveaxis(codes.astype(np.uint8), -1, axis))


def affine_weight(shape: tuple[int, int], source: str, codes: Rows, scales: Rows, zeros: Rows | None,
                  column_group: Callable[[], np.ndarray], inputs_first: bool = False) -> RowSlicedTensor:
    """The float32 weight of `shape` whose rows [a, b) are (codes - zeros) x scales, each of its
    columns taking the scale and zero point of its group: `codes(a, b)` the integer codes
    (b - a, columns), `scales(a, b)` and `zeros(a, b)` (b - a, groups), column_group() the group
    of each column. With `inputs_first` the three come transposed, as GPTQ and AWQ store them
    (columns, b - a) and (groups, b - a): the groups are then gathered along the first axis,
    many times faster than along the second, and the product is transposed once at the end."""

    def rows(start: int, stop: int) -> np.ndarray:
        groups = column_group()
        values = codes(start, stop).astype(np.int32)
        scale = np.asarray(scales(start, stop), np.float32)
        if inputs_first:
            if zeros is not None:
                values -= zeros(start, stop).astype(np.int32)[groups]
            product = np.multiply(values.astype(np.float32), scale[groups], dtype=np.float32)
            return np.ascontiguousarray(product.T)
        if zeros is not None:
            values = values - zeros(start, stop).astype(np.int32)[:, groups]
        scale = scale[:, groups] if scale.shape[1] > 1 else scale  # one scale per row broadcasts
        return np.multiply(values.astype(np.float32), scale, dtype=np.float32)

    return RowSlicedTensor(shape, "F32", lambda: rows(0, shape[0]), source, rows, None)


# -- GPTQ and AWQ: words across the output rows ---------------------------------------------------

def dequantize_gptq(tensors: dict[str, LazyTensor], quantization: HFConfig) -> dict[str, LazyTensor]:
    """Every `X.qweight` with its qzeros, scales (and g_idx) as a float32 `X.weight`."""
    bits = quantization.get_int("bits", "w_bit")
    if bits not in GPTQ_BITS:
        raise quantization.error("bits", bits, f"one of {', '.join(map(str, GPTQ_BITS))} (GPTQ's packings)")
    # GPTQModel writes the layout as "format", AutoGPTQ and transformers as "checkpoint_format"
    layout = quantization.get_str("format", "checkpoint_format", default="gptq")
    if quantization.get_bool("is_marlin_format", default=False) or layout not in GPTQ_FORMATS:
        raise ConversionError(f"{quantization.label}: GPTQ checkpoint_format/format {layout!r} (a kernel's or "
                              f"another packing) is not supported (supported: {', '.join(GPTQ_FORMATS)}); "
                              "use a copy saved in the gptq format")
    group_size = quantization.get_int("group_size", default=-1, min=-1)
    return _replace_packed(tensors, ("qzeros", "scales", "g_idx"), lambda parts: _gptq_weight(
        parts, bits, group_size, GPTQ_FORMATS[layout]))


def dequantize_awq(tensors: dict[str, LazyTensor], quantization: HFConfig) -> dict[str, LazyTensor]:
    """Every `X.qweight` with its qzeros and scales (AutoAWQ's GEMM layout) as a float32 `X.weight`."""
    bits = quantization.get_int("bits", "w_bit")
    if bits != 4:
        raise quantization.error("bits", bits, "4 (AWQ's only packing)")
    version = quantization.get_str("version", "format", default="gemm")  # "format" in GPTQModel's AWQ configs
    if version.lower() != "gemm" or quantization.get_str("backend", default="autoawq") != "autoawq":
        raise ConversionError(f"{quantization.label}: AWQ version {version!r} (backend "
                              f"{quantization.get('backend', default='autoawq')!r}) is not supported; only AutoAWQ's "
                              "GEMM layout is (version \"gemm\"): use a copy saved in it")
    group_size = quantization.get_int("group_size", "q_group_size", min=-1)
    return _replace_packed(tensors, ("qzeros", "scales"), lambda parts: _awq_weight(parts, group_size))


def _replace_packed(tensors: dict[str, LazyTensor], companions: tuple[str, ...],
                    weight: Callable[[dict[str, LazyTensor]], LazyTensor]) -> dict[str, LazyTensor]:
    """`X.qweight` and its `X.<companion>` tensors replaced by weight({"qweight": ..., companion: ...})
    named `X.weight`, where the qweight was. A companion missing (g_idx may be), or left without
    its qweight, is refused."""
    out: dict[str, LazyTensor] = {}
    for name, tensor in tensors.items():
        base, _, kind = name.rpartition(".")
        if kind == "qweight":
            parts = {"qweight": tensor} | {c: tensors[f"{base}.{c}"] for c in companions if f"{base}.{c}" in tensors}
            missing = [c for c in companions if c not in parts and c != "g_idx"]
            if missing:
                raise ConversionError(f"{tensor.source}: the packed weight has no {base}.{missing[0]} beside it; "
                                      "the checkpoint is incomplete")
            out[f"{base}.weight"] = weight(parts)
        elif kind not in companions:
            out[name] = tensor
        elif f"{base}.qweight" not in tensors:
            raise ConversionError(f"{tensor.source}: {kind} without the {base}.qweight it belongs to; "
                                  "the checkpoint is incomplete")
    return out


def _gptq_weight(parts: dict[str, LazyTensor], bits: int, group_size: int, zero_offset: int) -> LazyTensor:
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    _check_2d(qweight, qzeros, scales)
    word_bits = _integer_bits(qweight)
    outputs = qweight.shape[1]
    inputs = qweight.shape[0] * word_bits // bits  # the last word of a 3-bit stream may hold a few codes more
    if "g_idx" in parts:
        if len(parts["g_idx"].shape) != 1:
            raise ConversionError(f"{parts['g_idx'].source}: expected one group index per input, found shape "
                                  f"{list(parts['g_idx'].shape)}; the checkpoint is damaged")
        inputs = parts["g_idx"].shape[0]
    n_groups = -(-inputs // group_size) if group_size > 0 else 1
    _expect(qweight, (-(-inputs * bits // word_bits), outputs), f"{inputs} inputs of {bits} bits")
    _expect(scales, (n_groups, outputs), f"one scale per group of {group_size} inputs and output of {qweight.source}")
    _expect(qzeros, (n_groups, -(-outputs * bits // _integer_bits(qzeros))),
            f"{n_groups} groups of {outputs} zero points of {bits} bits")

    def column_group() -> np.ndarray:
        if "g_idx" in parts:
            groups = parts["g_idx"].load().astype(np.int64)
        else:
            groups = np.arange(inputs) // (group_size if group_size > 0 else max(inputs, 1))
        if groups.size and (groups.min() < 0 or groups.max() >= n_groups):
            raise ConversionError(f"{parts.get('g_idx', qweight).source}: group indices outside the "
                                  f"{n_groups} groups of the scales; the checkpoint is damaged")
        return groups

    def codes(start: int, stop: int) -> np.ndarray:
        return unpack_bits(_columns(qweight, start, stop), bits, inputs, axis=0)

    def zeros(start: int, stop: int) -> np.ndarray:
        return unpack_bits(qzeros.load(), bits, outputs, axis=1)[:, start:stop].astype(np.int32) + zero_offset

    return affine_weight((outputs, inputs), _source(qweight, "qzeros, scales"), codes,
                         lambda start, stop: scales.load()[:, start:stop], zeros, column_group, inputs_first=True)


def _awq_weight(parts: dict[str, LazyTensor], group_size: int) -> LazyTensor:
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    _check_2d(qweight, qzeros, scales)
    if _integer_bits(qweight) != 32 or _integer_bits(qzeros) != 32:
        raise ConversionError(f"{qweight.source}: AWQ packs 4-bit codes in int32; this is {qweight.dtype}")
    inputs, outputs = qweight.shape[0], qweight.shape[1] * 8
    size = group_size if group_size > 0 else inputs
    n_groups = -(-inputs // size)
    _expect(scales, (n_groups, outputs), f"one scale per group of {size} inputs and output of {qweight.source}")
    _expect(qzeros, (n_groups, qweight.shape[1]), f"one packed zero point per group and word of {qweight.source}")

    def in_order(words: np.ndarray) -> np.ndarray:
        """AWQ's words (r, n) -> their 8n codes (r, 8n) in column order."""
        nibbles = unpack_bits(words, 4, words.shape[1] * 8, axis=1)
        return nibbles.reshape(words.shape[0], -1, 8)[:, :, AWQ_COLUMN_NIBBLE].reshape(words.shape[0], -1)

    def codes(start: int, stop: int) -> np.ndarray:
        first = start // 8
        return in_order(_columns(qweight, first, -(-stop // 8)))[:, start - first * 8:stop - first * 8]

    return affine_weight((outputs, inputs), _source(qweight, "qzeros, scales"), codes,
                         lambda start, stop: scales.load()[:, start:stop],
                         lambda start, stop: in_order(qzeros.load())[:, start:stop],
                         lambda: np.arange(inputs) // size, inputs_first=True)


def _columns(packed: LazyTensor, first: int, stop: int) -> np.ndarray:
    """Columns [first, stop) of a 2-D packed tensor, read a band of its rows at a time."""
    if not isinstance(packed, RowSlicedTensor):
        return np.ascontiguousarray(packed.load()[:, first:stop])
    rows, width = packed.shape
    step = max(1, BAND_ELEMENTS // max(1, width))
    bands = [packed.load_rows(r, min(r + step, rows))[:, first:stop] for r in range(0, rows, step)]
    return np.concatenate(bands) if bands else np.zeros((0, stop - first), np.int32)


# -- compressed-tensors: one row of codes per output row ------------------------------------------

def dequantize_integer_tensors(tensors: dict[str, LazyTensor], weights: HFConfig,
                               packed: bool) -> dict[str, LazyTensor]:
    """compressed-tensors' int formats: every `X.weight_packed` (pack-quantized) or int `X.weight`
    with its `X.weight_scale` (and `X.weight_zero_point`) as a float32 `X.weight`."""
    bits = weights.get_int("num_bits")
    if not 1 <= bits <= 8 or weights.get_str("type", default="int") != "int":
        raise ConversionError(f"{weights.label}: {weights.get('type', default='int')} weights of {bits} bits are "
                              "not supported (int of 1 to 8 bits)")
    strategy = weights.get_str("strategy", default=None)
    if strategy not in ("group", "channel", "tensor"):
        raise ConversionError(f"{weights.label}: weight strategy {strategy!r} of int weights is not supported "
                              "(group, channel, tensor)")
    group_size = weights.get_int("group_size", min=1) if strategy == "group" else None
    suffix = "_packed" if packed else ""
    companions = ("_scale", "_zero_point", "_shape")
    out: dict[str, LazyTensor] = {}
    for name, tensor in tensors.items():
        base = name.removesuffix(suffix)
        if name.endswith(".weight" + suffix) and base + "_scale" in tensors:
            parts = {c: tensors[base + c] for c in companions if base + c in tensors}
            out[base] = _compressed_weight(tensor, parts, bits, group_size, packed)
        elif name.endswith(tuple(".weight" + c for c in companions)) or name.endswith(ACTIVATION_SCALES):
            if name.endswith(".weight_scale") and name.removesuffix("_scale") + suffix not in tensors:
                raise ConversionError(f"{tensor.source}: a scale without its weight "
                                      f"{name.removesuffix('_scale') + suffix}; the checkpoint is incomplete")
        elif name.endswith(".weight_packed"):
            raise ConversionError(f"{tensor.source}: a packed weight without its {base}_scale beside it; "
                                  "the checkpoint is incomplete")
        else:
            out[name] = tensor
    return out


def _compressed_weight(stored: LazyTensor, parts: dict[str, LazyTensor], bits: int, group_size: int | None,
                       packed: bool) -> LazyTensor:
    scale, zero_point = parts["_scale"], parts.get("_zero_point")
    if packed:
        if "_shape" not in parts:
            raise ConversionError(f"{stored.source}: a packed weight without its weight_shape beside it; "
                                  "the checkpoint is incomplete")
        shape = _weight_shape(parts["_shape"])
        _check_2d(stored)
        if _integer_bits(stored) != 32:
            raise ConversionError(f"{stored.source}: pack-quantized weights are int32; this one is {stored.dtype}")
        _expect(stored, (shape[0], -(-shape[1] * bits // 32)), f"weight_shape {list(shape)} in {bits}-bit codes")
    else:
        _check_2d(stored)
        if stored.dtype not in ("I8", "I16", "I32"):
            raise ConversionError(f"{stored.source}: int-quantized weights are integers; this one is {stored.dtype}")
        shape = stored.shape
    rows, columns = shape
    n_groups = 1 if group_size is None else -(-columns // group_size)
    if scale.n_elements != 1:  # one per tensor, or one per group (or row) of each row
        _expect(scale, (rows, n_groups), f"one scale per {'row' if group_size is None else 'group of a row'} "
                                         f"of {stored.source}'s {list(shape)}", accept_vector=group_size is None)
    offset = 1 << (bits - 1) if packed else 0  # packed codes are stored as unsigned: signed + 2^(bits-1)

    def codes(start: int, stop: int) -> np.ndarray:
        if not packed:
            return _rows_of(stored, start, stop)
        return unpack_bits(_rows_of(stored, start, stop), bits, columns, axis=1).astype(np.int32) - offset

    def scales(start: int, stop: int) -> np.ndarray:
        if scale.n_elements == 1:
            return np.broadcast_to(scale.load().reshape(1, 1), (stop - start, 1))
        return _rows_of(scale, start, stop).reshape(stop - start, n_groups)

    zeros = None
    if zero_point is not None:
        zeros = _zero_points(zero_point, stored, rows, n_groups, bits, packed=zero_point.dtype == "I32" and packed)

    def column_group() -> np.ndarray:
        return np.arange(columns) // (group_size or columns)

    return affine_weight((rows, columns), _source(stored, "weight_scale"), codes, scales, zeros, column_group)


def _rows_of(tensor: LazyTensor, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) along the first axis of a 1-D or 2-D tensor, reading no more when it can."""
    if isinstance(tensor, RowSlicedTensor) and len(tensor.shape) == 2:
        return tensor.load_rows(start, stop)
    return tensor.load()[start:stop]


def _zero_points(zero_point: LazyTensor, stored: LazyTensor, rows: int, n_groups: int, bits: int, packed: bool) -> Rows:
    if packed:  # packed along the rows, stored unsigned
        _expect(zero_point, (-(-rows * bits // 32), n_groups), f"{rows} x {n_groups} zero points of {bits} bits")
        return lambda start, stop: (unpack_bits(zero_point.load(), bits, rows, axis=0)[start:stop].astype(np.int32)
                                    - (1 << (bits - 1)))
    if zero_point.n_elements == 1:
        return lambda start, stop: np.broadcast_to(zero_point.load().reshape(1, 1), (stop - start, 1))
    _expect(zero_point, (rows, n_groups), f"one zero point per scale of {stored.source}", accept_vector=n_groups == 1)
    return lambda start, stop: _rows_of(zero_point, start, stop).reshape(stop - start, n_groups)


def _weight_shape(shape_tensor: LazyTensor) -> tuple[int, int]:
    """The (rows, columns) a `weight_shape` tensor holds (two integers, read now: the plan needs them)."""
    values = shape_tensor.load().reshape(-1) if shape_tensor.dtype in ("I64", "I32") else None
    if values is None or values.size != 2 or (values < 0).any():
        raise ConversionError(f"{shape_tensor.source}: expected two non-negative integers (rows, columns), "
                              f"found {shape_tensor.dtype} {list(shape_tensor.shape)}")
    return int(values[0]), int(values[1])


# -- checks -----------------------------------------------------------------------------------------

def _integer_bits(tensor: LazyTensor) -> int:
    widths = {"I8": 8, "I16": 16, "I32": 32, "I64": 64, "U8": 8}
    if tensor.dtype not in widths:
        raise ConversionError(f"{tensor.source}: packed codes are integers; this tensor is {tensor.dtype}")
    return widths[tensor.dtype]


def _check_2d(*tensors: LazyTensor) -> None:
    for tensor in tensors:
        if len(tensor.shape) != 2:
            raise ConversionError(f"{tensor.source}: expected 2 dimensions, found {list(tensor.shape)}; "
                                  "the quantized weight is damaged or in a layout not supported")


def _expect(tensor: LazyTensor, shape: tuple[int, int], what: str, accept_vector: bool = False) -> None:
    if tuple(tensor.shape) != shape and not (accept_vector and tuple(tensor.shape) == shape[:1]):
        raise ConversionError(f"{tensor.source}: shape {list(tensor.shape)}, expected {list(shape)} "
                              f"({what}); the checkpoint is damaged or quantized otherwise than config.json says")


def _source(tensor: LazyTensor, companions: str) -> str:
    return f"{tensor.source} (dequantized with {companions})"
