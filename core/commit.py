"""Committing one task's stores (docs/design/protocol.md, "Commit"), in this order:

1. flush caches into engines; ``engine.prepare_commit()``;
2. flush change loggers → changelog appends → durable changelog ``flush()`` → end offsets
   (inside ``checkpoints.committing()``: a Kafka flush waits for acknowledgements and step 4
   commits the records and the checkpoint in one transaction);
3. ``engine.persist(offset)``: make local state durable (rocksdb: a local snapshot tagged
   with the offset once enough was written since the last one);
4. write the task checkpoint ``{version, input_position, offsets}`` atomically.

Nothing counts as committed before step 4. :class:`TaskCommitter` does it for
:class:`~localstate.TaskStorage`, over the task's open stores
(:class:`~localstate.store_open.TaskState`), with the changelog compaction that depends
on the kept checkpoints.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .errors import CorruptionError, InvalidValueError, LocalStateError
from .faults import fault_point
from .store_open import TaskState, _OpenStore, engine_phase

if TYPE_CHECKING:
    from localstate.changelog.base import CheckpointStore

    from .metrics import TaskMetrics

__all__ = ["check_input_position", "TaskCommitter"]

log = logging.getLogger("localstate")


def check_input_position(value: Any, path: str = "input_position") -> None:
    """Raise :class:`InvalidValueError` unless ``value`` survives the checkpoint's JSON
    exactly: None, bool, int, finite float, str, lists and str-keyed dicts of those."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if math.isfinite(value):
            return
        raise InvalidValueError(f"{path} = {value!r}: NaN and infinities cannot be stored in a checkpoint")
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_input_position(v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidValueError(
                    f"{path} has the key {k!r} ({type(k).__name__}): checkpoint keys are strings "
                    f"(JSON would bring it back as {str(k)!r}); use str keys, e.g. {{str(partition): offset}}"
                )
            check_input_position(v, f"{path}[{k!r}]")
        return
    hint = " (a tuple would come back as a list: use a list)" if isinstance(value, tuple) else ""
    raise InvalidValueError(
        f"{path} = {value!r} ({type(value).__name__}) cannot be stored exactly in a checkpoint{hint}; "
        "use None, bool, int, float, str, lists and dicts with str keys"
    )


class TaskCommitter:
    """Commits the open stores of ``state`` into ``checkpoints`` (counted in
    ``task_metrics``), starting from the task's last committed checkpoint ``checkpoint``.

    A failed commit is remembered (``failed``) and refuses every later one."""

    def __init__(self, state: TaskState, checkpoints: CheckpointStore, task_metrics: TaskMetrics,
                 checkpoint: Checkpoint | None) -> None:
        self._state = state
        self._checkpoints = checkpoints
        self._task_metrics = task_metrics
        self.checkpoint = checkpoint
        """The last committed checkpoint, or None before the first commit."""
        self.failed: BaseException | None = None

    def write_checkpoint(self, version: int, input_position: Any) -> Checkpoint:
        """Write the task checkpoint of the state as it stands (step 4, or a registration at open)."""
        state = self._state
        ckpt = Checkpoint(
            version=version,
            input_position=input_position,
            offsets=dict(state.offsets),
            epoch=state.epoch,
            stores={k: dict(v) for k, v in state.meta.items()},
            event_time=state.event_time,
        )
        self._checkpoints.write(state.job, state.partition, ckpt)
        if ckpt.committed:
            self.checkpoint = ckpt
        return ckpt

    # -- commit -----------------------------------------------------------------------------------
    def commit(self, input_position: Any = None, *, version: int | None = None) -> Checkpoint:
        """Run the four steps for :meth:`localstate.TaskStorage.commit`; after a failure, refuse."""
        if self.failed is not None:
            raise LocalStateError(
                f"a previous commit of {self._state.job}/partition {self._state.partition} failed ({self.failed}); "
                "close this TaskStorage and open it again to restore the last commit"
            ) from self.failed
        version = self._next_version(version)
        check_input_position(input_position)
        try:
            return self._commit(input_position, version)
        except BaseException as e:
            self.failed = e
            raise

    def _next_version(self, version: Any) -> int:
        prev = self.checkpoint
        if version is None:
            return prev.version + 1 if prev is not None else 1
        if not isinstance(version, numbers.Integral) or isinstance(version, bool):
            raise InvalidValueError(f"commit version must be an int, got {version!r} ({type(version).__name__})")
        version = int(version)
        if version < 0:
            raise InvalidValueError(f"commit version must be >= 0, got {version}")
        if prev is not None and version <= prev.version:
            raise InvalidValueError(
                f"commit version {version} of {self._state.job}/partition {self._state.partition} does not follow the "
                f"committed version {prev.version}: versions only go up (a re-run of a version is rolled "
                "back first, see localstate.contrib.spark.streaming.prepare_version)"
            )
        return version

    def _commit(self, input_position: Any, version: int) -> Checkpoint:
        clock = time.perf_counter
        started = clock()
        state = self._state
        entries = list(state.stores.values())
        flush_seconds = {}
        for e in entries:
            t0 = clock()
            if e.view is not e.engine:
                e.view.flush()
            with engine_phase(e.spec, "prepare_commit"):
                e.engine.prepare_commit()
            flush_seconds[e.spec.name] = clock() - t0
        fault_point("commit.before_changelog_flush")
        offsets: dict[str, int] = {}
        # One span from the flushes to the checkpoint: a checkpoint store that can commit
        # the changelog records with the checkpoint (Kafka: one transaction) does so.
        with self._checkpoints.committing(state.job, state.partition):
            for e in entries:
                if e.changelog is not None:
                    t0 = clock()
                    offsets[e.spec.name] = e.logger.flush()
                    flush_seconds[e.spec.name] += clock() - t0
            fault_point("commit.after_changelog_flush")
            for e in entries:
                t0 = clock()
                with engine_phase(e.spec, "persist"):
                    e.engine.persist(offsets.get(e.spec.name))
                e.metrics.persist_latency.observe(clock() - t0)
                e.metrics.flush_latency.observe(flush_seconds[e.spec.name])
                e.metrics.commits += 1
            fault_point("commit.after_engine_checkpoint")
            # Stores not opened this time (dropped from the config for a deploy) keep their
            # offsets: the state's offsets carry them forward.
            state.offsets.update(offsets)
            checkpoint = self.write_checkpoint(version, input_position)
        self._task_metrics.commits += 1
        self._task_metrics.commit_latency.observe(clock() - started)
        self._upload_snapshots(entries, offsets)
        return checkpoint

    def _upload_snapshots(self, entries: list[_OpenStore], offsets: dict[str, int]) -> None:
        """After the commit point: each changelog ships the engine's snapshot at the
        committed offset when it keeps snapshots beside the log. Only an optimization of
        later restores, so a failure is logged and the commit stands."""
        for e in entries:
            if e.changelog is None or e.spec.name not in offsets:
                continue
            try:
                e.changelog.upload_snapshot(e.engine, offsets[e.spec.name])
            except (LocalStateError, OSError) as err:
                log.warning("store %r partition %d: snapshot upload failed (%s); restores replay more of "
                            "the changelog until the next one", e.spec.name, self._state.partition, err)

    def compact(self) -> dict[str, dict[str, int]]:
        """Compact every store's changelog below the oldest offset any kept checkpoint
        names (the latest and the one before it), so going back to the previous
        checkpoint still rebuilds exactly the state it committed."""
        state = self._state
        out = {}
        try:
            previous = self._checkpoints.previous(state.job, state.partition)
        except CorruptionError:
            previous = None
        for name, e in state.stores.items():
            if e.changelog is None or name not in state.offsets:
                continue
            up_to = state.offsets[name]
            # a snapshot deferred at the last commit is taken now: older ones may fall
            # below the compaction horizon and could no longer be used
            e.engine.ensure_snapshot(up_to)
            if previous is not None and name in previous.offsets:
                up_to = min(up_to, previous.offsets[name])
            out[name] = e.changelog.compact(up_to)
        return out
