"""The batch report: one row per output (source, type, file, size, bits per weight, time, status), as a table or JSON."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ggufsmith.batch.runner import OutputResult


@dataclass
class BatchReport:
    plan: str
    results: list[OutputResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[OutputResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def failures(self) -> dict[tuple[str, str], str]:
        """(source, error) -> the output types it failed: one entry per failing source, not per output."""
        grouped: dict[tuple[str, str], list[str]] = {}
        for r in self.failed:
            grouped.setdefault((r.source, r.error or ""), []).append(r.outtype)
        return {key: ", ".join(types) for key, types in grouped.items()}

    def warnings(self) -> dict[str, list[str]]:
        """source -> its conversion's warnings, each once (every output of a source carries them all)."""
        found: dict[str, list[str]] = {}
        for r in self.results:
            if r.warnings:
                found.setdefault(r.source, list(r.warnings))
        return found

    def as_dict(self) -> dict:
        counts = {status: sum(r.status == status for r in self.results) for status in ("done", "skipped", "failed")}
        return {"plan": self.plan, "seconds": round(self.seconds, 3), **counts, "outputs": [r.as_dict() for r in self.results]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    def table(self) -> str:
        rows = [("source", "type", "file", "size", "bpw", "time", "status")]
        for r in self.results:
            rows.append((r.source, r.outtype, os.path.basename(r.file) if r.file else "-",
                         _size(r.size), f"{r.bits_per_weight:.2f}" if r.bits_per_weight is not None else "-",
                         f"{r.seconds:.1f}s" if r.status == "done" else "-", r.status))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        right = {3, 4, 5}
        lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
                 for row in rows]
        lines += [f"{source} ({types}): {error}" for (source, error), types in self.failures().items()]
        d = self.as_dict()
        lines.append(f"{d['done']} written, {d['skipped']} already done, {d['failed']} failed, in {self.seconds:.1f}s")
        return "\n".join(lines)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
