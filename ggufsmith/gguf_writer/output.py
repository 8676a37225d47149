"""Where an output file goes: the checks on the target, and the file the bytes are written to.

Every file ggufsmith writes goes through here (GGUFWriter uses it):

- `check_target` refuses, with one line naming the file, a target that is one of the command's
  inputs (under any name: a symbolic or hard link too), a directory, a socket, a target in a
  folder that does not exist or cannot be written to, and an existing device node or FIFO unless
  `force` is given. With `force` the bytes go straight into the device or pipe: nothing can be
  renamed over it without replacing it (as root, /dev/null by a regular file), and writing into it
  is what a pipe or device is for. A symbolic link is followed: the file it points to is replaced,
  the link stays.
- `open_output` gives the file to write: for a regular target a `TempFile` beside it, named
  `.NAME.ggufsmith-XXXXXXXX.tmp`, held under an exclusive flock for as long as its writer lives,
  renamed onto the target (still locked) only when complete and deleted on any error. Before
  creating it, the temporary files of dead writers in that folder are deleted.
- `remove_dead_temp_files` is that cleaning: a temporary file nobody holds a lock on belongs to a
  writer that died without cleaning up (SIGKILL, out of memory, power loss). The kernel releases a
  flock when its holder dies, so a live writer's file is never taken for a dead one's, whatever
  process ids are reused, and the check is made on the file itself, not on a guess from its name.
- `delete_own_temp_files` is for a process about to exit on a signal (the CLI's SIGTERM handler):
  it deletes this process's temporary files at once, without unwinding the stack.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ggufsmith.errors import OutputError

TEMP_MARK = ".ggufsmith-"
TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\..+\.ggufsmith-[0-9a-f]{8}\.tmp$", re.DOTALL)
_MAX_NAME_IN_TEMP = 200  # keeps the temporary name under the usual 255-byte limit
# The temporary files this process is writing, for delete_own_temp_files.
_OWN_TEMP_FILES: set[Path] = set()


@dataclass(frozen=True)
class Target:
    """A checked output: `path` with symbolic links resolved; `stream` for a device or FIFO that is
    written into as it is (allowed by force)."""

    given: Path
    path: Path
    stream: bool = False


def check_target(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), *, force: bool = False) -> Target:
    """The target `path` checked as described in the module docstring; raises OutputError."""
    given = Path(path)
    real = Path(os.path.realpath(given))
    for source in inputs:
        if _same_file(real, source):
            same = "" if Path(source) == given else f" (the same file as {source})"
            raise OutputError(f"{given} is an input of this command{same}; ggufsmith never overwrites its input: "
                              "choose another output file")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise OutputError(f"{given}: cannot write here ({e.strerror})") from None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISDIR(mode):
            raise OutputError(f"{given} is a directory; give the path of the file to write")
        if stat.S_ISSOCK(mode) or not force:
            kind = _KINDS.get(stat.S_IFMT(mode), "special file")
            also = "" if stat.S_ISSOCK(mode) else "; with --force ggufsmith writes into it (it never replaces it)"
            raise OutputError(f"{given} exists and is a {kind}, not a regular file{also}")
        return Target(given, real, stream=True)
    folder = real.parent
    if not folder.is_dir():
        raise OutputError(f"{given}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{given}: cannot create files in {folder} (no write permission, or a read-only file system)")
    return Target(given, real)


_KINDS = {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device", stat.S_IFIFO: "FIFO (named pipe)",
          stat.S_IFSOCK: "socket"}


def _same_file(path: Path, other: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:  # either one missing: not the same file
        return False


def folder_files(folder: str | os.PathLike) -> list[Path]:
    """The files directly in `folder` (none if it is not a readable folder): a model folder's inputs."""
    try:
        return [Path(entry.path) for entry in os.scandir(folder) if entry.is_file()]
    except OSError:
        return []


# -- the file written --------------------------------------------------------------------------

class OutputFile:
    """A file being written; every OSError becomes an OutputError naming the target."""

    def __init__(self, target: Target, file) -> None:
        self.target = target
        self.file = file
        self.written = 0

    def write(self, data) -> None:
        with self._errors("writing"):
            self.written += self.file.write(data)

    def commit(self, fsync: bool) -> None:
        """Everything is written: make it the target."""
        with self._errors("finishing"):
            self.file.close()

    def discard(self) -> None:
        """Give up (after an error or interruption). Safe to call more than once."""
        if not self.file.closed:
            try:
                self.file.close()
            except OSError:  # the bytes not yet flushed are lost either way
                pass

    # What a failed write leaves at the target, for the error message.
    left_behind = "what was written so far stays in it"

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise OutputError(write_error_message(self, e, doing)) from e


