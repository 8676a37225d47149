"""Comparisons of our quantizer's output with ggml's, shared by the tests/test_quantize_*.py files.

Each assertion says on failure where the first difference is (row, block, byte or flat index) and
how many values differ, so that a broken quantizer can be debugged from the message alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.quantize import dequantize, get_format, quantize
from tests.ggml_oracle import ggml_dequantize, ggml_quantize
from tests.quant_data import importance_vectors


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
