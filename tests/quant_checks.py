"""Comparisons of our quantizer's output with ggml's, shared by the tests/test_quantize_*.py files.

Each assertion says on failure where the first difference is (row, block, byte or flat index) and
how many values differ, so that a broken quantizer can be debugged from the message alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize import dequantize, get_format, quantize
from tests.ggml_oracle import ggml_dequantize, ggml_quantize
from tests.quant_data import importance_vectors, model_weight_rows


def assert_same_bytes(ours: np.ndarray, expected: np.ndarray, ggml_type: GGMLType, what: str) -> None:
    """Byte equality of quantized rows; expected has ggml's shape [rows, row_bytes]."""
    fmt = get_format(ggml_type)
    ours = ours.reshape(expected.shape)
    if np.array_equal(ours, expected):
        return
    row, byte = np.argwhere(ours != expected)[0]
    raise AssertionError(
        f"{ggml_type.name} {what}: {int((ours != expected).sum())} bytes differ from ggml; first in row {row}, "
        f"block {byte // fmt.type_size}, byte {byte % fmt.type_size} of the block: "
        f"ours {ours[row, byte]:#04x}, ggml {expected[row, byte]:#04x}"
    )


def assert_same_bits(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Equality of two integer arrays of the same size, reported at the first differing flat index."""
    ours, expected = ours.reshape(-1), expected.reshape(-1)
    if np.array_equal(ours, expected):
        return
    i = int(np.argwhere(ours != expected)[0][0])
    raise AssertionError(
        f"{what}: {int((ours != expected).sum())} values differ; first at flat index {i}: "
        f"ours {ours[i]:#x}, ggml {expected[i]:#x}"
    )


def assert_same_floats(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Bit equality of float32 arrays, so that -0.0 vs 0.0 and NaN payloads count."""
    assert_same_bits(
        np.ascontiguousarray(ours, dtype=np.float32).view(np.uint32),
        np.ascontiguousarray(expected, dtype=np.float32).view(np.uint32),
        what,
    )


def check_against_ggml(rows: np.ndarray, ggml_type: GGMLType, importance: np.ndarray | None, what: str) -> None:
    """Our bytes equal ggml_quantize_chunk's for these rows, and our decoding of ggml's bytes equals
    ggml's to_float bit for bit."""
    expected = ggml_quantize(rows, int(ggml_type), importance)
    ours = quantize(rows, ggml_type, importance)
    assert_same_bytes(ours, expected, ggml_type, what)
    decoded = dequantize(expected, ggml_type, rows.shape)
    assert_same_floats(decoded, ggml_dequantize(expected, int(ggml_type), rows.size), f"{ggml_type.name} {what} dequantize")


Cases = Callable[[np.random.Generator, int, int, int], Iterator[tuple[str, np.ndarray]]]


def check_distributions_against_ggml(ggml_type: GGMLType, row_lengths, n_rows: Callable[[int], int], cases: Cases) -> None:
    """check_against_ggml on every distribution of `cases` (e.g. quant_data.quant_cases), for
    n_rows(row_length) rows of each row length, without an importance matrix."""
    rng = np.random.default_rng(int(ggml_type))
    block_size = get_format(ggml_type).block_size
    for row_length in row_lengths:
        for name, rows in cases(rng, n_rows(row_length), row_length, block_size):
            check_against_ggml(rows, ggml_type, None, f"{name} rows of {row_length}")


def check_distributions_with_importance(ggml_type: GGMLType, row_lengths, n_rows: Callable[[int], int], cases: Cases) -> None:
    """The same with every kind of importance vector of quant_data.importance_vectors, on a
    quarter of the rows (at least 4)."""
    rng = np.random.default_rng(100 + int(ggml_type))
    block_size = get_format(ggml_type).block_size
    for row_length in row_lengths:
        n = max(4, n_rows(row_length) // 4)
        for imatrix_name, importance in importance_vectors(rng, row_length):
            for name, rows in cases(rng, n, row_length, block_size):
                check_against_ggml(rows, ggml_type, importance, f"{name} rows of {row_length}, {imatrix_name} imatrix")


def check_llama_weights(ggml_type: GGMLType, max_rows: int, importance_rows: int, *, plain: bool = True,
                        with_importance: bool = True) -> None:
    """check_against_ggml on rows of a real Llama checkpoint: all of them without an imatrix (when
    `plain`), the first `importance_rows` with a log-normal one (when `with_importance`)."""
    rows = model_weight_rows(256, max_rows=max_rows)
    if plain:
        check_against_ggml(rows, ggml_type, None, "Llama weights")
    if with_importance:
        importance = np.random.default_rng(7).lognormal(0.0, 1.0, 256).astype(np.float32)
        check_against_ggml(rows[:importance_rows], ggml_type, importance, "Llama weights with imatrix")


def check_hypothesis_rows(rows: np.ndarray, ggml_type: GGMLType, data, *, plain: bool = True,
                          with_importance: bool = True) -> None:
    """check_against_ggml on rows hypothesis drew, without an imatrix (when `plain`) and with one
    drawn from `data` (hypothesis' st.data()) when `with_importance`."""
    if plain:
        check_against_ggml(rows, ggml_type, None, "hypothesis rows")
    if with_importance:
        importance = data.draw(hnp.arrays(np.float32, rows.shape[1], elements=st.floats(0, 1e6, width=32)))
        check_against_ggml(rows, ggml_type, importance, "hypothesis rows with imatrix")


def finite_rows(max_magnitude: float | None = None):
    """A hypothesis strategy: 1 to 3 rows of 256, 512 or 768 float32 values, finite (subnormals
    included), of magnitude at most `max_magnitude` when given."""
    return hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=3).map(lambda s: (s[0], s[1] * 256)),
        elements=st.floats(
            None if max_magnitude is None else -max_magnitude, max_magnitude,
            width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True,
        ),
    )


