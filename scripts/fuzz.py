"""Mutation fuzzer for every reader of untrusted files in ggufsmith, for long runs.

    python scripts/fuzz.py --cases 100000                       # every reader
    python scripts/fuzz.py --targets gguf,imatrix-dat --cases 2000 --seed 7

Each target builds its own valid seed files (scripts/fuzz_cases.py: nothing from this machine),
mutates them (bit flips, interesting integers, cuts, deleted/duplicated/spliced chunks; for
JSON-based formats also values swapped for values of other types, huge numbers, deep nesting) and
feeds each case to the target's public reader, in a worker process so that a hang is caught by a
per-case timeout, a crash does not stop the run, and the memory of each case is measured (peak RSS
above the worker's RSS before the case: Linux's /proc/self/clear_refs resets the peak). The
worker's address space is limited (--memory-limit), so a runaway allocation shows as a MemoryError.

Outcomes: ok; ours (a GgufsmithError subclass: the one-line errors the CLI shows); foreign (any
other exception: each distinct one, by type and innermost ggufsmith frame, is printed and saved
with a reproducer under --findings); hang (per-case --timeout); crash (the worker died). The table
at the end has one row per target, with the largest peak memory of a case against its input size.

Targets call the readers' public entry points: GGUFReader (and `inspect`'s text and JSON output),
read_imatrix (GGUF and legacy .dat), SafetensorsFile (and each tensor's load), and
export_tokenizer for a folder holding a SentencePiece tokenizer.model or a tokenizer.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggufsmith.errors import GgufsmithError  # noqa: E402
from scripts.fuzz_cases import TARGETS, mutate  # noqa: E402


# -- the worker: runs cases, measures memory ---------------------------------------------------------
def _status(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field_name))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _innermost_own_frame(tb) -> str:
    frames = [f for f in traceback.extract_tb(tb) if "ggufsmith" in f.filename]
    frame = (frames or traceback.extract_tb(tb))[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def worker_main(conn, target_name: str, folder: str, memory_limit: int) -> None:
    target = TARGETS[target_name]
    folder = Path(folder)
    for name, text in target.companions.items():
        (folder / name).write_text(text)
    path = folder / target.file_name
    vm_size = _status("VmSize:")
    resource.setrlimit(resource.RLIMIT_AS, (vm_size + memory_limit, resource.RLIM_INFINITY))
    sys.setrecursionlimit(10_000)
    can_reset = _reset_peak_rss()
    sink = open(os.devnull, "w")
    while True:
        data = conn.recv()
        if data is None:
            return
        path.write_bytes(data)
        _reset_peak_rss()
        before = _status("VmRSS:")
        outcome, detail = "ok", ""
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                target.read(path)
        except GgufsmithError as e:
            outcome, detail = "ours", str(e)
        except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 - what the fuzzer looks for
            outcome = "foreign"
            detail = (f"{type(e).__name__} at {_innermost_own_frame(e.__traceback__)}",
                      "".join(traceback.format_exception(e))[-4000:])
        peak = _status("VmHWM:") - before if can_reset else 0
        conn.send((outcome, detail, max(0, peak)))


class Worker:
    """A worker process for one target; restarted after a hang or a crash."""

    def __init__(self, target_name: str, folder: Path, memory_limit: int) -> None:
        self.args = (target_name, str(folder), memory_limit)
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, *self.args), daemon=True)
        self.process.start()
        child.close()

    def run(self, data: bytes, timeout: float):
        self.conn.send(data)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self.restart()
            return "crash", "", 0
        self.restart()
        return "hang", "", 0

    def restart(self) -> None:
        self.process.kill()
        self.process.join()
        self._start()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


# -- the driver -------------------------------------------------------------------------------------
@dataclass
class Tally:
    cases: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "ours": 0, "foreign": 0, "hang": 0, "crash": 0})
    distinct_foreign: dict[str, str] = field(default_factory=dict)  # what -> reproducer
    peak: int = 0  # the largest extra RSS of a case
    peak_size: int = 0  # that case's input size
    worst_ratio: float = 0.0  # the largest extra RSS / input size, over cases of at least 64 KiB
    worst_ratio_size: int = 0
    seconds: float = 0.0


def save_finding(findings: Path, target: str, what: str, data: bytes, report: str) -> Path:
    folder = findings / target
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{what.replace(' ', '-').replace(':', '_')}-{hashlib.sha1(data).hexdigest()[:10]}"
    (folder / f"{stem}.txt").write_text(report)
    path = folder / f"{stem}.bin"
    path.write_bytes(data)
    return path


def fuzz(target_name: str, cases: int, rng: random.Random, timeout: float, memory_limit: int, findings: Path) -> Tally:
    target = TARGETS[target_name]
    seeds = target.seeds()
    tally = Tally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target_name}-") as folder:
        worker = Worker(target_name, Path(folder), memory_limit)
        for seed in seeds:  # the seeds themselves must read cleanly, or the run tells little
            outcome, detail, _ = worker.run(seed, timeout)
            if outcome != "ok":
                print(f"{target_name}: a seed does not read cleanly ({outcome}): {detail or ''}", file=sys.stderr)
        for i in range(cases):
            data = mutate(rng, target, seeds)
            outcome, detail, peak = worker.run(data, timeout)
            tally.cases += 1
            tally.counts[outcome] += 1
            if peak > tally.peak:
                tally.peak, tally.peak_size = peak, len(data)
            if len(data) >= 65536 and peak / len(data) > tally.worst_ratio:
                tally.worst_ratio, tally.worst_ratio_size = peak / len(data), len(data)
            what = detail[0] if outcome == "foreign" else outcome
            if outcome not in ("ok", "ours") and what not in tally.distinct_foreign:
                report = {"foreign": detail[1] if detail else "", "hang": f"no answer within {timeout} s",
                          "crash": "the worker process died"}[outcome]
                saved = save_finding(findings, target_name, what, data, report)
                tally.distinct_foreign[what] = str(saved)
                print(f"{target_name}: case {i}: {what} -> {saved}\n{report}", file=sys.stderr)
            if (i + 1) % 10_000 == 0:
                print(f"{target_name}: {i + 1} cases, {time.perf_counter() - started:.0f} s: {tally.counts}", file=sys.stderr)
        worker.close()
    tally.seconds = time.perf_counter() - started
    return tally


def print_table(results: dict[str, Tally]) -> None:
    header = f"{'target':<16} {'cases':>8} {'ok':>8} {'ours':>8} {'foreign':>8} {'distinct':>8} {'hangs':>6} {'crashes':>7} " \
             f"{'peak MB':>8} {'at input':>9} {'peak/size':>9} {'at input':>9} {'cases/s':>8}"
    print(header)
    print("-" * len(header))
    for name, t in results.items():
        c = t.counts
        print(f"{name:<16} {t.cases:>8} {c['ok']:>8} {c['ours']:>8} {c['foreign']:>8} {len(t.distinct_foreign):>8} "
              f"{c['hang']:>6} {c['crash']:>7} {t.peak / 2**20:>8.1f} {t.peak_size:>9} {t.worst_ratio:>9.2f} {t.worst_ratio_size:>9} "
              f"{t.cases / max(t.seconds, 1e-9):>8.0f}")
    print("peak MB: the largest peak RSS of one case above the worker's RSS before it; at input: that case's "
          "size in bytes; peak/size: the largest ratio over cases of at least 64 KiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of: {', '.join(TARGETS)}")
    parser.add_argument("--cases", type=int, default=1000, help="cases per target (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (a run is reproducible from it)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a case counts as a hang")
    parser.add_argument("--memory-limit", type=int, default=1024, help="MiB of address space a case may add")
    parser.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="folder for reproducers")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    results = {}
    for name in names:
        results[name] = fuzz(name, args.cases, random.Random(f"{args.seed}:{name}"), args.timeout,
                             args.memory_limit * 2**20, args.findings)
        print(f"{name}: done in {results[name].seconds:.0f} s", file=sys.stderr)
    print_table(results)
    return 1 if any(t.counts["foreign"] or t.counts["hang"] or t.counts["crash"] for t in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
