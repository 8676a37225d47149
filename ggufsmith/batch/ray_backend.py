"""Running a batch's sources on a Ray cluster: one task per source (pip install ggufsmith[ray]).

Workers write straight into the output folders, which must be on a path every node shares (the plan
is resolved to absolute paths by the driver). A task whose worker process or node dies is retried
(`max_retries`); a file is only ever renamed into place complete, and the state file beside the
outputs is what the next run (or a retried task) skips by, so the resume rules are the local ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from ggufsmith.batch.plan import SourceSpec
from ggufsmith.batch.runner import OutputResult, run_source
from ggufsmith.errors import BatchError

# Retries of a task whose worker died (node lost, process killed); a source's own errors are results, not retried.
MAX_RETRIES = 3


def run_ray(specs: list[SourceSpec], *, force: bool, address: str | None, threads: int = 1) -> Iterator[list[OutputResult]]:
    """Each source's results as its task finishes. A task reserves `threads` CPUs and converts on
    that many threads: Ray places tasks by the CPUs they reserve, so a task that used every core of
    its node would share them with as many other tasks as the node has cores."""
    try:
        import ray
    except ImportError:
        raise BatchError("--ray needs Ray: pip install 'ggufsmith[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address or None, log_to_driver=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"PYTHONPATH": _package_root()}} if address is None else None)
    try:
        largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
        if threads > largest:  # Ray would keep such tasks pending, silently, until a node that size joined
            raise BatchError(f"--threads {threads}: no node of the Ray cluster has that many CPUs (the largest has "
                             f"{largest:g}); give at most {int(largest)}")
        task = ray.remote(num_cpus=threads, max_retries=MAX_RETRIES)(_convert_source)
        pending = {task.remote(spec, force, threads): spec for spec in specs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(done[0])
            try:
                yield ray.get(done[0])
            except Exception as e:  # the task's retries ran out (worker or node lost each time)
                yield [OutputResult(spec.label, o, None, "failed", error=f"Ray task lost: {' '.join(str(e).split())[:300]}")
                       for o in spec.outtypes]
    finally:
        if started_here:
            ray.shutdown()


def _convert_source(spec: SourceSpec, force: bool, threads: int) -> list[OutputResult]:
    return run_source(spec, force=force, threads=threads)


def _package_root() -> str:
    """The folder holding this ggufsmith package, for workers of a cluster started here."""
    import ggufsmith

    root = os.path.dirname(os.path.dirname(os.path.abspath(ggufsmith.__file__)))
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
