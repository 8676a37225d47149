"""One source, several GGUF files: each tensor read and made float once, quantized to every file's type.

`write_plans` takes the plans of one checkpoint for several output types (f16, q8_0, q4_k_m, ...)
and writes all their files in one pass over the source tensors. `convert` is the case of one plan.

- Tensors are converted in one order (the llama.cpp order when a preset is among the plans, else
  the first plan's), a tensor's pieces for every file by the same work unit, in a small thread
  pool, at most workers.lookahead_bytes(workers) of output ahead of the writers.
- Each file has its own writer thread, fed through a bounded queue in that file's own tensor
  order. A tensor that comes before its turn in a file (a preset file puts output.weight first,
  an f16 file last) waits in a spill file: in memory up to SPILL_MEMORY, then on disk beside the
  output in an anonymous temporary file (nothing is left behind, even after a kill).
- Any error ends every file of the source: writers delete their temporary files, no target is
  touched. The files are renamed onto their targets only once every one of them is complete (the
  parts of a split model appear together, or none does).
"""

from __future__ import annotations

import queue
import resource
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGUF_DEFAULT_ALIGNMENT, Keys
from ggufsmith.converters import pipeline
from ggufsmith.converters.plan import ConversionPlan, PlannedTensor
from ggufsmith.converters.workers import Quantizer, lookahead_bytes, resolve_workers
from ggufsmith.errors import OutputError
from ggufsmith.gguf_writer.writer import GGUFWriter
from ggufsmith.quantize.presets import llama_tensor_order
from ggufsmith.readers.lazy_tensor import EncodedTensor
from ggufsmith.readers.safetensors import RowSlicedTensor

# Bytes of early tensors a file keeps in memory before its spill file moves to disk.
SPILL_MEMORY = 64 << 20
# Pieces queued for one writer thread: bounds what a slow writer holds back.
QUEUE_PIECES = 4
_READ_CHUNK = 16 << 20
# Descriptors left for the inputs (memory-mapped checkpoint files, the importance matrix, spill files).
FD_MARGIN = 256

_END = object()  # a tensor's last piece was sent
_ABORT = object()  # the producer failed: give up the file
_CLOSE = object()  # the producer is done

# A work unit: a function giving (file index, piece of that file's tensor) pairs, and their total size.
Unit = tuple[Callable[[], list[tuple[int, np.ndarray]]], int]


def write_plans(jobs: list[tuple[ConversionPlan, Path]], *, progress: bool = True,
                on_bytes: Callable[[int], None] | None = None, inputs: Iterable[str | Path] = (),
                force: bool = False, threads: int | None = None, quantizer: Quantizer | None = None) -> list[Path]:
    """Write each plan (all of the same checkpoint) to its path, reading the source once, on
    `threads` conversion workers (default: every core this process may use).

    `on_bytes(n)` is called as n bytes of output are written (for a caller's own progress bar);
    with `progress` a tqdm bar on stderr shows the same. `inputs`, `force`: as GGUFWriter's, for
    every target. `quantizer`: the caller's (already started, closed by the caller), else one of
    `threads` workers for this call. Returns the written paths."""
    from tqdm import tqdm

    total = sum(plan.total_bytes for plan, _ in jobs)
    desc = jobs[0][1].name if len(jobs) == 1 else f"{len(jobs)} files"
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
               disable=not progress, desc=desc, dynamic_ncols=True)
    lock = threading.Lock()

    def written(n: int) -> None:
        with lock:
            bar.update(n)
            if on_bytes is not None:
                on_bytes(n)

    workers = resolve_workers(threads)
    _enough_file_descriptors(len(jobs), Path(jobs[0][1]))
    inputs = tuple(inputs)
    sinks = []
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ggufsmith-convert")
    own_quantizer = quantizer is None
    if own_quantizer:
        quantizer = Quantizer(workers)
    finished = False
    try:
        for plan, dst in jobs:  # each target checked (not an input, ...) before any work
            sinks.append(_Sink(plan, Path(dst), written, inputs, force))
        for sink in sinks:
            sink.thread.start()
        current: tuple[str, list] | None = None
        for name, group, pieces in _converted_in_order(_groups(jobs), pool, quantizer, lookahead_bytes(workers)):
            if current is None or current[0] != name:
                if current is not None:
                    for i, _ in current[1]:
                        sinks[i].finish(current[0])
                current = (name, group)
                for i, _ in group:
                    sinks[i].start(name)
            for i, piece in pieces:
                sinks[i].put(name, piece)
        if current is not None:
            for i, _ in current[1]:
                sinks[i].finish(current[0])
        finished = True
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for sink in sinks:
            sink.close(abort=not finished)
        if own_quantizer:
            quantizer.close()
        bar.close()
        errors = [sink.error for sink in sinks if sink.error is not None]
        if not finished or errors:
            for sink in sinks:
                sink.writer.abort()
    if errors:
        raise errors[0]
    _commit_all(sinks)
    return [sink.path for sink in sinks]


