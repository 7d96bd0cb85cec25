"""Records of local copies: which committed version a state dir's copy of a task holds,
and which executor left it there.

A Spark executor keeps, under its ``job.state.dir``, the copies of the tasks it ran.
After each commit the runner notes the version beside them::

    <state dir>/<job>/.copies/partition-<p>.json   {"version": V, "executor": E, "role": R, "written_at": T}

``role`` is ``active`` for the copy a task run left, ``standby`` for one kept up to date by
a follower (:mod:`localstate.standby`).

The record is a hint for housekeeping and inspection (``localstate inspect`` shows it;
the Spark runner deletes a copy once its partition's owner elsewhere committed past it),
never for correctness: a task's open checks its local copy against the committed
checkpoint and the changelog whatever the record says.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .config import Config
from .layout import job_dir

__all__ = ["COPIES", "ACTIVE_ROLE", "STANDBY_ROLE", "copy_record_path", "record_copy", "read_copy_record"]

COPIES = ".copies"
"""The directory of copy records under ``<state dir>/<job>``."""
ACTIVE_ROLE = "active"
"""A copy left by a run of the task."""
STANDBY_ROLE = "standby"
"""A copy kept up to date by a standby follower."""


def copy_record_path(config: Config, partition: int) -> Path:
    """``<state dir>/<job>/.copies/partition-<p>.json``."""
    return job_dir(config) / COPIES / f"partition-{partition}.json"


def record_copy(config: Config, partition: int, version: int | None, executor: str, *,
                role: str = ACTIVE_ROLE) -> None:
    """Note that this state dir's copy of ``partition`` holds committed ``version``, left by
    ``executor`` as ``role`` (replaced atomically; not fsynced: a lost record only keeps a
    copy longer)."""
    path = copy_record_path(config, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": version, "executor": executor, "role": role,
                               "written_at": time.time()}),
                   encoding="utf-8")
    tmp.replace(path)


def read_copy_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` (:func:`record_copy`), or None when absent or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
