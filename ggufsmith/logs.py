"""ggufsmith's warnings held as one-line texts, for whoever prints them later: the CLI once the
command succeeds, a batch report under the source that caused them."""

from __future__ import annotations

import logging


class WarningLines(logging.Handler):
    """Keeps each WARNING-or-worse record as one line of text (its whitespace runs collapsed)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(" ".join(record.getMessage().split()))
