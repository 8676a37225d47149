"""Batch conversion: many models to many types from one plan, each source read once.

    from ggufsmith.batch import batch
    report = batch("plan.yaml")                  # or a BatchPlan; ray=True / ray="ADDRESS" for a cluster
    print(report.table()); report.ok

See docs/batch.md for the plan format, resume rules and the Ray backend.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from ggufsmith.batch.plan import BatchPlan, SourceSpec, load_plan, parse_size
from ggufsmith.batch.report import BatchReport
from ggufsmith.batch.runner import OutputResult, run_source

__all__ = ["batch", "BatchPlan", "BatchReport", "OutputResult", "SourceSpec", "load_plan", "run_source"]


def batch(plan: str | Path | BatchPlan, *, force: bool = False, jobs: int | None = None,
          max_memory: int | str | None = None, ray: bool | str = False, progress: bool = False,
          threads: int | None = None) -> BatchReport:
    """Run every source of `plan`; never raises for a failing source (see the report's `failed`).

    `jobs`/`max_memory` (bytes or "8GiB") bound the local worker processes (default: the plan's,
    else the cores); `ray` runs one task per source on Ray (True: a local cluster, or an address).
    `threads`: the conversion threads of each source (default: the plan's `threads`, else locally the
    cores shared out between the workers, on Ray 1); locally, `jobs` then defaults to the cores
    divided by it, and on Ray each task reserves that many CPUs. The files are the same for any value.
    `progress` shows a bar over all outputs on stderr."""
    from tqdm import tqdm

    from ggufsmith.batch.local import run_local, worker_count
    from ggufsmith.converters.workers import resolve_workers

    if threads is not None:
        threads = resolve_workers(threads)  # a bad value is refused before anything runs
    if not isinstance(plan, BatchPlan):
        plan = load_plan(plan)
    if threads is None:
        threads = plan.threads
    budget = parse_size(max_memory, "--max-memory") if max_memory is not None else plan.max_memory
    started = time.monotonic()
    report = BatchReport(str(plan.path))
    bar = tqdm(total=plan.n_outputs, unit="file", file=sys.stderr, disable=not progress, desc="batch", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} files [{elapsed}<{remaining}{postfix}]")
    partial = _LiveShare(bar)
    try:
        if ray:
            from ggufsmith.batch.ray_backend import run_ray

            finished = run_ray(plan.sources, force=force, address=ray if isinstance(ray, str) else None,
                               threads=threads or 1)
        else:
            workers = worker_count(plan.sources, jobs or plan.jobs, budget, threads)
            finished = run_local(plan.sources, force=force, workers=workers, on_progress=partial.add, threads=threads)
        for results in finished:
            report.results.extend(results)
            partial.settle(len(results))
            bar.set_postfix_str(f"{results[0].source}: {_statuses(results)}", refresh=True)
    finally:
        bar.close()
    order = {(s.label, o): (s.index, k) for s in plan.sources for k, o in enumerate(s.outtypes)}
    report.results.sort(key=lambda r: order.get((r.source, r.outtype), (0, 0)))
    report.seconds = time.monotonic() - started
    return report


def _statuses(results: list[OutputResult]) -> str:
    return ", ".join(f"{r.outtype} {r.status}" for r in results)


class _LiveShare:
    """The bar's updates for the source running in this process: fractions of files as bytes are
    written (from its writer threads), then settled when the source's results come."""

    def __init__(self, bar) -> None:
        self._bar = bar
        self._shown = 0.0
        self._lock = threading.Lock()

    def add(self, n: float) -> None:
        with self._lock:
            self._shown += n
            self._bar.update(n)

    def settle(self, n_files: int) -> None:
        """A source finished with `n_files` results: the bar gets the rest of them; the next starts at zero."""
        with self._lock:
            self._bar.update(n_files - self._shown)
            self._shown = 0.0