def _enough_file_descriptors(n_files: int, first: Path) -> None:
    """Every file is open until all are complete (two descriptors each: data and lock), as gguf-py's
    split writer keeps its shards open: raise the soft limit if needed, else refuse in one line
    rather than fail midway with "too many open files"."""
    needed = 2 * n_files + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise OutputError(f"{first}: {n_files} files written at once need {needed} open files, above this process's "
                      f"limit of {hard} (ulimit -n); write fewer parts (a larger --split-max-size or --split-max-tensors)")


def _commit_all(sinks: list[_Sink]) -> None:
    """Every file is complete: rename them all onto their targets (the parts of a split model, the
    files of a batch appear together). A failed rename deletes the temporary files not yet renamed."""
    try:
        for sink in sinks:
            sink.writer.commit()
    finally:
        for sink in sinks:
            sink.writer.abort()  # a no-op for the committed ones


def _groups(jobs: list[tuple[ConversionPlan, Path]]) -> list[tuple[str, list[tuple[int, PlannedTensor]]]]:
    """(GGUF name, [(file index, its planned tensor)]) in the order the tensors are converted."""
    by_name: dict[str, list[tuple[int, PlannedTensor]]] = {}
    for i, (plan, _) in enumerate(jobs):
        for t in plan.tensors:
            by_name.setdefault(t.name, []).append((i, t))
    order = llama_tensor_order(by_name)
    if not any([t.name for t in plan.tensors] == order for plan, _ in jobs):
        order = list(by_name)  # no file in llama.cpp's order (no preset): the first file's order
    return [(name, by_name[name]) for name in order]


