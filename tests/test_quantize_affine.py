"""Q4_1, Q5_1, Q2_K, Q4_K and Q5_K are byte-identical to ggml's C quantizer, and decode bit for bit
as ggml's to_float does, with and without an importance matrix.

The oracle is ggml itself (tests/ggml_oracle.py: ggml_quantize_chunk and the type's to_float from
llama-cpp-python's libggml-base); gguf-py is a second, independent reference where it has the type.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize import quantize, search_affine
from tests.ggml_oracle import ggml_quantize
from tests.quant_checks import (
    assert_same_bytes,
    check_dequantize_against_gguf_py,
    check_dequantize_of_random_bytes,
    check_distributions_against_ggml,
    check_distributions_with_importance,
    check_hypothesis_rows,
    check_llama_weights,
    check_quantize_against_gguf_py,
    check_rejects_non_finite,
    check_rejects_partial_blocks,
    finite_rows,
)
from tests.quant_data import quant_cases

LEGACY = [GGMLType.Q4_1, GGMLType.Q5_1]
K_QUANTS = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q2_K]
TYPES = LEGACY + K_QUANTS
ROW_LENGTHS = {t: (32, 64, 4096) for t in LEGACY} | {t: (256, 512, 4096) for t in K_QUANTS}


# ------------------------------------------------------------------ data


def _cases(rng: np.random.Generator, n_rows: int, row_length: int, block_size: int) -> Iterator[tuple[str, np.ndarray]]:
    """The shared quantizer distributions, plus blocks that matter for scale+min types only."""
    yield from quant_cases(rng, n_rows, row_length, block_size)
    shape = (n_rows, row_length)
    # min is clamped to 0 for positive blocks; all-negative blocks keep max < 0
    yield "positive", np.abs(rng.standard_normal(shape, dtype=np.float32))
    yield "negative", -np.abs(rng.standard_normal(shape, dtype=np.float32)) - np.float32(1)
    yield "signed_zeros", _signed_zero_blocks(rng, n_rows, row_length, block_size)


def _signed_zero_blocks(rng: np.random.Generator, n_rows: int, row_length: int, block_size: int) -> np.ndarray:
    """Blocks where +0.0 and -0.0 are mixed: ggml's min/max keep the sign of the first zero, which
    shows in Q4_1/Q5_1's stored min."""
    blocks = rng.standard_normal((n_rows, row_length // block_size, block_size), dtype=np.float32)
    kind = rng.integers(0, 3, blocks.shape[:2])
    signs = rng.random(blocks.shape) < 0.5
    zeros = np.where(signs, np.float32(-0.0), np.float32(0.0))
    blocks[kind == 0] = zeros[kind == 0]  # all zero, mixed signs
    positive = kind == 1  # non-negative values and zeros: the min is a zero
    blocks[positive] = np.abs(blocks[positive])
    sprinkle = (kind >= 1)[..., None] & (rng.random(blocks.shape) < 0.3)
    blocks[sprinkle] = zeros[sprinkle]
    return blocks.reshape(n_rows, row_length)


def _n_rows(row_length: int) -> int:
    return max(8, 32 * 1024 // row_length)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_without_importance(ggml_type):
    check_distributions_against_ggml(ggml_type, ROW_LENGTHS[ggml_type], _n_rows, _cases)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_with_importance(ggml_type):
    check_distributions_with_importance(ggml_type, ROW_LENGTHS[ggml_type], _n_rows, _cases)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_llama_weights(ggml_type):
    check_llama_weights(ggml_type, max_rows=1024, importance_rows=256)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_arbitrary_bytes(ggml_type):
    check_dequantize_of_random_bytes(ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@settings(max_examples=30, deadline=None)
@given(rows=finite_rows(), data=st.data())
def test_quantize_matches_ggml_on_any_finite_floats(ggml_type, rows, data):
    check_hypothesis_rows(rows, ggml_type, data)


@pytest.mark.parametrize("ggml_type", LEGACY, ids=lambda t: t.name)
def test_quantize_matches_gguf_py_on_ordinary_weights(ggml_type):
    """gguf-py's numpy quantizer is a second, independent opinion (it has Q4_1 and Q5_1; its K-quant
    quantizers are not implemented in 0.19, its K-quant dequantizers are compared below)."""
    check_quantize_against_gguf_py(ggml_type, (64, 1024))


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(ggml_type):
    check_dequantize_against_gguf_py(ggml_type)


def test_quantize_splits_big_tensors_into_chunks_invisibly():
    """A tensor bigger than the registry's chunk gives the bytes ggml gives for it in one call."""
    rows = np.random.default_rng(5).standard_normal((300, 4096), dtype=np.float32)  # > 1M elements
    for ggml_type in (GGMLType.Q4_K, GGMLType.Q5_1):
        assert_same_bytes(quantize(rows, ggml_type), ggml_quantize(rows, int(ggml_type)), ggml_type, "chunked tensor")


@pytest.mark.parametrize("ggml_type", K_QUANTS, ids=lambda t: t.name)
def test_a_row_longer_than_a_search_batch_matches_ggml(ggml_type):
    """A registry chunk never splits a row, so one very long row is searched in several batches
    (and a partial last one): the bytes are still ggml's, with and without an importance matrix."""
    rng = np.random.default_rng(7 + int(ggml_type))
    row_length = search_affine.SEARCH_BATCH_ELEMENTS + 3 * 256
    rows = rng.standard_normal((1, row_length), dtype=np.float32)
    assert_same_bytes(quantize(rows, ggml_type), ggml_quantize(rows, int(ggml_type)), ggml_type, "one long row")
    importance = rng.lognormal(0.0, 1.0, row_length).astype(np.float32)
    assert_same_bytes(
        quantize(rows, ggml_type, importance),
        ggml_quantize(rows, int(ggml_type), importance),
        ggml_type,
        "one long row, imatrix",
    )


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_rejects_rows_that_are_not_whole_blocks(ggml_type):
    check_rejects_partial_blocks(ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nan_and_inf(ggml_type, bad):
    check_rejects_non_finite(ggml_type, bad)


def test_rejects_importance_of_the_wrong_length():
    with pytest.raises(QuantizationError, match="importance vector has 255 values for rows of 256"):
        quantize(np.ones((1, 256), np.float32), GGMLType.Q4_K, np.ones(255, np.float32))