def write_error_message(output: OutputFile, e: OSError, doing: str) -> str:
    """One line for a failed write, naming the target: full disk, file size limit, quota, ..."""
    size = f"after {output.written / 2**20:.1f} MiB"
    if e.errno == errno.ENOSPC:
        what = f"no space left on the device {size}"
    elif e.errno == errno.EFBIG:
        what = f"file too large {size} (a limit of the file system, or of `ulimit -f`)"
    elif e.errno == errno.EDQUOT:
        what = f"disk quota exceeded {size}"
    else:
        what = f"{e.strerror or e} while {doing} ({size})"
    return f"{output.target.given}: {what}; {output.left_behind}"


class StreamFile(OutputFile):
    """A device or FIFO written into directly (force): no temporary file, no rename."""

    def __init__(self, target: Target) -> None:
        try:
            file = open(target.path, "wb")  # a FIFO blocks here until a reader opens it
        except OSError as e:
            raise OutputError(f"{target.given}: cannot open it for writing ({e.strerror})") from None
        super().__init__(target, file)


class TempFile(OutputFile):
    """`.NAME.ggufsmith-XXXXXXXX.tmp` beside the target, locked while this process writes it."""

    left_behind = "the target was left as it was"

    def __init__(self, target: Target) -> None:
        remove_dead_temp_files(target.path.parent)
        self.path, fd = _create_locked(target)
        try:
            # A second descriptor keeps the lock while the data's descriptor is closed (close
            # reports the last write errors on some file systems) and the file is renamed.
            self._lock_fd = os.dup(fd)
            super().__init__(target, os.fdopen(fd, "wb"))
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            _OWN_TEMP_FILES.discard(self.path)
            raise

    def commit(self, fsync: bool) -> None:
        with self._errors("finishing"):
            self.file.flush()
            if fsync:
                os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.path, self.target.path)
        self._unlock()

    def discard(self) -> None:
        if self._lock_fd < 0:  # committed or discarded already
            return
        super().discard()
        try:
            self.path.unlink(missing_ok=True)  # while still locked: no other run takes it for dead
        finally:
            self._unlock()

    def _unlock(self) -> None:
        _OWN_TEMP_FILES.discard(self.path)
        os.close(self._lock_fd)
        self._lock_fd = -1


def delete_own_temp_files() -> None:
    """Delete the temporary files this process is writing: it is about to exit without unwinding
    (a signal handler). A file already renamed onto its target is gone from its temporary name:
    the target is then complete."""
    for path in list(_OWN_TEMP_FILES):
        try:
            path.unlink()
        except OSError:
            pass


def open_output(target: Target) -> OutputFile:
    return StreamFile(target) if target.stream else TempFile(target)


def temp_name(target: Path) -> str:
    return f".{target.name[:_MAX_NAME_IN_TEMP]}{TEMP_MARK}{secrets.token_hex(4)}{TEMP_SUFFIX}"


def _create_locked(target: Target) -> tuple[Path, int]:
    """Create and lock a new temporary file. A run cleaning the folder may delete it between the
    creation and the lock (it looks dead then): the name is then checked to still be this file,
    and another one is made if not."""
    for _ in range(100):
        path = target.path.parent / temp_name(target.path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError(f"{target.given}: cannot create a file in {path.parent} ({e.strerror})") from None
        _OWN_TEMP_FILES.add(path)
        try:
            if _lock(fd, blocking=True) is False or _names(path, fd):
                return path, fd
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            _OWN_TEMP_FILES.discard(path)
            raise
        os.close(fd)
        _OWN_TEMP_FILES.discard(path)
    raise OutputError(f"{target.given}: could not create a temporary file in {target.path.parent}")


def _lock(fd: int, blocking: bool) -> bool | None:
    """Take the exclusive lock: True; held by another process: None (only when not blocking);
    the file system has no locks: False."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF):
            return False
        raise


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named, opened = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def is_temp_name(name: str) -> bool:
    return bool(_TEMP_NAME.match(name))


def remove_dead_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the ggufsmith temporary files in `folder` that no live process holds; returns them.

    A file is deleted only while this process holds its lock and it is still the file the name
    gives; one that cannot be opened or locked (another user's, a file system without locks, a
    live writer's) is left alone."""
    removed = []
    try:
        names = [name for name in os.listdir(folder) if is_temp_name(name)]
    except OSError:
        return removed
    for name in names:
        path = Path(folder) / name
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):  # never open a device or FIFO named so
                continue
        except OSError:
            continue
        fd = _open_existing(path)
        if fd is None:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode) and _lock(fd, blocking=False) and _names(path, fd):
                path.unlink()
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _open_existing(path: Path) -> int | None:
    # Read-write first: on NFS an exclusive lock needs a descriptor open for writing.
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
    return None
