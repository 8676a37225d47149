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
from hypothesis.extra import numpy as hnp

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize import dequantize, get_format, quantize, search_symmetric
from tests.ggml_oracle import ggml_dequantize, ggml_quantize
from tests.quant_data import importance_vectors, model_weight_rows, quant_cases

LEGACY = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0]
K_QUANTS = [GGMLType.Q6_K, GGMLType.Q3_K]
TYPES = LEGACY + K_QUANTS
WITH_IMPORTANCE = [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q3_K]

# Row lengths per family, and rows per distribution so that each case stays well under a second.
ROW_LENGTHS = {GGMLType.Q8_0: (32, 64, 4096), GGMLType.Q4_0: (32, 64, 4096), GGMLType.Q5_0: (32, 64, 4096),
               GGMLType.Q6_K: (256, 512, 4096), GGMLType.Q3_K: (256, 512, 4096)}


def _n_rows(row_length: int) -> int:
    return max(8, 64 * 1024 // row_length)


def assert_same_bytes(ours: np.ndarray, expected: np.ndarray, ggml_type: GGMLType, what: str) -> None:
    fmt = get_format(ggml_type)
    ours = ours.reshape(expected.shape)
    if np.array_equal(ours, expected):
        return
    row, byte = np.argwhere(ours != expected)[0]
    block = byte // fmt.type_size
    n_bad = int((ours != expected).sum())
    raise AssertionError(
        f"{ggml_type.name} {what}: {n_bad} bytes differ from ggml; first in row {row}, block {block}, "
        f"byte {byte % fmt.type_size} of the block: ours {ours[row, byte]:#04x}, ggml {expected[row, byte]:#04x}"
    )


def assert_same_floats(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Bit equality of float32 arrays (so -0.0 vs 0.0 and NaN payloads count)."""
    ours_bits = np.ascontiguousarray(ours, dtype=np.float32).reshape(-1).view(np.uint32)
    expected_bits = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1).view(np.uint32)
    if np.array_equal(ours_bits, expected_bits):
        return
    i = int(np.argwhere(ours_bits != expected_bits)[0][0])
    raise AssertionError(
        f"{what}: {(ours_bits != expected_bits).sum()} values differ; first at flat index {i}: "
        f"ours {ours_bits[i]:#010x} ({ours_bits.view(np.float32)[i]!r}), "
        f"ggml {expected_bits[i]:#010x} ({expected_bits.view(np.float32)[i]!r})"
    )


def check_against_ggml(rows: np.ndarray, ggml_type: GGMLType, importance: np.ndarray | None, what: str) -> None:
    expected = ggml_quantize(rows, int(ggml_type), importance)
    ours = quantize(rows, ggml_type, importance)
    assert_same_bytes(ours, expected, ggml_type, what)
    decoded = dequantize(expected, ggml_type, rows.shape)
    assert_same_floats(decoded, ggml_dequantize(expected, int(ggml_type), rows.size), f"{ggml_type.name} {what} dequantize")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_without_importance(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    for row_length in ROW_LENGTHS[ggml_type]:
        for name, rows in quant_cases(rng, _n_rows(row_length), row_length, get_format(ggml_type).block_size):
            check_against_ggml(rows, ggml_type, None, f"{name} rows of {row_length}")


@pytest.mark.parametrize("ggml_type", WITH_IMPORTANCE, ids=lambda t: t.name)
def test_quantize_matches_ggml_with_importance(ggml_type):
    rng = np.random.default_rng(100 + int(ggml_type))
    block_size = get_format(ggml_type).block_size
    for row_length in ROW_LENGTHS[ggml_type]:
        n_rows = max(4, _n_rows(row_length) // 4)
        for imatrix_name, importance in importance_vectors(rng, row_length):
            for name, rows in quant_cases(rng, n_rows, row_length, block_size):
                check_against_ggml(rows, ggml_type, importance, f"{name} rows of {row_length}, {imatrix_name} imatrix")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_llama_weights(ggml_type):
    rows = model_weight_rows(256, max_rows=2048)
    check_against_ggml(rows, ggml_type, None, "Llama weights")
    if ggml_type in WITH_IMPORTANCE:
        importance = np.random.default_rng(7).lognormal(0.0, 1.0, 256).astype(np.float32)
        check_against_ggml(rows[:512], ggml_type, importance, "Llama weights with imatrix")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_arbitrary_bytes(ggml_type):
    """Every bit pattern decodes as ggml decodes it, including scales that are float16 NaN, Inf,
    subnormal or -0.0, and level combinations our quantizer never writes."""
    fmt = get_format(ggml_type)
    rng = np.random.default_rng(200 + int(ggml_type))
    row_length = fmt.block_size * 8
    data = rng.integers(0, 256, (512, fmt.row_bytes(row_length)), dtype=np.uint8)
    assert_same_floats(
        dequantize(data, ggml_type, (512, row_length)),
        ggml_dequantize(data, int(ggml_type), 512 * row_length),
        f"{ggml_type.name} dequantize of random bytes",
    )


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


@pytest.mark.parametrize("n", [16, 32])
def test_ordered_sum_adds_in_c_order_for_any_group_count(n):
    rng = np.random.default_rng(n)
    for n_groups in range(1, 40):
        for terms in (np.full((n, n_groups), 28377.914, np.float32),
                      (rng.standard_normal((n, n_groups)) * 10.0 ** rng.uniform(-3, 3, (n, n_groups))).astype(np.float32)):
            expected = np.zeros(n_groups, np.float32)
            for row in terms:
                expected = (expected + row).astype(np.float32)
            assert_same_floats(search_symmetric.ordered_sum(terms), expected, f"{n} x {n_groups} sum")


_finite_rows = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=3).map(lambda s: (s[0], s[1] * 256)),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@settings(max_examples=40, deadline=None)
@given(rows=_finite_rows, data=st.data())
def test_quantize_matches_ggml_on_any_finite_floats(ggml_type, rows, data):
    check_against_ggml(rows, ggml_type, None, "hypothesis rows")
    if ggml_type in WITH_IMPORTANCE:
        importance = data.draw(hnp.arrays(np.float32, rows.shape[1], elements=st.floats(0, 1e6, width=32)))
        check_against_ggml(rows, ggml_type, importance, "hypothesis rows with imatrix")


@pytest.mark.parametrize("ggml_type", LEGACY, ids=lambda t: t.name)
def test_quantize_matches_gguf_py_on_ordinary_weights(ggml_type):
    # gguf-py rounds some degenerate blocks (ties of opposite sign, all -0.0) differently from ggml,
    # so it is a second opinion on ordinary data only; ggml is the reference everywhere.
    gguf = pytest.importorskip("gguf")
    rows = np.random.default_rng(3).standard_normal((256, 4096), dtype=np.float32)
    expected = gguf.quants.quantize(rows, gguf.GGMLQuantizationType(int(ggml_type))).view(np.uint8)
    assert_same_bytes(quantize(rows, ggml_type), expected.reshape(256, -1), ggml_type, "vs gguf-py")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(ggml_type):
    gguf = pytest.importorskip("gguf")
    fmt = get_format(ggml_type)
    rows = np.random.default_rng(4).standard_normal((64, 1024), dtype=np.float32)
    data = quantize(rows, ggml_type).reshape(64, -1)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(int(ggml_type)))
    assert_same_floats(dequantize(data, ggml_type, rows.shape), expected, f"{fmt.ggml_type.name} vs gguf-py")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_rejects_rows_that_are_not_whole_blocks(ggml_type):
    block_size = get_format(ggml_type).block_size
    with pytest.raises(QuantizationError, match=f"multiple of {block_size}"):
        quantize(np.zeros((2, block_size + 16), np.float32), ggml_type)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nan_and_inf(ggml_type, bad):
    rows = np.ones((3, 256), np.float32)
    rows[2, 17] = bad
    with pytest.raises(QuantizationError, match="row 2 contains NaN or Inf"):
        quantize(rows, ggml_type)


def test_q8_0_ignores_importance_as_ggml_does():
    rows = np.random.default_rng(9).standard_normal((64, 256), dtype=np.float32)
    importance = np.random.default_rng(10).lognormal(0.0, 2.0, 256).astype(np.float32)
    expected = ggml_quantize(rows, int(GGMLType.Q8_0), importance)
    assert_same_bytes(quantize(rows, GGMLType.Q8_0, importance), expected, GGMLType.Q8_0, "with imatrix")
    assert_same_bytes(quantize(rows, GGMLType.Q8_0), expected, GGMLType.Q8_0, "without imatrix")
