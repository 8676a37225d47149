"""Q8_0, Q4_0, Q5_0, Q3_K and Q6_K are byte-identical to ggml's C quantizer, and decode bit for bit
as ggml's to_float does, with and without an importance matrix.

The oracle is ggml itself (tests/ggml_oracle.py: ggml_quantize_chunk and the type's to_float from
llama-cpp-python's libggml-base); gguf-py is a second, independent reference where it has the type.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize import get_format, numerics, quantize, search_q3, search_symmetric
from tests.quant_checks import (
    assert_same_floats,
    check_against_ggml,
    check_dequantize_against_gguf_py,
    check_dequantize_of_random_bytes,
    check_distributions_against_ggml,
    check_distributions_with_importance,
    check_hypothesis_rows,
    check_importance_ignored,
    check_llama_weights,
    check_quantize_against_gguf_py,
    check_rejects_non_finite,
    check_rejects_partial_blocks,
    finite_rows,
)
from tests.quant_data import quant_cases

LEGACY = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0]
K_QUANTS = [GGMLType.Q6_K, GGMLType.Q3_K]
TYPES = LEGACY + K_QUANTS
WITH_IMPORTANCE = [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q3_K]

# Row lengths per family, and rows per distribution so that each case stays well under a second.
ROW_LENGTHS = {GGMLType.Q8_0: (32, 64, 4096), GGMLType.Q4_0: (32, 64, 4096), GGMLType.Q5_0: (32, 64, 4096),
               GGMLType.Q6_K: (256, 512, 4096), GGMLType.Q3_K: (256, 512, 4096)}


def _n_rows(row_length: int) -> int:
    return max(8, 64 * 1024 // row_length)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_without_importance(ggml_type):
    check_distributions_against_ggml(ggml_type, ROW_LENGTHS[ggml_type], _n_rows, quant_cases)


@pytest.mark.parametrize("ggml_type", WITH_IMPORTANCE, ids=lambda t: t.name)
def test_quantize_matches_ggml_with_importance(ggml_type):
    check_distributions_with_importance(ggml_type, ROW_LENGTHS[ggml_type], _n_rows, quant_cases)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_llama_weights(ggml_type):
    check_llama_weights(ggml_type, max_rows=2048, importance_rows=512, with_importance=ggml_type in WITH_IMPORTANCE)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_arbitrary_bytes(ggml_type):
    check_dequantize_of_random_bytes(ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_single_blocks_and_tile_remainders(ggml_type):
    """Group counts of 1, and one group past a whole number of search tiles, where numpy's
    reductions take other code paths (a [16, 1] array is summed pairwise unless we prevent it)."""
    fmt = get_format(ggml_type)
    rng = np.random.default_rng(300 + int(ggml_type))
    importance = None
    cases = [np.ones((1, fmt.block_size), np.float32), rng.standard_normal((1, fmt.block_size), dtype=np.float32),
             rng.standard_normal((3, fmt.block_size), dtype=np.float32)]
    tile_blocks = search_symmetric.TILE_GROUPS + 1
    cases.append(np.tile(rng.standard_normal((1, fmt.block_size), dtype=np.float32), (1, tile_blocks)))
    for rows in cases:
        check_against_ggml(rows, ggml_type, None, f"{rows.shape[0]} rows of {rows.shape[1]}")
        if ggml_type in WITH_IMPORTANCE:
            importance = np.ones(rows.shape[1], np.float32)
            check_against_ggml(rows, ggml_type, importance, f"{rows.shape[0]} rows of {rows.shape[1]}, flat imatrix")
            importance = rng.lognormal(0.0, 1.0, rows.shape[1]).astype(np.float32)
            check_against_ggml(rows, ggml_type, importance, f"{rows.shape[0]} rows of {rows.shape[1]}, imatrix")


def test_q3_k_later_sweeps_span_search_tiles(monkeypatch):
    """Q3_K sweeps the groups left unsettled by the first sweep of every search tile together: with
    small tiles, so that a registry chunk holds several (and a partial one), it still matches ggml,
    as it does over several registry chunks."""
    monkeypatch.setattr(search_q3, "Q3_TILE_GROUPS", 1000)
    rows = np.random.default_rng(301).standard_normal((300, 4096), dtype=np.float32)
    rows[::3] *= np.float32(1e-3)  # a mix of magnitudes across tiles
    check_against_ggml(rows, GGMLType.Q3_K, None, "300 rows of 4096 in tiles of 1000 groups")


@pytest.mark.parametrize("n", [16, 32])
def test_ordered_sum_adds_in_c_order_for_any_group_count(n):
    rng = np.random.default_rng(n)
    for n_groups in range(1, 40):
        for terms in (np.full((n, n_groups), 28377.914, np.float32),
                      (rng.standard_normal((n, n_groups)) * 10.0 ** rng.uniform(-3, 3, (n, n_groups))).astype(np.float32)):
            expected = np.zeros(n_groups, np.float32)
            for row in terms:
                expected = (expected + row).astype(np.float32)
            assert_same_floats(numerics.sum_from_zero(terms), expected, f"{n} x {n_groups} sum")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@settings(max_examples=40, deadline=None)
@given(rows=finite_rows(), data=st.data())
def test_quantize_matches_ggml_on_any_finite_floats(ggml_type, rows, data):
    check_hypothesis_rows(rows, ggml_type, data, with_importance=ggml_type in WITH_IMPORTANCE)


@pytest.mark.parametrize("ggml_type", LEGACY, ids=lambda t: t.name)
def test_quantize_matches_gguf_py_on_ordinary_weights(ggml_type):
    # gguf-py rounds some degenerate blocks (ties of opposite sign, all -0.0) differently from ggml,
    # so it is a second opinion on ordinary data only; ggml is the reference everywhere.
    check_quantize_against_gguf_py(ggml_type, (256, 4096))


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(ggml_type):
    check_dequantize_against_gguf_py(ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_rejects_rows_that_are_not_whole_blocks(ggml_type):
    check_rejects_partial_blocks(ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nan_and_inf(ggml_type, bad):
    check_rejects_non_finite(ggml_type, bad)


@pytest.mark.parametrize("ggml_type", [GGMLType.Q3_K, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("with_importance", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_finds_non_finite_values_in_any_chunk(ggml_type, with_importance, bad):
    """Q3_K and Q6_K find NaN and Inf in their own searches instead of a scan by the registry
    (finds_non_finite): a bad value in a later chunk, in the middle of a tile, is still refused
    naming its row."""
    assert get_format(ggml_type).finds_non_finite
    rows = np.random.default_rng(3).standard_normal((1100, 4096)).astype(np.float32)
    rows[1050, 2345] = bad
    importance = np.ones(4096, np.float32) if with_importance else None
    with pytest.raises(QuantizationError, match="row 1050 contains NaN or Inf"):
        quantize(rows, ggml_type, importance)


def test_q8_0_ignores_importance_as_ggml_does():
    check_importance_ignored(GGMLType.Q8_0, 256)
