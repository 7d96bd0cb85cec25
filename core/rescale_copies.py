"""Which log a task's local copies were built from, and whether a tool's config is at the
layout the changelog holds.

**Local copies.** A store's local directory (``job.state.dir/<job>/<store>/<p>``) holds
copies of its changelog prefix: a live database, snapshots, a clean-close claim, an
engine's own offset file. Each is tagged with an *offset*, and an offset alone cannot
name a log: after a rescale the new task ``p`` writes a new log whose offsets grow
past those of the old task ``p``, and after a cut tail a log writes the same offsets
again. A copy of the old task left on a disk the rescale could not reach would then be
kept (its claim names the committed offset) or loaded with the new log replayed on top.

So the whole directory carries the identity of the log it was built from
(:data:`TAG_FILE`): the job's generation (:class:`~localstate.changelog.base.Generation`,
bumped by every rescale on Kafka and objectstore) and the partition's own
:meth:`~localstate.changelog.base.ChangelogPartition.log_id` (file: a random token made
with the partition, replaced when a tail is cut or the store reset). Opening a store
checks the tag before its engine opens; a directory with another tag — or none, as the
releases before the tag wrote — is emptied and the store rebuilt from the changelog. One
check for every engine (rocksdb, leveldb, search, topn, sketches, plug-ins), since every
copy an engine keeps lives in that directory.

**Layout of a tool's config.** :func:`check_layout` refuses, before a read-only tool
(``verify``, ``dump``, ``get``, ``inspect``, :class:`~localstate.StateReader`) reads
anything, a config whose ``job.partitions`` is not the count the changelog holds
(rescaled since, or never), as opening a task does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Config
from .errors import ChangelogError, LocalStateError
from .locking import atomic_write, io_error, remove_tree

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition, ChangelogSystem

__all__ = ["TAG_FILE", "log_identity", "claim_local_copy", "tag_local_copy", "check_layout"]

log = logging.getLogger("localstate")

TAG_FILE = "changelog.id"
"""In a logged store's local directory: the identity of the log its copies were built from."""


def log_identity(system: ChangelogSystem, changelog: ChangelogPartition) -> str:
    """``<generation>:<log id>`` of the log ``changelog`` is, in ``system``."""
    return f"{system.generation().number}:{changelog.log_id()}"


def claim_local_copy(directory: Path, identity: str, store: str) -> None:
    """Make ``directory`` a copy of the log ``identity``: kept when its tag says so;
    otherwise (another log, or an untagged copy) emptied, then tagged. Runs before the
    engine opens, under the task's lock; a crash between the two steps leaves an empty
    directory with the old tag, which the next open empties again."""
    tag = directory / TAG_FILE
    try:
        have: str | None = tag.read_text(encoding="ascii")
    except FileNotFoundError:
        have = None
    except (OSError, UnicodeDecodeError):
        have = "?"
    if have == identity:
        return
    try:
        stale = [p for p in directory.iterdir() if p.name != TAG_FILE]
        if stale:
            log.warning("store %r: the local copy at %s was built from %s, not from the changelog the task "
                        "now has (%s): it is discarded and rebuilt from the changelog", store, directory,
                        f"log {have}" if have else "an untagged log", identity)
            for p in stale:
                if p.is_dir():
                    remove_tree(p)
                else:
                    p.unlink(missing_ok=True)
    except OSError as e:
        raise io_error(e, "discard the stale local copy in", directory, LocalStateError) from e
    tag_local_copy(directory, identity, store)


def tag_local_copy(directory: Path, identity: str, store: str) -> None:
    """Tag ``directory`` as a copy of the log ``identity`` (its contents are a prefix of it)."""
    try:
        atomic_write(directory / TAG_FILE, identity.encode("ascii"))
    except OSError as e:
        raise io_error(e, f"tag the local copy of store {store!r} in", directory, LocalStateError) from e


def check_layout(config: Config, system: ChangelogSystem) -> None:
    """Refuse ``config`` for a read-only tool when ``system`` holds the job's state at
    another partition count (rescaled since: a generation, or a swapped stream), as
    opening a task does: the tool would otherwise read the wrong keys for every task.
    Reads, never writes."""
    n = config.partitions
    generation = system.generation()
    if generation.number and generation.partitions != n:
        raise ChangelogError(
            f"job {config.job_name!r}: its state was rescaled to {generation.partitions} partitions "
            f"(generation {generation.number} in {system.describe()}) but the config has job.partitions = "
            f"{n}: set job.partitions = {generation.partitions}. Nothing was read."
        )
    for spec in config.stores.values():
        if spec.changelog is None or spec.changelog[0] != system.name:
            continue
        have = system.stream_partitions(spec.changelog[1])
        if have is not None and have != n:
            raise ChangelogError(
                f"changelog stream {spec.changelog[1]!r} ({system.describe()}) has {have} partitions but the "
                f"job has job.partitions = {n} (rescaled since?): set job.partitions = {have}. Nothing was read."
            )
