"""Process-exclusive file locks and the standard I/O error translation."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from .errors import ChangelogError, StoreLockedError

__all__ = ["FileLock", "io_error"]


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
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
