"""Running a batch's sources on this machine: in this process, or over worker processes within a memory budget.

Each source is one task (`runner.run_source`), so each source is still read once. How many run at
once: --jobs (or the plan's `jobs`), else the cores, never more than the memory budget allows at
`memory_per_source` bytes each, never more than there are sources. A worker that dies (killed,
out of memory) fails the sources it had, with that message; the others go on.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from ggufsmith.batch.plan import SourceSpec
from ggufsmith.batch.runner import OutputResult, run_source
from ggufsmith.converters import fanout, pipeline
from ggufsmith.converters.workers import available_cores, lookahead_bytes

# What one source's conversion holds besides the interpreter: converted pieces ahead of the writers,
# pieces queued per file, spills kept in memory per file, and the largest tensor loaded whole.
BASE_MEMORY = 512 << 20


def memory_per_source(spec: SourceSpec, threads: int) -> int:
    per_file = fanout.SPILL_MEMORY + fanout.QUEUE_PIECES * (pipeline.SLICE_ELEMENTS * 4)
    return BASE_MEMORY + lookahead_bytes(threads) + len(spec.outtypes) * per_file


def threads_per_worker(workers: int, threads: int | None = None) -> int:
    """Conversion threads of each worker: `threads` if given, else the cores shared out, so that
    workers do not fight over them."""
    return threads or max(1, available_cores() // workers)


def worker_count(specs: list[SourceSpec], jobs: int | None, max_memory: int | None, threads: int | None = None) -> int:
    """Sources converted at once: `jobs`, else the cores (divided by `threads` when each source
    converts on that many), within `max_memory` and the number of sources."""
    count = jobs or (max(1, available_cores() // threads) if threads else available_cores())
    if max_memory is not None:
        need = max(memory_per_source(s, threads_per_worker(count, threads)) for s in specs)
        count = min(count, max(1, max_memory // need))
    return max(1, min(count, len(specs)))


def run_local(specs: list[SourceSpec], *, force: bool, workers: int,
              on_progress: Callable[[float], None] | None = None, threads: int | None = None) -> Iterator[list[OutputResult]]:
    """Each source's results as it finishes (in this process when `workers` is 1, reporting its
    progress through `on_progress` as run_source does), each converted on `threads` threads (by
    default the cores shared out between the workers)."""
    threads = threads_per_worker(workers, threads)
    if workers == 1:
        for spec in specs:
            yield run_source(spec, force=force, on_progress=on_progress, threads=threads)
        return
    # spawn, not fork: the parent has threads (the progress bar's), which fork would copy half-alive
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_source, spec, force=force, threads=threads): spec for spec in specs}
        for future in as_completed(futures):
            spec = futures[future]
            try:
                yield future.result()
            except BrokenProcessPool:
                yield [OutputResult(spec.label, o, None, "failed", error="the worker process running this source died "
                                    "(killed or out of memory: lower --jobs or --max-memory)") for o in spec.outtypes]
