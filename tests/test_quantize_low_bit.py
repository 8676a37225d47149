"""The types below 4.5 bits per weight (IQ4_NL, IQ4_XS, the grid types IQ3_XXS / IQ3_S / IQ2_XXS /
IQ2_XS / IQ2_S / IQ1_S / IQ1_M, the ternary TQ1_0 / TQ2_0, Q1_0, Q2_0, MXFP4) are byte-identical to
ggml's C quantizer and decode bit for bit as ggml's to_float does, with and without an importance
matrix, on the data sets of the other quantizer tests.

The grid types' search sums weight * diff^2 ~ |x|^3 in float32: beyond |x| ~ 1e12 that overflows
and ggml aborts (GGML_ASSERT in its neighbour search, or GGML_ABORT when NaN scales leave a group
off the grid). Their "huge" rows are therefore scaled into 1e-22 .. 1e11, and a separate test shows
that both ggml and we refuse larger values.

The oracle is ggml itself (tests/ggml_oracle.py); gguf-py is a second reference for decoding where
it knows the type.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggufsmith.constants import GGMLType
from ggufsmith.errors import QuantizationError
from ggufsmith.quantize import get_format, iq_nonlinear, quantize
from tests.ggml_oracle import _lib_dir, ggml_base
from tests.quant_checks import (
    check_against_ggml,
    check_dequantize_against_gguf_py,
    check_dequantize_of_random_bytes,
    check_distributions_against_ggml,
    check_distributions_with_importance,
    check_hypothesis_rows,
    check_importance_ignored,
    check_llama_weights,
    check_rejects_non_finite,
    check_rejects_partial_blocks,
    finite_rows,
)
from tests.quant_data import quant_cases

# ggml refuses to quantize these without an imatrix.
REQUIRES_IMPORTANCE = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S]
GRID_TYPES = [GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S, GGMLType.IQ1_M] + REQUIRES_IMPORTANCE
# These use the imatrix; ggml ignores it for the others (they accept one, as Q8_0 does).
USES_IMPORTANCE = [GGMLType.IQ4_NL, GGMLType.IQ4_XS] + GRID_TYPES
IGNORES_IMPORTANCE = [GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.Q1_0, GGMLType.Q2_0, GGMLType.MXFP4]
TYPES = USES_IMPORTANCE + IGNORES_IMPORTANCE
WORK_WITHOUT_IMPORTANCE = [t for t in TYPES if t not in REQUIRES_IMPORTANCE]
# Below ggml's abort threshold (module docstring).
GRID_HUGE_SCALE = np.float32(1e-26)

ROW_LENGTHS = {
    GGMLType.IQ4_NL: (32, 64, 4096),
    GGMLType.MXFP4: (32, 64, 4096),
    GGMLType.Q2_0: (64, 128, 4096),
    GGMLType.Q1_0: (128, 256, 4096),
}


def _row_lengths(ggml_type: GGMLType) -> tuple[int, ...]:
    return ROW_LENGTHS.get(ggml_type, (256, 512, 4096))


def _n_rows(row_length: int) -> int:
    return max(8, 64 * 1024 // row_length)


def _cases_for(ggml_type: GGMLType):
    if ggml_type not in GRID_TYPES:
        return quant_cases

    def cases(rng, n_rows, row_length, block_size):
        for name, rows in quant_cases(rng, n_rows, row_length, block_size):
            yield name, rows * GRID_HUGE_SCALE if name == "huge" else rows

    return cases


@pytest.mark.parametrize("ggml_type", WORK_WITHOUT_IMPORTANCE, ids=lambda t: t.name)
def test_quantize_matches_ggml_without_importance(ggml_type):
    check_distributions_against_ggml(ggml_type, _row_lengths(ggml_type), _n_rows, _cases_for(ggml_type))


@pytest.mark.parametrize("ggml_type", USES_IMPORTANCE, ids=lambda t: t.name)
def test_quantize_matches_ggml_with_importance(ggml_type):
    check_distributions_with_importance(ggml_type, _row_lengths(ggml_type), _n_rows, _cases_for(ggml_type))


@pytest.mark.parametrize("ggml_type", IGNORES_IMPORTANCE, ids=lambda t: t.name)
def test_importance_is_ignored_as_ggml_does(ggml_type):
    check_importance_ignored(ggml_type, 512)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_llama_weights(ggml_type):
    check_llama_weights(ggml_type, max_rows=2048, importance_rows=512,
                        plain=ggml_type not in REQUIRES_IMPORTANCE, with_importance=ggml_type in USES_IMPORTANCE)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_on_single_blocks(ggml_type):
    """One block (numpy reduces a [n, 1] array pairwise unless told otherwise), a constant block,
    and blocks of values on the rounding ties of the type's levels."""
    block_size = get_format(ggml_type).block_size
    rng = np.random.default_rng(300 + int(ggml_type))
    cases = {
        "one block": rng.standard_normal((1, block_size), dtype=np.float32),
        "constant": np.ones((1, block_size), np.float32),
        "halves": (rng.integers(-8, 9, (3, block_size)) / np.float32(2)).astype(np.float32),
    }
    for name, rows in cases.items():
        if ggml_type not in REQUIRES_IMPORTANCE:
            check_against_ggml(rows, ggml_type, None, name)
        if ggml_type in USES_IMPORTANCE:
            check_against_ggml(rows, ggml_type, rng.lognormal(0.0, 1.0, block_size).astype(np.float32), f"{name}, imatrix")


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_arbitrary_bytes(ggml_type):
    check_dequantize_of_random_bytes(ggml_type)


