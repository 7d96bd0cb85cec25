"""Where a task's local files live, and the task lock: the one home of both.

Under ``job.state.dir`` every job has one directory::

    <state dir>/<job>/<store>/<partition>/        a store's local copy (engine files)
    <state dir>/<job>/.locks/partition-<p>.lock   the task's single-writer lock
    <state dir>/<job>/.locks/partition-<p>.home   where the task's checkpoints live

Whoever opens, rolls back, wipes or rescales task ``p`` takes :func:`task_lock` first,
so no two of them (two attempts of a Spark task, a CLI restore beside a running job)
touch the task at once.
"""

from __future__ import annotations

from pathlib import Path

from .config import Config
from .errors import LocalStateError
from .locking import FileLock, io_error, retry_while_locked

__all__ = [
    "job_dir",
    "store_dir",
    "lock_path",
    "home_path",
    "task_lock",
    "LOCK_RETRY_S",
    "LOCKS",
]

LOCKS = ".locks"
LOCK_RETRY_S = 0.2
"""How often :func:`task_lock` tries again while another process holds the lock."""


def job_dir(config: Config) -> Path:
    """``<state dir>/<job>``: every local file of the job's tasks."""
    return config.state_dir / config.job_name


def store_dir(config: Config, store: str, partition: int) -> Path:
    """``<state dir>/<job>/<store>/<partition>``: one store's local copy for one task."""
    return job_dir(config) / store / str(partition)


def lock_path(config: Config, partition: int) -> Path:
    """The lock file of task ``partition``."""
    return job_dir(config) / LOCKS / f"partition-{partition}.lock"


def home_path(config: Config, partition: int) -> Path:
    """The file that remembers where task ``partition``'s checkpoints live."""
    return job_dir(config) / LOCKS / f"partition-{partition}.home"


def task_lock(config: Config, partition: int, wait_s: float = 0.0) -> FileLock:
    """Take task ``partition``'s exclusive lock, retrying for up to ``wait_s`` seconds
    while another process holds it (a dying attempt's worker may still hold it for a
    moment); then :class:`StoreLockedError` naming the holder's pid. Release it with
    ``release()``."""
    path = lock_path(config, partition)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise io_error(e, "create state directory", path.parent, LocalStateError) from e
    what = f"task {config.job_name}/partition {partition} (state dir {config.state_dir})"
    return retry_while_locked(lambda: FileLock(path, what), wait_s, LOCK_RETRY_S)
