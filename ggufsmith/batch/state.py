"""The record of finished outputs, one JSON file beside them: what makes a rerun skip a file.

`.ggufsmith-batch.json` in each output folder maps a file name to its size, sha256, source, outtype
and the fingerprint of the settings it was made with (a split output: the unsplit name, and
`parts`, each part's file, size and sha256). An output is done when its record matches the
file on disk (same size) and the settings it would be made with now. Workers (local processes or
Ray tasks on other machines sharing the folder) update the file under an exclusive lock and replace
it atomically, so a kill at any moment leaves either the old or the new record, never half of one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_FILE = ".ggufsmith-batch.json"
LOCK_FILE = ".ggufsmith-batch.lock"


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class BatchState:
    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / STATE_FILE

    def records(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {}  # an unreadable record only means the outputs are made again
        return data.get("outputs", {}) if isinstance(data, dict) else {}

    def is_done(self, file_name: str, fingerprint: str) -> bool:
        """Whether `file_name` was finished with these settings and is still the file recorded."""
        record = self.records().get(file_name)
        if not record or record.get("fingerprint") != fingerprint:
            return False
        files = record.get("parts") or [{"file": file_name, "size": record.get("size")}]  # a split output's parts
        try:
            return all((self.output_dir / part["file"]).stat().st_size == part["size"] for part in files)
        except (OSError, KeyError, TypeError):
            return False

    def record(self, file_name: str, entry: dict[str, Any]) -> None:
        with self._locked():
            for stale in self.output_dir.glob(f"{STATE_FILE}.*.tmp"):  # a killed writer's (only lock holders write them)
                stale.unlink(missing_ok=True)
            records = self.records()
            records[file_name] = entry
            self._replace({"outputs": records})

    def forget(self, file_name: str) -> None:
        with self._locked():
            records = self.records()
            if records.pop(file_name, None) is not None:
                self._replace({"outputs": records})

    @contextmanager
    def _locked(self):
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _replace(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.output_dir, prefix=f"{STATE_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
