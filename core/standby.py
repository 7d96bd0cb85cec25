"""Standby replicas: a warm copy of a task's stores kept on another machine.

:func:`follow` brings this state dir's copy of task ``partition`` up to the task's
latest commit, so that when the task moves here (its executor lost) its open replays
only what was committed since the last follow instead of the partition's history. It
is the task's own restore run on the side, with the same store directories, engines
and steps:

1. take the task's lock in this state dir (held by a running attempt here: skip, and
   say so); read the latest checkpoint the way a reader does
   (:func:`~localstate.reader.read_checkpoint_readonly`: no fencing, nothing created);
2. per logged store: open its changelog partition **read-only**, claim the directory
   for that log's identity (:func:`~localstate.rescale_copies.claim_local_copy`: a
   copy of another log is emptied first, exactly as the task's open does), let the
   engine pick its local state at ``L`` (``prepare_restore(C, min_valid)``), apply
   ``[L, C)`` and record that the copy equals ``[0, C)`` (``persist(C)`` and a local
   snapshot at ``C``, so the next open keeps it as it is);
3. note the copy as a standby at the committed version (:mod:`localstate.copies`).

What it never does: write to a changelog or a checkpoint, claim or fence the task's
writer, apply a record at or past the committed offset ``C`` (those belong to an
attempt that has not committed), or touch a store whose engine or serdes differ from
its last commit (the task's open decides about those). Correctness never depends on
it: the copy is tagged with the log it was built from and checked by the task's open
like any other local copy, so a standby that fell behind, was damaged, or was built
from a log that was cut since is replayed from, or rebuilt, never trusted blindly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from .changelogger import NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .copies import STANDBY_ROLE, record_copy
from .engine import StorageEngine, StoreContext, StoreSpec
from .errors import ChangelogError, CorruptionError, LocalStateError, StoreLockedError
from .faults import fault_point
from .layout import store_dir, task_lock
from .locking import io_error
from .metrics import StoreMetrics
from .reader import READ_ATTEMPTS, read_checkpoint_readonly
from .registry import resolve_factory
from .rescale_copies import check_layout, claim_local_copy, log_identity
from .serdes import get_serde
from .store_open import engine_phase, open_system, restore_start, store_meta, task_partition

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogSystem

__all__ = ["follow", "FollowResult", "StoreFollow", "FOLLOWED", "CURRENT", "BUSY", "NOTHING_COMMITTED"]

log = logging.getLogger("localstate")

FOLLOWED = "followed"
"""The copy was brought up to the latest commit (a shipped snapshot fetched, or records applied)."""
CURRENT = "current"
"""The copy already equalled the latest commit; nothing was applied."""
BUSY = "busy"
"""The task's lock in this state dir is held (an attempt runs here): nothing was done."""
NOTHING_COMMITTED = "nothing committed"
"""The task has no commit yet: nothing to follow, nothing was done."""


@dataclass(frozen=True)
class StoreFollow:
    """What :func:`follow` did for one store: the copy was at ``start`` (``L``) and now
    equals the changelog prefix ``[0, committed)``, ``records`` applied; or ``skipped``
    says why it was left as it was."""

    start: int = 0
    committed: int = 0
    records: int = 0
    skipped: str | None = None
    fetched: int | None = None
    """The offset of the snapshot shipped beside the changelog that was fetched, if one was."""


@dataclass(frozen=True)
class FollowResult:
    """The outcome of one :func:`follow`."""

    partition: int
    status: str
    """:data:`FOLLOWED`, :data:`CURRENT`, :data:`BUSY` or :data:`NOTHING_COMMITTED`."""
    version: int | None = None
    """The committed version the copy now holds (None: nothing was followed)."""
    seconds: float = 0.0
    stores: dict[str, StoreFollow] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Change records applied, over all stores."""
        return sum(s.records for s in self.stores.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (what a Spark follow task reports to the driver)."""
        return {"partition": self.partition, "status": self.status, "version": self.version,
                "seconds": self.seconds, "records": self.records,
                "stores": {n: vars(s) for n, s in self.stores.items()}}


def follow(config: Config, partition: int, *, executor: str = "") -> FollowResult:
    """Bring this state dir's copy of task ``partition`` up to its latest commit.

    ``executor`` is noted in the copy record (who keeps the standby). Returns at once
    with :data:`BUSY` when the task's lock here is held, and with
    :data:`NOTHING_COMMITTED` before the task's first commit. Raises the task open's
    own errors for damage it finds (a changelog that lost committed records, a config
    whose ``job.partitions`` the changelog does not hold), having changed no changelog
    or checkpoint; a copy it was building then is left for the task's open to check.
    """
    if not isinstance(config, Config):
        raise TypeError(f"follow needs a localstate.Config, got {type(config).__name__}")
    partition = task_partition(partition)
    if not 0 <= partition < config.partitions:
        raise LocalStateError(f"partition {partition} is out of range: job.partitions = {config.partitions}")
    t0 = time.perf_counter()
    try:
        lock = task_lock(config, partition)
    except StoreLockedError:
        return FollowResult(partition, BUSY)
    systems: dict[str, ChangelogSystem] = {}

    def system(name: str) -> ChangelogSystem:
        if name not in systems:
            systems[name] = open_system(config, name)
            check_layout(config, systems[name])
        return systems[name]

    try:
        checkpoints = system(config.checkpoint_system).checkpoints()
        ckpt = read_checkpoint_readonly(checkpoints, config.job_name, partition)
        if ckpt is None or not ckpt.committed:
            return FollowResult(partition, NOTHING_COMMITTED)
        stores: dict[str, StoreFollow] = {}
        version = ckpt.version
        for spec in config.stores.values():
            if spec.changelog is not None:
                stores[spec.name], followed = _follow_store(config, partition, spec, ckpt, system, checkpoints)
                version = min(version, followed.version)  # a retry may follow a newer commit
        record_copy(config, partition, version, executor, role=STANDBY_ROLE)
        status = FOLLOWED if any(s.records or s.fetched is not None for s in stores.values()) else CURRENT
        return FollowResult(partition, status, version, time.perf_counter() - t0, stores)
    finally:
        try:
            for s in systems.values():
                s.close()
        finally:
            lock.release()


