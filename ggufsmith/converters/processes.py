"""Quantizer processes: ggufsmith.quantize.quantize run in other Python interpreters.

The K-quant searches are hundreds of small numpy calls per chunk; each holds the interpreter lock
for its dispatch, so threads of one process stop scaling at about 1.2 cores (docs/performance.md).
A worker process has an interpreter lock of its own. Each is a fresh `python -m` of this module,
started with pipes to its stdin and stdout: never a fork of the (multi-threaded) caller, and never
a re-import of the caller's main script, as multiprocessing's spawn and forkserver would do.

One request: a pickled header (type, shape, importance, place) then, when `place` is None, the
float32 rows as raw bytes; one answer: a pickled header ("ok", size) then the quantized bytes, or
("error", exception). The rows and bytes go through the pipe without pickling (a single copy each
way). A `place` (readers/file_rows.FileRows) says where the rows lie in a checkpoint file: the
worker reads and widens them itself, into buffers it keeps from one request to the next.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.file_rows import FileRows, RowReader


class QuantizerProcesses:
    """Up to `count` worker processes, started when first needed; quantize() borrows an idle one."""

    def __init__(self, count: int):
        self.count = count
        self._started: list[subprocess.Popen] = []
        self._idle: queue.SimpleQueue[subprocess.Popen] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def quantize(self, data: np.ndarray | FileRows, ggml_type: int, importance: np.ndarray | None) -> np.ndarray:
        """`data`: the rows, or where they lie in a file (the worker reads them)."""
        place, rows = (data, None) if isinstance(data, FileRows) else (None, np.ascontiguousarray(data, dtype=np.float32))
        if importance is not None:
            importance = np.ascontiguousarray(importance, dtype=np.float32)
        process = self._borrow()
        try:
            _send(process.stdin, (int(ggml_type), data.shape, importance, place), rows)
            status, payload = pickle.load(process.stdout)
            if status == "ok":
                out = np.empty(payload, dtype=np.uint8)
                _read_into(process.stdout, out)
        except (OSError, EOFError, pickle.UnpicklingError):
            try:
                code = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = "unknown"
            raise ConversionError(f"a quantizer worker process stopped (exit status {code}); "
                                  "rerun with --threads 1 to quantize in this process") from None
        self._idle.put(process)
        if status == "error":
            raise payload
        return out

    def start(self) -> None:
        """Start every worker now (they import numpy and the quantizers while the caller goes on)."""
        with self._lock:
            while not self._closed and len(self._started) < self.count:
                self._idle.put(self._spawn())

    def _borrow(self) -> subprocess.Popen:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._closed:
                raise ConversionError("the quantizer processes were closed")
            if len(self._started) < self.count:
                return self._spawn()
        return self._idle.get()

    def _spawn(self) -> subprocess.Popen:
        """A new worker process (the lock is held)."""
        process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=_child_environment())
        self._started.append(process)
        return process

    def close(self) -> None:
        """Let every worker finish and exit (it stops at the end of its input)."""
        with self._lock:
            self._closed = True
            started, self._started = self._started, []
        for process in started:
            for pipe in (process.stdin, process.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _child_environment() -> dict[str, str]:
    """This environment, with the folder this ggufsmith is imported from first on the module path
    (so that a source checkout or a test run quantizes with the same code), and one BLAS thread
    per process."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def _send(pipe: BinaryIO, header: object, data: np.ndarray | None) -> None:
    pickle.dump(header, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    if data is not None:
        pipe.write(memoryview(data).cast("B"))
    pipe.flush()


def _read_into(pipe: BinaryIO, out: np.ndarray) -> None:
    view = memoryview(out).cast("B")
    while view.nbytes:
        n = pipe.readinto(view)
        if not n:
            raise EOFError
        view = view[n:]


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The worker's loop: quantize what arrives until the input ends."""
    from ggufsmith.quantize import quantize

    reader = RowReader()  # its buffers are reused: no fresh (page-faulting) 16 MiB per piece
    received = np.empty(0, dtype=np.float32)
    while True:
        try:
            ggml_type, shape, importance, place = pickle.load(requests)
        except EOFError:
            reader.close()
            return
        if place is None:
            size = int(np.prod(shape, dtype=np.int64))
            if received.size < size:
                received = np.empty(size, dtype=np.float32)
            rows = received[:size].reshape(shape)
            _read_into(requests, rows)
        try:
            if place is not None:
                rows = reader.read(place)
            out = quantize(rows, ggml_type, importance)
        except Exception as e:  # noqa: BLE001 - sent to the caller, who raises it
            try:
                pickle.dumps(e)
            except Exception:  # noqa: BLE001
                e = ConversionError(f"{type(e).__name__}: {e}")
            pickle.dump(("error", e), answers, protocol=pickle.HIGHEST_PROTOCOL)
            answers.flush()
            continue
        _send(answers, ("ok", out.size), out)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the caller stops us
    _serve(sys.stdin.buffer, sys.stdout.buffer)
