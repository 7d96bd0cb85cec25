"""Local-file primitives: process-exclusive locks, durable directory steps
(:func:`fsync_dir`, :func:`remove_tree`, :func:`atomic_write`) and the standard I/O error translation."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .errors import ChangelogError, StoreLockedError
from .faults import fault_point

T = TypeVar("T")


def retry_while_locked(take: Callable[[], T], wait_s: float, every_s: float) -> T:
    """``take()``, tried again every ``every_s`` seconds for up to ``wait_s`` while it raises
    :class:`StoreLockedError` (another process holds a lock it needs: a dying attempt's
    worker may for a moment); then that error, naming the holder."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return take()
        except StoreLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(every_s)

__all__ = ["FileLock", "io_error", "fsync_dir", "remove_tree", "atomic_write", "retry_while_locked"]


def io_error(e: OSError, what: str, path: Path, error: type[Exception] = ChangelogError) -> Exception:
    """Translate an OSError into ``error`` with the path and the fix."""
    fix = {
        errno.EACCES: "make it writable by this user",
        errno.EROFS: "the file system is read-only; point the path elsewhere",
        errno.ENOSPC: "the disk is full; free space, then commit again (nothing committed is lost)",
    }.get(e.errno or 0, "check the path and permissions")
    return error(f"cannot {what} {path}: {e.strerror or e}; {fix}")


class FileLock:
    """An exclusive, non-blocking ``flock`` on ``path`` that records the holder's pid."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise io_error(e, "create lock file", path) from e
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise StoreLockedError(
                f"{what} is locked by pid {holder} ({path}); only one writer may open it. "
                "Stop the other process (or close its TaskStorage) first."
            ) from None
        # Written only when it changes: a reused worker process takes the same locks
        # at every task, and a truncate waits for the file system's journal (milliseconds
        # while other processes fsync, per lock, on every task open).
        holder = f"{os.getpid()}\n".encode()
        if os.pread(self._fd, len(holder) + 1, 0) != holder:
            os.pwrite(self._fd, holder, 0)
            os.ftruncate(self._fd, len(holder))

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete ``path`` (file or directory) if it exists.

    A directory is first renamed aside (``<name>.deleting-<pid>``) and then deleted, so a
    crash midway never leaves a half-deleted database under its real name (a RocksDB
    ``db/`` whose ``CURRENT`` names a MANIFEST already gone would not open). Leftovers
    of such a crash are deleted on the next call for the same path.
    """
    for stale in path.parent.glob(f"{path.name}.deleting-*") if path.parent.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    if path.is_dir() and not path.is_symlink():
        aside = path.with_name(f"{path.name}.deleting-{os.getpid()}")
        os.replace(path, aside)
        shutil.rmtree(aside)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write(path: Path, data: bytes, *, before_rename: str | None = None) -> None:
    """Write ``data`` to ``path`` atomically: temp file + fsync + rename + dir fsync.

    The temp name is unique per process, so tasks in several processes (Spark Python
    workers) writing the same shared file (``stream.json``) do not rename each other's."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if before_rename:
        fault_point(before_rename)
    os.replace(tmp, path)
    fsync_dir(path.parent)
