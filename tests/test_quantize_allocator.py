"""The quantizer's per-chunk temporaries reuse the process's memory instead of faulting in fresh
pages every chunk (ggufsmith/quantize/allocator.py): without it, glibc hands the top of the heap
back to the kernel after each chunk and a K-quant pays 11,000-18,000 page faults per million
values, a fifth to a third of its CPU time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MEASURE = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from ggufsmith.quantize import quantize
    rows = np.random.default_rng(0).standard_normal((int(sys.argv[2]), 4096), dtype=np.float32)
    quantize(rows, sys.argv[1])  # the first call grows the heap to its working size
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        quantize(rows, sys.argv[1])
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the setting is glibc's; elsewhere it is a no-op")
@pytest.mark.parametrize(
    "type_name, n_rows",
    # Q3_K takes chunks of 2M values: 8 MiB float32 temporaries, which must stay below the
    # mmap threshold too (at 8 MiB they were mapped afresh: ~500 faults a chunk)
    [("Q4_K", 256), ("Q6_K", 256), ("Q3_K", 512)],
)
def test_repeated_quantization_reuses_memory_instead_of_faulting_pages(type_name, n_rows):
    # A fresh interpreter: the heap's state must not depend on what other tests allocated.
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, type_name, str(n_rows)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    faults = sorted(int(line) for line in result.stdout.split())
    # Without the setting every call faults ~3,000-7,000 times (1-2M values); with it, 0. The
    # median, because the heap may still grow once as its layout settles (2 MiB, 512 faults, in
    # one of the five calls on CI): a one-off, not a per-chunk cost. The output array (a few
    # hundred KiB, mapped afresh each call) and numpy's own caches stay well below 300.
    median = faults[len(faults) // 2]
    assert median < 300, f"{type_name}: {faults} page faults in five repeated quantizations of {n_rows} rows of 4096"
