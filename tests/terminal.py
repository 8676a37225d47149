"""Running a command with its stderr on a pseudo-terminal, to see what a user at a terminal sees
(ggufsmith shows its progress bars only there)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
from pathlib import Path


def run_on_terminal(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """(exit status, everything written to stderr) of `argv`, stderr a 120-column terminal."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    output = b""
    while True:  # read as it comes: a full terminal buffer would block the child
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return proc.wait(timeout=timeout), output.decode("utf-8", "replace")
