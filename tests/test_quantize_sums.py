"""The searches' sums of products take np.einsum only where it adds C's way, and the other path
gives ggml's bytes too.

numerics.einsum_sums_are_exact probes this numpy's einsum once per process. The probe must say no
to an einsum with a fused multiply-add (as numpy's SIMD kernels are on ARM64) or with another
summation order, and the multiply-and-reduce path it falls back to must be byte-identical to ggml.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.quantize import numerics
from tests.quant_checks import check_against_ggml, check_distributions_against_ggml
from tests.quant_data import quant_cases

REAL_EINSUM = np.einsum


def _fused_einsum(subscripts, *operands, out=None):
    """einsum as a fused multiply-add computes it: each product added with one rounding."""
    total = np.zeros(operands[0].shape[1], dtype=np.float32)
    for i in range(operands[0].shape[0]):
        product = np.float64(1)
        for operand in operands[:-1]:
            product = (product * operand[i].astype(np.float64)).astype(np.float32)
        total = (total.astype(np.float64) + product.astype(np.float64) * operands[-1][i]).astype(np.float32)
    out[...] = total
    return out


def _pairwise_einsum(subscripts, *operands, out=None):
    """einsum summing each column pairwise, as np.sum along a contiguous axis does."""
    products = operands[0].copy()
    for operand in operands[1:]:
        products *= operand
    out[...] = np.ascontiguousarray(products.T).sum(axis=1)
    return out


@pytest.fixture
def fresh_probe():
    numerics.einsum_sums_are_exact.cache_clear()
    yield numerics.einsum_sums_are_exact
    numerics.einsum_sums_are_exact.cache_clear()


def test_this_numpy_sums_with_einsum(fresh_probe):
    """The x86-64 numpy of the test extra computes einsum's sums C's way: the fast path is the one
    the quantizer tests compare with ggml."""
    assert fresh_probe()


@pytest.mark.parametrize("fake", [_fused_einsum, _pairwise_einsum], ids=["fused-multiply-add", "pairwise"])
def test_the_probe_refuses_an_einsum_that_rounds_otherwise(fresh_probe, monkeypatch, fake):
    monkeypatch.setattr(numerics.np, "einsum", fake)
    assert not fresh_probe()


def test_the_probe_refuses_an_einsum_that_adds_to_its_output(fresh_probe, monkeypatch):
    def accumulating(subscripts, *operands, out=None):
        return np.add(out, REAL_EINSUM(subscripts, *operands), out=out)

    monkeypatch.setattr(numerics.np, "einsum", accumulating)
    assert not fresh_probe()


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_K, GGMLType.Q2_K, GGMLType.Q6_K, GGMLType.Q5_K], ids=lambda t: t.name)
def test_without_einsum_the_bytes_are_still_ggmls(monkeypatch, ggml_type):
    """Where the probe says no, the sums are multiplied and reduced row by row: the same bytes,
    on every distribution of the quantizer tests and with an importance matrix."""
    monkeypatch.setattr(numerics, "einsum_sums_are_exact", lambda: False)
    monkeypatch.setattr(numerics.np, "einsum", None)  # any call to it would fail
    check_distributions_against_ggml(ggml_type, (256, 4096), lambda n: max(8, 16 * 1024 // n), quant_cases)
    rng = np.random.default_rng(int(ggml_type))
    rows = rng.standard_normal((16, 4096), dtype=np.float32)
    check_against_ggml(rows, ggml_type, rng.lognormal(0.0, 1.0, 4096).astype(np.float32), "normal rows, imatrix")