def _skip_reason(spec: StoreSpec, ckpt: Checkpoint) -> str | None:
    if spec.name not in ckpt.offsets:
        return "no committed offset (a store added since the last commit)"
    before = ckpt.stores.get(spec.name)
    if before is not None and dict(before) != store_meta(spec):
        return ("its engine, serdes or changelog differ from its last commit (the task's open decides: "
                "an error, or a rebuild the operator accepted)")
    return None


def _follow_store(config: Config, partition: int, spec: StoreSpec, ckpt: Checkpoint, system: Any,
                  checkpoints: Any) -> tuple[StoreFollow, Checkpoint]:
    """Follow one store to ``ckpt``; on a changelog that changed under the read (the
    writer's compaction replaces closed segments) try again from the newest checkpoint.
    Returns what it did and the checkpoint it followed to."""
    for attempt in range(READ_ATTEMPTS):
        skipped = _skip_reason(spec, ckpt)
        if skipped is not None:
            return StoreFollow(skipped=skipped), ckpt
        try:
            return _apply_committed(config, partition, spec, ckpt.offsets[spec.name], system), ckpt
        except (CorruptionError, ChangelogError) as e:
            newer = read_checkpoint_readonly(checkpoints, config.job_name, partition)
            if attempt == READ_ATTEMPTS - 1 or newer is None or newer == ckpt:
                raise
            log.info("store %r partition %d: the task committed or compacted while its standby followed (%s); "
                     "following again", spec.name, partition, e)
            ckpt = newer
    raise AssertionError("unreachable")


def _keeps_local_copy(engine: StorageEngine) -> bool:
    """An engine that keeps ``StorageEngine.prepare_restore``'s documented default
    always starts empty (in-memory engines): a standby copy of it is worthless."""
    return type(engine).prepare_restore is not StorageEngine.prepare_restore


def _apply_committed(config: Config, partition: int, spec: StoreSpec, committed: int, system: Any) -> StoreFollow:
    assert spec.changelog is not None
    sysname, stream = spec.changelog
    changelog = system(sysname).open_partition(stream, partition, config.partitions, readonly=True)
    try:
        end = changelog.end_offset()
        if committed > end:
            raise changelog.missing_committed(committed)
        directory = store_dir(config, spec.name, partition)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, "create store directory", directory, LocalStateError) from e
        claim_local_copy(directory, log_identity(system(sysname), changelog), spec.name)
        metrics = StoreMetrics()
        context = StoreContext(
            job=config.job_name, store=spec.name, partition=partition, partitions=config.partitions,
            directory=directory, change_logger=NullChangeLogger(spec.name, metrics), metrics=metrics,
            key_serde=get_serde(spec.key_serde, store=spec.name), msg_serde=get_serde(spec.msg_serde, store=spec.name),
            logged=True,
        )
        factory = resolve_factory(spec.factory, store=spec.name)
        with engine_phase(spec, "create"):
            engine = factory.create(spec, context)
        try:
            if not _keeps_local_copy(engine):
                return StoreFollow(committed=committed, skipped=f"engine {spec.factory!r} keeps no local copy")
            # as the task's open: a new standby starts from the snapshot shipped beside the log
            start, fetched = restore_start(spec, engine, changelog, committed)
            applied = [0]

            def records() -> Any:
                for batch, _ in changelog.read_batches(start, committed):
                    applied[0] += len(batch)
                    yield batch
                    fault_point("standby.mid")

            if start < committed:
                with engine_phase(spec, "restore"):
                    engine.restore(chain.from_iterable(records()), into_empty=start == 0)
            # persist(C) makes the copy durable and tagged with C; the snapshot at C lets the
            # next open keep it as it is (an engine may defer its snapshot at persist, and a
            # deferred one is only trusted by an open at that very commit).
            with engine_phase(spec, "persist"):
                engine.persist(committed)
                fault_point("standby.before_snapshot")
                engine.checkpoint(committed)
            return StoreFollow(start, committed, applied[0], fetched=fetched)
        finally:
            with engine_phase(spec, "close"):
                engine.close()
    finally:
        changelog.close()