@pytest.mark.parametrize(
    "ggml_type", [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.MXFP4], ids=lambda t: t.name
)
def test_dequantize_matches_gguf_py(ggml_type):
    check_dequantize_against_gguf_py(ggml_type)


def test_nearest_level_tables_agree_with_the_rule_everywhere_near_a_boundary():
    """The floor-indexed tables behind nearest_levels give best_index_int8's answer for every
    float32 within 64 ulps of each midpoint between levels, at the ends, and for Inf and NaN."""
    levels = iq_nonlinear.LEVELS.astype(np.float32)
    probes = [np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -128.5, 120.0], np.float32), levels]
    for lower, upper in zip(levels[:-1], levels[1:]):
        mid = np.float32((int(lower) + int(upper)) / 2)
        bits = mid.view(np.int32) + np.arange(-64, 65, dtype=np.int32)
        probes.append(bits.view(np.float32))
    values = np.concatenate(probes)
    expected = [15 if np.isnan(v) else iq_nonlinear._reference_nearest_level(v) for v in values]
    with np.errstate(invalid="ignore"):
        assert iq_nonlinear.nearest_levels(values).tolist() == expected


def _max_magnitude(ggml_type: GGMLType) -> float | None:
    # The grid searches' errors grow as imatrix * |x|**3: with the drawn imatrix up to 1e6 they
    # overflow float32 from |x| ~ 1e10 on (hypothesis found 1e11 with 2.4e5), where ggml falls
    # back to a search of the whole grid that we do not reproduce and we refuse instead.
    return float(np.float32(1e10)) if ggml_type in GRID_TYPES else None


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_quantize_matches_ggml_on_any_finite_floats(ggml_type, data):
    rows = data.draw(finite_rows(_max_magnitude(ggml_type)))
    check_hypothesis_rows(rows, ggml_type, data,
                          plain=ggml_type not in REQUIRES_IMPORTANCE, with_importance=ggml_type in USES_IMPORTANCE)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_rejects_rows_that_are_not_whole_blocks(ggml_type):
    check_rejects_partial_blocks(ggml_type, with_importance=True)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_rejects_nan_and_inf(ggml_type):
    check_rejects_non_finite(ggml_type, np.nan, with_importance=True)


@pytest.mark.parametrize("ggml_type", [GGMLType.IQ1_S, GGMLType.IQ1_M], ids=lambda t: t.name)
def test_iq1_split_choice_matches_ggml_on_ties_and_extreme_sums(ggml_type):
    """IQ1's choice among ~600-1100 split candidates compares only those near the best ratio, the
    rest only where that cannot be shown to be ggml's answer: blocks of equal values (many
    candidates with the same sums), two values or small integers (near ties between different sums),
    and magnitudes whose products leave float32's normal range (the one-by-one comparison) must
    all give ggml's bytes."""
    rng = np.random.default_rng(7)
    cases = {
        "equal": np.full((4, 512), 1.0), "equal negative": np.full((4, 512), -3.5),
        "two values": rng.choice([-1.0, 1.0], (4, 512)), "small integers": rng.integers(-2, 3, (4, 512)).astype(float),
        "tiny": rng.standard_normal((4, 512)) * 1e-12, "large": rng.standard_normal((4, 512)) * 1e9,
        "mixed scales": rng.standard_normal((4, 512)) * 10.0 ** rng.integers(-8, 8, (4, 512)),
    }
    for name, rows in cases.items():
        for importance in (rng.lognormal(0, 1, 512).astype(np.float32), np.ones(512, np.float32)):
            check_against_ggml(rows.astype(np.float32), ggml_type, importance, name)


_GGML_ON_HUGE_VALUES = """
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
rows = np.full(256, 1e30, np.float32) * np.linspace(0.1, 1.0, 256, dtype=np.float32)
out = np.zeros(256, np.uint8)
weights = np.ones(256, np.float32)
lib.ggml_quantize_chunk(int(sys.argv[2]), ctypes.c_void_p(rows.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                        ctypes.c_int64(0), ctypes.c_int64(1), ctypes.c_int64(256), ctypes.c_void_p(weights.ctypes.data))
"""


@pytest.mark.parametrize("ggml_type", GRID_TYPES, ids=lambda t: t.name)
def test_grid_types_refuse_values_whose_errors_overflow_where_ggml_aborts(ggml_type):
    ggml = subprocess.run(
        [sys.executable, "-c", _GGML_ON_HUGE_VALUES, str(_lib_dir() / "libggml-base.so"), str(int(ggml_type))],
        capture_output=True, text=True, timeout=120,
    )
    assert ggml.returncode != 0 and "ggml-quants.c" in ggml.stderr  # GGML_ASSERT or GGML_ABORT
    rows = np.full((1, 256), 1e30, np.float32) * np.linspace(0.1, 1.0, 256, dtype=np.float32)
    with pytest.raises(QuantizationError, match=f"{ggml_type.name} cannot quantize values this large"):
        quantize(rows, ggml_type, np.ones(256, np.float32))


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_types_that_need_an_imatrix_are_the_ones_ggml_refuses_without(ggml_type):
    lib = ggml_base()
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    assert get_format(ggml_type).requires_importance == lib.ggml_quantize_requires_imatrix(int(ggml_type))
    if ggml_type in REQUIRES_IMPORTANCE:
        with pytest.raises(QuantizationError, match=f"{ggml_type.name} needs an importance matrix"):
            quantize(np.ones((1, 256), np.float32), ggml_type)
