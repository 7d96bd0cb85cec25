"""Local-file primitives: process-exclusive locks, durable directory steps
(:func:`fsync_dir`, :func:`remove_tree`, :func:`atomic_write`) and the standard I/O error translation."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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

__all__ = ["FileLock", "collecting_locks", "PARKED_WAIT_S", "io_error", "fsync_dir", "remove_tree", "atomic_write", "retry_while_locked"]


def io_error(e: OSError, what: str, path: Path, error: type[Exception] = ChangelogError) -> Exception:
    """Translate an OSError into ``error`` with the path and the fix."""
    fix = {
        errno.EACCES: "make it writable by this user",
        errno.EROFS: "the file system is read-only; point the path elsewhere",
        errno.ENOSPC: "the disk is full; free space, then commit again (nothing committed is lost)",
    }.get(e.errno or 0, "check the path and permissions")
    return error(f"cannot {what} {path}: {e.strerror or e}; {fix}")


PARKED_WAIT_S = 5.0
"""How long :class:`FileLock` waits for a *parked* holder (a process keeping an idle task
open between runs, :mod:`localstate.kept_open`) to let go after asking it to."""
_PARKED_POLL_S = 0.002
_ACTIVE, _PARKED = "active", "parked"
_collecting: ContextVar[list[FileLock] | None] = ContextVar("localstate_collecting_locks", default=None)


@contextmanager
def collecting_locks() -> Iterator[list[FileLock]]:
    """Every :class:`FileLock` this thread takes inside the block, in a list (a task's
    storage collects the locks its open takes, to park them together)."""
    locks: list[FileLock] = []
    token = _collecting.set(locks)
    try:
        yield locks
    finally:
        _collecting.reset(token)


class FileLock:
    """An exclusive, non-blocking ``flock`` on ``path`` that records the holder's pid.

    The file holds ``"<pid> active"`` or, while the holder keeps it only for an idle task
    it would give up on request, ``"<pid> parked"`` (:meth:`park`). Taking a lock a
    parked holder has asks it to let go (the file ``<path>.release``) and waits up to
    ``parked_wait_s`` for it; a lock held actively is refused at once, as before.
    """

    def __init__(self, path: Path, what: str, parked_wait_s: float = PARKED_WAIT_S) -> None:
        self.path = path
        self.parked = False
        try:
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise io_error(e, "create lock file", path) from e
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").split()
            if not (len(holder) == 2 and holder[1] == _PARKED and self._wait_for_parked(parked_wait_s)):
                os.close(self._fd)
                self._fd = None
                raise StoreLockedError(
                    f"{what} is locked by pid {holder[0] if holder else 'unknown'} ({path}); only one writer may "
                    "open it. Stop the other process (or close its TaskStorage) first."
                ) from None
        self._mark(_ACTIVE, only_if_changed=True)
        collected = _collecting.get()
        if collected is not None:
            collected.append(self)

    @property
    def release_path(self) -> Path:
        """Where a process waiting for this lock asks a parked holder to let go."""
        return self.path.with_name(self.path.name + ".release")

    def _wait_for_parked(self, wait_s: float) -> bool:
        """Ask the parked holder to let go and wait for the lock; True once taken."""
        assert self._fd is not None
        request = self.release_path
        try:
            request.touch()
        except OSError:
            return False
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                time.sleep(_PARKED_POLL_S)
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    continue
            return False
        finally:
            request.unlink(missing_ok=True)

    def _mark(self, state: str, only_if_changed: bool = False) -> None:
        # One fixed-length record, rewritten in place: a reused worker process takes the
        # same locks at every task, and a truncate waits for the file system's journal
        # (milliseconds while other processes fsync), so the file is truncated only when
        # its length changes.
        assert self._fd is not None
        record = f"{os.getpid()} {state}\n".encode()
        if only_if_changed and os.pread(self._fd, len(record) + 1, 0) == record:
            return
        os.pwrite(self._fd, record, 0)
        if os.fstat(self._fd).st_size != len(record):
            os.ftruncate(self._fd, len(record))

    def park(self) -> None:
        """Mark the lock as held for an idle task that its holder gives up on request."""
        if self._fd is not None and not self.parked:
            self._mark(_PARKED)
            self.parked = True

    def unpark(self) -> None:
        """Mark the lock as actively held again (a waiter that asked meanwhile is refused)."""
        if self._fd is not None and self.parked:
            self._mark(_ACTIVE)
            self.parked = False

    def release_requested(self) -> bool:
        """Whether a process waits for this lock (asked the parked holder to let go)."""
        return self.release_path.exists()

    def intact(self) -> bool:
        """Whether the lock is held on the file at :attr:`path` (not on one since deleted
        or replaced, which another process could lock beside it)."""
        if self._fd is None:
            return False
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except OSError:
            return False

    def release(self) -> None:
        if self._fd is not None:
            # a waiter's request is answered now; one left by a waiter that gave up or died
            # would otherwise make the next parked holder close at once
            try:
                self.release_path.unlink(missing_ok=True)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            self.parked = False


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

    The temp name is unique per process and thread, so tasks writing the same shared
    file (``stream.json``) at once, in several processes (Spark Python workers) or in
    threads of one, do not rename each other's."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if before_rename:
        fault_point(before_rename)
    os.replace(tmp, path)
    fsync_dir(path.parent)