def _units(group: list[tuple[int, PlannedTensor]], quantizer: Quantizer) -> Iterator[Unit]:
    """The work units of one tensor for every file that has it (pipeline._work_units for several files)."""
    tensors = [t for _, t in group]
    tensor = tensors[0].tensor
    shared = len(group) > 1 and not any(isinstance(t.tensor, EncodedTensor) and t.tensor.stored_type == t.ggml_type
                                        for t in tensors)
    if not shared:
        # one file (or copied bytes): the single-file units, with their fast paths
        for i, t in group:
            for unit, nbytes in pipeline._work_units(t, quantizer):
                yield (lambda unit=unit, i=i: [(i, unit())]), nbytes
        return
    indices = [i for i, _ in group]

    def encoded(load: Callable[[], np.ndarray], first_row: int) -> list[tuple[int, np.ndarray]]:
        return list(zip(indices, pipeline.encode_many(tensors, load, first_row, quantizer)))

    if isinstance(tensor, RowSlicedTensor) and len(tensor.shape) >= 2:
        rows = pipeline.rows_loader(tensor, tensors, quantizer)
    elif len(tensor.shape) < 2 or tensor.n_elements <= pipeline.SLICE_ELEMENTS:
        yield (lambda: encoded(tensor.load, 0)), sum(t.nbytes for t in tensors)
        return
    else:  # a transformed tensor: loaded whole once, its row ranges quantized at once
        rows = pipeline._LoadedOnce(tensor, n_pieces=len(list(pipeline._row_ranges(tensor)))).rows
    n_rows = max(1, tensor.n_elements // tensor.shape[-1] if tensor.shape[-1] else 1)
    for start, stop in pipeline._row_ranges(tensor):
        yield (lambda start=start, stop=stop: encoded(lambda: rows(start, stop), start)), \
            sum(t.nbytes // n_rows for t in tensors) * (stop - start)


def _converted_in_order(groups, pool: ThreadPoolExecutor, quantizer: Quantizer,
                        lookahead: int) -> Iterator[tuple[str, list, list[tuple[int, np.ndarray]]]]:
    """(name, group, pieces of one unit) in conversion order, conversion running up to `lookahead`
    bytes ahead. A tensor's units follow one another."""
    pending: deque[tuple[str, list, int, Future]] = deque()
    ahead = 0
    for name, group in groups:
        for unit, nbytes in _units(group, quantizer):
            pending.append((name, group, nbytes, pool.submit(unit)))
            ahead += nbytes
            while len(pending) > 1 and ahead > lookahead:
                done, done_group, size, future = pending.popleft()
                ahead -= size
                yield done, done_group, future.result()
    while pending:
        done, done_group, _, future = pending.popleft()
        yield done, done_group, future.result()


class _Sink:
    """One output file: its writer in a thread, fed its tensors in its own order.

    The producer calls start(name), put(name, piece)..., finish(name) for every tensor, then close()."""

    def __init__(self, plan: ConversionPlan, path: Path, written: Callable[[int], None], inputs: tuple, force: bool) -> None:
        self.path = path
        alignment = int(plan.metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT))
        # No fsync, as llama.cpp's converter: the rename already guarantees that the target is never
        # a partial file after an error, Ctrl-C or kill; the OS writes the data back on its own.
        self.writer = GGUFWriter(path, plan.metadata, alignment=alignment, byteorder=plan.byteorder, fsync=False,
                                 inputs=inputs, force=force)
        for t in plan.tensors:
            self.writer.add_tensor(t.name, t.shape, t.ggml_type)
        self.order = [t.name for t in plan.tensors]
        self.error: BaseException | None = None
        self._written = written
        self._next = 0  # index in `order` of the next tensor to hand to the writer thread
        self._live: str | None = None  # tensor streamed straight to the writer thread
        self._spills: dict[str, tempfile.SpooledTemporaryFile] = {}
        self._complete: set[str] = set()
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_PIECES)
        self.thread = threading.Thread(target=self._write, name=f"ggufsmith-write-{path.name}", daemon=True)

    # -- producer side -----------------------------------------------------------------------
    def start(self, name: str) -> None:
        if self.order[self._next] == name:
            self._live = name
        else:
            self._spills[name] = tempfile.SpooledTemporaryFile(max_size=SPILL_MEMORY, dir=self.path.parent)

    def put(self, name: str, piece: np.ndarray) -> None:
        if self._live == name:
            self._send(piece)
        else:
            self._spills[name].write(memoryview(np.ascontiguousarray(piece).reshape(-1).view(np.uint8)))

    def finish(self, name: str) -> None:
        if self._live == name:
            self._live = None
            self._send(_END)
            self._next += 1
        else:
            self._complete.add(name)
        while self._next < len(self.order) and self.order[self._next] in self._complete:
            self._send(self._spills.pop(self.order[self._next]))  # its turn has come
            self._next += 1

    def close(self, abort: bool) -> None:
        """After the last tensor (or on the producer's failure, `abort`): wait for the writer thread."""
        self._send(_ABORT if abort else _CLOSE)
        self.thread.join()
        for spill in self._spills.values():
            spill.close()

    def _send(self, item) -> None:
        self._queue.put(item)

    # -- writer thread -----------------------------------------------------------------------
    def _write(self) -> None:
        try:
            for name in self.order:
                self.writer.write_tensor_pieces(name, self._pieces())
            self.writer.finish(commit=False)  # renamed by write_plans once every file is complete
        except _Aborted:
            self.writer.abort()
        except BaseException as e:  # noqa: BLE001 - handed to the producer's thread
            self.writer.abort()
            self.error = e
            self._drain()

    def _pieces(self) -> Iterator[np.ndarray]:
        item = self._queue.get()
        while item is not _END and item is not _CLOSE:  # _CLOSE here: the writer reports the missing bytes
            if item is _ABORT:
                raise _Aborted
            if isinstance(item, np.ndarray):
                yield item
                self._written(item.nbytes)
            else:  # a spilled tensor: its whole bytes
                with item:
                    item.seek(0)
                    while chunk := item.read(_READ_CHUNK):
                        yield np.frombuffer(chunk, dtype=np.uint8)
                        self._written(len(chunk))
                return
            item = self._queue.get()

    def _drain(self) -> None:
        """After a failure: take what the producer still sends until it is done, so that it never blocks."""
        while True:
            item = self._queue.get()
            if item is _ABORT or item is _CLOSE:
                return
            if hasattr(item, "close"):
                item.close()


class _Aborted(Exception):
    """The producer gave up; the writer deletes its temporary file."""