def check_dequantize_of_random_bytes(ggml_type: GGMLType) -> None:
    """Every bit pattern decodes as ggml decodes it: 512 rows of 8 blocks of random bytes (float16
    scales that are NaN, Inf, subnormal or -0.0, codes our quantizer never writes)."""
    fmt = get_format(ggml_type)
    rng = np.random.default_rng(200 + int(ggml_type))
    row_length = fmt.block_size * 8
    data = rng.integers(0, 256, (512, fmt.row_bytes(row_length)), dtype=np.uint8)
    assert_same_floats(
        dequantize(data, ggml_type, (512, row_length)),
        ggml_dequantize(data, int(ggml_type), 512 * row_length),
        f"{ggml_type.name} dequantize of random bytes",
    )


def check_dequantize_against_gguf_py(ggml_type: GGMLType) -> None:
    """gguf-py's numpy dequantizer, an independent second reference, decodes our bytes as we do."""
    gguf = pytest.importorskip("gguf")
    rows = np.random.default_rng(4).standard_normal((64, 1024), dtype=np.float32)
    data = quantize(rows, ggml_type).reshape(64, -1)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(int(ggml_type)))
    assert_same_floats(dequantize(data, ggml_type, rows.shape), expected, f"{ggml_type.name} vs gguf-py")


def check_quantize_against_gguf_py(ggml_type: GGMLType, shape: tuple[int, int]) -> None:
    """gguf-py's numpy quantizer gives our bytes for ordinary normal rows of this shape."""
    gguf = pytest.importorskip("gguf")
    rows = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    expected = gguf.quants.quantize(rows, gguf.GGMLQuantizationType(int(ggml_type))).view(np.uint8)
    assert_same_bytes(quantize(rows, ggml_type), expected.reshape(shape[0], -1), ggml_type, "vs gguf-py")


def check_importance_ignored(ggml_type: GGMLType, row_length: int) -> None:
    """For a type whose quantizer takes no imatrix, ggml's bytes with one, ours with one and ours
    without one are the same."""
    rows = np.random.default_rng(9).standard_normal((64, row_length), dtype=np.float32)
    importance = np.random.default_rng(10).lognormal(0.0, 2.0, row_length).astype(np.float32)
    expected = ggml_quantize(rows, int(ggml_type), importance)
    assert_same_bytes(quantize(rows, ggml_type, importance), expected, ggml_type, "with imatrix")
    assert_same_bytes(quantize(rows, ggml_type), expected, ggml_type, "without imatrix")


def check_rejects_partial_blocks(ggml_type: GGMLType, *, with_importance: bool = False) -> None:
    """Rows that are not a whole number of blocks are refused with the block size in the message."""
    block_size = get_format(ggml_type).block_size
    importance = np.ones(block_size + 16, np.float32) if with_importance else None
    with pytest.raises(QuantizationError, match=f"multiple of {block_size}"):
        quantize(np.zeros((2, block_size + 16), np.float32), ggml_type, importance)


def check_rejects_non_finite(ggml_type: GGMLType, bad: float, *, with_importance: bool = False) -> None:
    """A NaN or Inf is refused, naming the row it is in."""
    rows = np.ones((3, 256), np.float32)
    rows[2, 17] = bad
    importance = np.ones(256, np.float32) if with_importance else None
    with pytest.raises(QuantizationError, match="row 2 contains NaN or Inf"):
        quantize(rows, ggml_type, importance)
