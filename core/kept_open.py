"""Task storages a long-lived process keeps open between runs of their task.

A Spark Python worker runs one task's micro-batch after another; opening a task's
storage (a RocksDB open with its fsyncs, the clean-close claims) and closing it (the
memtable flush) every micro-batch is a fixed cost per task that the state itself does not
need. :class:`KeptStorages` keeps a committed storage open after its run instead
(*parked*: its locks stay held but are given up to whoever asks,
:class:`~localstate.locking.FileLock`), and hands it to the next run of the same task in
this process, after checking it is still the task's current state
(:meth:`TaskStorage.unpark <localstate.storage.TaskStorage.unpark>`). Nothing about
commits changes: a run still commits its version before it parks, and a parked storage
holds nothing uncommitted, so a process killed while it parks loses nothing (the next
open restores as after any crash past a commit). Only where every changelog system of
the task can keep it open (:attr:`~localstate.changelog.base.ChangelogSystem.keeps_open`):
the file log, whose locks stay held, and Kafka, where a kept task renews its producer —
fencing any instance that opened the task meanwhile — before it re-reads its checkpoint.

A parked storage is closed (cleanly, leaving its claims) when another process asks for
one of its locks — another Python worker of the executor given the task, a CLI restore,
a placement sweep — when it has been idle for ``keep_s`` seconds, or on
:meth:`KeptStorages.close_all` / :meth:`KeptStorages.release`. One daemon thread per
process watches the parked storages while there are any.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .config import Config
from .storage import TaskStorage

__all__ = ["KeptStorages", "KEEP_OPEN_S", "kept_storages"]

log = logging.getLogger("localstate")

KEEP_OPEN_S = 30.0
"""How long a parked storage stays open without a run (below the 60 s after which Spark
stops an idle Python worker, so a worker's storages close cleanly before it goes)."""
_WATCH_EVERY_S = 0.003
_LOST_EVERY_TICKS = 100

Key = tuple[str, str, int]


def _key(config: Config, partition: int) -> Key:
    return (str(config.state_dir), config.job_name, partition)


@dataclass
class _Parked:
    storage: TaskStorage
    since: float
    keep_s: float


class KeptStorages:
    """The parked storages of this process, by (state dir, job, partition)."""

    def __init__(self, watch_every_s: float = _WATCH_EVERY_S) -> None:
        self._parked: dict[Key, _Parked] = {}
        self._mutex = threading.Lock()
        self._watch_every_s = watch_every_s
        self._watcher: threading.Thread | None = None
        self.reused = 0
        """Runs that were handed a parked storage (for tests and metrics)."""
        self.reopened = 0
        """Parked storages found stale at :meth:`take` (closed; the task was opened again)."""

    def __len__(self) -> int:
        return len(self._parked)

    def storages(self) -> list[TaskStorage]:
        """The parked storages (to inspect; :meth:`take` to use one)."""
        with self._mutex:
            return [e.storage for e in self._parked.values()]

    def take(self, config: Config, partition: int, usable: Callable[[TaskStorage], bool] | None = None
             ) -> TaskStorage | None:
        """The parked storage of task ``partition`` of ``config``'s job, taken back for a
        run, or None (none parked, or it was no longer current or ``usable`` refused it:
        then it is closed here, and the caller opens the task as usual)."""
        with self._mutex:
            entry = self._parked.pop(_key(config, partition), None)
        if entry is None:
            return None
        storage = entry.storage
        try:
            current = (storage.config.to_dict() == config.to_dict() and storage.unpark()
                       and (usable is None or usable(storage)))
        except BaseException:
            _close(storage)  # never left open with its locks active and no one to close it
            raise
        if current:
            self.reused += 1
            return storage
        self.reopened += 1
        _close(storage)
        return None

    def park(self, storage: TaskStorage, keep_s: float = KEEP_OPEN_S) -> bool:
        """Keep ``storage`` (its task just committed) open for the task's next run here;
        False when it cannot park (written since its commit, see
        :meth:`TaskStorage.park <localstate.storage.TaskStorage.park>`): the caller closes it."""
        if keep_s <= 0 or not storage.park():
            return False
        key = _key(storage.config, storage.partition)
        with self._mutex:
            former = self._parked.pop(key, None)
            self._parked[key] = _Parked(storage, time.monotonic(), keep_s)
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="localstate-kept-open", daemon=True)
                self._watcher.start()
        if former is not None and former.storage is not storage:
            _close(former.storage)
        return True

    def release(self, which: Callable[[Key], bool] | None = None, *, wait: bool = True) -> int:
        """Close the parked storages whose key ``(state dir, job, partition)`` ``which``
        accepts (all without it); returns how many. ``wait=False`` (from a signal handler,
        which may have interrupted this process's own use of the registry) closes nothing
        rather than wait for the registry."""
        if not self._mutex.acquire(blocking=wait):
            return 0
        try:
            keys = [k for k in self._parked if which is None or which(k)]
            entries = [self._parked.pop(k) for k in keys]
        finally:
            self._mutex.release()
        for entry in entries:
            _close(entry.storage)
        return len(entries)

    def close_all(self, wait: bool = True) -> int:
        """Close every parked storage; returns how many (``wait``: see :meth:`release`)."""
        return self.release(wait=wait)

    def _watch(self) -> None:
        """Close a parked storage as soon as another process asks for one of its locks,
        or once it was idle ``keep_s``; end when none is parked."""
        tick = 0
        while True:
            time.sleep(self._watch_every_s)
            tick += 1
            now = time.monotonic()
            lost: list[_Parked] = []
            with self._mutex:
                if not self._parked:
                    self._watcher = None
                    return
                due = [k for k, e in self._parked.items()
                       if now - e.since >= e.keep_s or e.storage.release_requested()]
                if tick % _LOST_EVERY_TICKS == 0:  # its files deleted (the state dir removed)
                    gone = [k for k, e in self._parked.items() if k not in due and not e.storage.holds_its_locks()]
                    lost = [self._parked.pop(k) for k in gone]
                entries = [self._parked.pop(k) for k in due]
            for entry in entries:
                _close(entry.storage)
            for entry in lost:
                _close(entry.storage, lost=True)


def _close(storage: TaskStorage, lost: bool = False) -> None:
    """Close a parked storage; a failure is logged (committed already, a failed close
    costs the next open only its slow path). ``lost``: its files were deleted meanwhile,
    so the close is expected to fail (logged at debug level)."""
    try:
        storage.close()
    except Exception as e:
        log.log(logging.DEBUG if lost else logging.WARNING, "closing the kept-open task %s/partition %d failed%s: %s",
                storage.job, storage.partition, " (its files were deleted)" if lost else "", e)


_PROCESS = KeptStorages()


def kept_storages() -> KeptStorages:
    """This process's :class:`KeptStorages`."""
    return _PROCESS
