"""How many workers a conversion runs, and how much converted output they may hold ahead.

The default is the number of cores this process may really use: the CPUs it is allowed to run on
(its affinity mask: `taskset`, a container's cpuset) and, under a CPU quota (a container's
`--cpus`, a systemd or Kubernetes limit), the quota rounded up. The host's core count
(os.cpu_count) counts CPUs the process cannot have, and oversubscribed workers only add memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGMLType
from ggufsmith.converters.processes import QuantizerProcesses
from ggufsmith.errors import ConversionError
from ggufsmith.quantize import quantize
from ggufsmith.readers.file_rows import FileRows

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")

# Memory budget of the pipeline, in bytes of converted output held ahead of the writer (see
# pipeline._converted_in_order). It grows with the workers, so that every worker has pieces to
# work on while the writer waits for the oldest, and stops growing at LOOKAHEAD_MAX_BYTES.
LOOKAHEAD_MIN_BYTES = 64 << 20
LOOKAHEAD_BYTES_PER_WORKER = 32 << 20
LOOKAHEAD_MAX_BYTES = 1 << 30


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def resolve_workers(threads: int | None) -> int:
    """`threads` as given (--threads N, threads=N), or the available cores when None or 0."""
    if threads is None or threads == 0:
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConversionError(f"threads must be a positive number of workers (or 0 for every available core), got {threads!r}")
    return threads


def lookahead_bytes(workers: int) -> int:
    """Bytes of converted output the pipeline may hold ahead of the writer with `workers` workers."""
    return min(LOOKAHEAD_MAX_BYTES, max(LOOKAHEAD_MIN_BYTES, workers * LOOKAHEAD_BYTES_PER_WORKER))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota (in cores) of this process's cgroup and its ancestors, or None.

    cgroup v2: `cpu.max` holds "QUOTA PERIOD" or "max PERIOD". cgroup v1: cpu.cfs_quota_us (-1 for
    none) and cpu.cfs_period_us in the cpu controller's hierarchy. Inside a container the
    cgroup path read from /proc is often the host's while the container sees its own cgroup
    mounted at the root, so the root itself is read too."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        relative = Path(path.lstrip("/"))
        if controllers == "":  # the unified (v2) hierarchy
            for directory in _ancestors(root, relative):
                quotas.append(_v2_quota(directory / "cpu.max"))
        elif "cpu" in controllers.split(","):
            mount = root / controllers
            if not mount.is_dir():
                mount = root / "cpu"
            for directory in _ancestors(mount, relative):
                quotas.append(_v1_quota(directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _ancestors(mount: Path, relative: Path) -> list[Path]:
    """The cgroup's directory under `mount` and every parent up to `mount` itself."""
    return [mount / p for p in (relative, *relative.parents)]


def _v2_quota(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(quota_file: Path, period_file: Path) -> float | None:
    try:
        quota, period = int(quota_file.read_text()), int(period_file.read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


# -- where the quantizer runs ------------------------------------------------------------------

# Types whose quantizer is a few passes of large numpy operations: they release the interpreter
# lock most of the time and scale on threads, and moving their input to another process would
# cost more than converting it. Every other type (the K-quants' and the imatrix-weighted legacy
# searches: hundreds of small numpy calls per chunk) holds the lock long enough that threads stop
# scaling at about 1.2 cores; those run in worker processes (docs/performance.md).
THREAD_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0})
THREAD_TYPES_WITHOUT_IMPORTANCE = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1})
# Below this many elements a piece is quantized in the calling thread: shipping it to a process
# and back costs more than the lock contention it avoids.
PROCESS_MIN_ELEMENTS = 1 << 16


class Quantizer:
    """ggufsmith.quantize.quantize for the pipeline's worker threads, run in one of `workers`
    quantizer processes (processes.QuantizerProcesses) where threads would serialize on the
    interpreter lock. The result is the same bytes either way: the same function on the same rows."""

    def __init__(self, workers: int):
        self.workers = workers
        self._processes = QuantizerProcesses(workers)

    def __call__(self, data: np.ndarray | FileRows, ggml_type: GGMLType,
                 importance: np.ndarray | None = None) -> np.ndarray:
        """`data`: the rows, or where they lie in a file (read here or by the worker process)."""
        if not self.uses_process(data.size, ggml_type, importance):
            return quantize(data.load() if isinstance(data, FileRows) else data, ggml_type, importance)
        return self._processes.quantize(data, ggml_type, importance)

    def uses_process(self, n_elements: int, ggml_type: GGMLType, importance: np.ndarray | None) -> bool:
        if self.workers < 2 or n_elements < PROCESS_MIN_ELEMENTS or ggml_type in THREAD_TYPES:
            return False
        return importance is not None or ggml_type not in THREAD_TYPES_WITHOUT_IMPORTANCE

    def start(self) -> None:
        """Start the worker processes now rather than at the first piece that needs one."""
        if self.workers >= 2:
            self._processes.start()

    def close(self) -> None:
        self._processes.close()

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
