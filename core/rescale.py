"""Rescale a stopped job to another partition count (``localstate rescale --to N``).

Every key's state moves to the task that will receive the key's input rows after the
rescale: the task :func:`localstate.partitioning.task_for` names, which is Spark's
``df.repartition(N, key)`` — how :class:`~localstate.contrib.spark.StatefulJob`
routes rows (proven equal in ``tests/test_partitioning.py``). The steps:

1. **Refuse** what cannot be done right, before anything is written: a target count
   that is not an int >= 1 or equals the current count; a running task (every old
   task's state-dir lock and changelog-partition lock is taken and held throughout);
   old tasks not at one commit (a missing or genesis checkpoint beside committed
   ones, different versions); input positions that do not map (see below); a store
   whose records cannot be split (:func:`layout_for`), whose config changed since its
   commit, or whose keys are not where the routing function says (a key of old task
   ``p`` that the routing sends elsewhere: a task-level store such as a watermark,
   or a wrong ``stores.<s>.rescale.key``).
2. **Read** every store's committed state of every old task: the changelog records
   ``[0, C)`` below the checkpoint's offset ``C``, folded last-write-wins — never the
   uncommitted tail, and without opening (restoring, trimming) the old task.
3. **Write** the new job into a staging area beside the changelog
   (``<path>/_rescale/<job>/new``): one changelog partition per new task and store
   (records sorted by key), ``stream.json`` with the new count, and the new task
   checkpoints; then ``manifest.json`` — the commit point of the rescale.
4. **Swap**: each stream directory and the job's checkpoint directory are renamed
   aside and the new ones renamed into place, then local copies of the old tasks are
   deleted and the staging area removed. The swap is replayed from the manifest by a
   re-run, so a crash at any point leaves either the old job intact (before the
   manifest; the staging area is discarded by the next run) or a swap a re-run
   completes. Until the manifest is written nothing of the old job has changed.

**Input positions.** Each new task's checkpoint gets one ``input_position``. By
default every old task must hold the same position (a shared input read up to one
point, e.g. Spark's own source offsets per micro-batch); it is copied. Otherwise pass
the position the new tasks resume from (``input_position=``, a JSON value or a
function of ``(version, {old partition: position})``); a job run by
``StatefulJob`` passes :func:`localstate.contrib.spark.streaming.rescaled_position`.
Per-task inputs (a Kafka input topic with one partition per task) must be
re-partitioned by the same key to the new count first: see docs/rescale.md.

Supported: one changelog system holding the checkpoints and every logged store:

* ``file``: steps 3–4 as above (``localstate.changelog.file.rescale``);
* ``kafka`` and ``objectstore``, which cannot swap streams in place (a Kafka topic's
  partitions cannot shrink; an object store has no rename): the new job is written as
  the next *generation* — streams ``<stream>.gen<n>``, checkpoints of ``<job>.gen<n>``
  — beside the old one, and one create-only generation record switches the job over
  (:mod:`localstate.rescale_generations`). The config does not change (the system maps
  the names); the old topics stay until the user deletes them.

Where each record goes is :mod:`localstate.rescale_routing`; this module decides what
is refused and runs the steps.
"""

from __future__ import annotations

import json
import logging
import numbers
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint
from .commit import check_input_position
from .config import Config
from .engine import StoreSpec
from .errors import ConfigError, CorruptionError, InvalidValueError, LocalStateError
from .layout import task_lock
from .locking import FileLock, io_error
from .records import apply_records
from .rescale_config import update_config_file
from .rescale_job import RescaleJob, RescalePlan, Stage
from .rescale_routing import RecordLayout, layout_for, merge_records, route_of, route_store
from .store_open import open_system, store_meta

__all__ = [
    "RecordLayout",
    "RescaleResult",
    "SAME_POSITION",
    "check_state_count",
    "layout_for",
    "rescale",
    "route_of",
    "route_old_task",
    "update_config_file",
    "write_task_partition",
]

log = logging.getLogger("localstate.rescale")

SAME_POSITION: Any = type("SamePosition", (), {"__repr__": lambda self: "SAME_POSITION"})()
"""Default of ``input_position``: every old task must hold the same one; it is copied."""

@dataclass
class RescaleResult:
    """What a rescale did."""

    config: Config
    """The job's config with ``job.partitions`` = the new count."""
    from_partitions: int
    to_partitions: int
    version: int
    records: dict[str, int] = field(default_factory=dict)
    """Records written per store (over all new partitions)."""
    seconds: float = 0.0
    already_done: bool = False
    """True when the changelog was already at the new count (a re-run after a crash
    that happened after the swap): nothing was written."""


def _check_target(to: Any) -> int:
    if isinstance(to, bool) or not isinstance(to, numbers.Integral):
        raise InvalidValueError(f"rescale target must be an int >= 1, got {to!r} ({type(to).__name__})")
    to = int(to)  # numpy integers are fine, as for TaskStorage partitions
    if to < 1:
        raise InvalidValueError(f"rescale target must be an int >= 1, got {to}")
    return to


def _job(config: Config, to: Any) -> RescaleJob:
    if not isinstance(config, Config):
        raise TypeError(f"rescale needs a localstate.Config, got {type(config).__name__}")
    to = _check_target(to)
    unlogged = sorted(n for n, s in config.stores.items() if s.changelog is None)
    if unlogged:
        raise ConfigError(
            f"job {config.job_name!r}: store(s) {unlogged} have no changelog (stores.<s>.changelog = none): their "
            "state exists only in local copies, which rescale cannot re-partition. Give them a changelog (and run "
            "once), or delete their local copies and drop them from the config. Nothing was changed."
        )
    stores = dict(config.stores)
    names = {s.changelog[0] for s in stores.values()} | {config.checkpoint_system}  # type: ignore[index]
    if len(names) != 1:
        raise ConfigError(
            f"job {config.job_name!r} keeps state in several changelog systems ({sorted(names)}); rescale "
            "supports one changelog system (file, kafka or objectstore) for every store and the checkpoints"
        )
    (name,) = names
    system = open_system(config, name)
    strategy = system.rescale_strategy()
    if strategy is None:
        system.close()
        raise ConfigError(
            f"job {config.job_name!r}: rescale supports the file, kafka and objectstore changelogs; "
            f"systems.{name} is {type(system).__name__} ({system.describe()}). Nothing was changed."
        )
    return RescaleJob(config, config.partitions, to, system, stores, strategy)


class _Locks:
    """Every old task's state-dir lock and changelog-partition locks, held together."""

    def __init__(self, job: RescaleJob) -> None:
        self._held: list[FileLock] = []
        config = job.config
        try:
            if "{executor}" not in str(config.state_dir):
                for p in range(job.old):
                    self._held.append(task_lock(config, p))
            # the system's own locks (file: each changelog partition's); kafka and the
            # object store instead fence each old task's instances when its checkpoint is
            # read (a new transactional producer; a claim in its checkpoint sequence)
            self._held.extend(job.strategy.locks(job))
        except OSError as e:
            self.release()
            raise io_error(e, "take the task locks under", config.state_dir, LocalStateError) from e
        except LocalStateError as e:
            self.release()
            raise type(e)(f"cannot rescale job {config.job_name!r} while it runs: {e}") from e

    def release(self) -> None:
        for lock in self._held:
            lock.release()
        self._held.clear()


def _read_checkpoints(job: RescaleJob) -> dict[int, Checkpoint]:
    """Every old task's checkpoint, all committed at one version (else a refusal)."""
    store = job.system.checkpoints()
    ckpts = {p: store.read(job.config.job_name, p) for p in range(job.old)}
    committed = {p: c for p, c in ckpts.items() if c is not None and c.committed}
    if not committed:
        raise LocalStateError(
            f"job {job.config.job_name!r} has no committed state in {job.system.describe()}: there is nothing to "
            f"rescale; set job.partitions = {job.new} (and use new changelog streams if old ones exist)"
        )
    versions = {p: (c.version if c is not None and c.committed else None) for p, c in ckpts.items()}
    if len(set(versions.values())) > 1:
        raise LocalStateError(
            f"job {job.config.job_name!r}: the old tasks are not at one commit (committed versions per "
            f"partition: {versions}); finish the run that left them apart (re-run its input so every task "
            "commits the same version), then rescale. Nothing was changed."
        )
    return committed


def _check_stores(job: RescaleJob, ckpts: Mapping[int, Checkpoint]) -> None:
    for p, ckpt in ckpts.items():
        dropped = set(ckpt.offsets) - set(job.config.stores)
        if dropped:
            raise ConfigError(
                f"task {job.config.job_name}/partition {p} holds committed state of store(s) {sorted(dropped)} "
                "that the config no longer has: rescale would leave it behind under the old partitioning. "
                "Put the store(s) back into the config (or reset them) first. Nothing was changed."
            )
        for name, spec in job.stores.items():
            before = ckpt.stores.get(name)
            if before is not None and dict(before) != store_meta(spec):
                raise ConfigError(
                    f"store {name!r} of task {job.config.job_name}/partition {p} was committed with {dict(before)} "
                    f"but the config now says {store_meta(spec)}: open the job once with the committed settings "
                    "(or accept the change with `localstate restore --accept-config-change`) first. Nothing was changed."
                )


def _positions(job: RescaleJob, ckpts: Mapping[int, Checkpoint], input_position: Any, version: int) -> Any:
    old = {p: c.input_position for p, c in ckpts.items()}
    if input_position is SAME_POSITION:
        distinct = {json.dumps(v, sort_keys=True) for v in old.values()}
        if len(distinct) > 1:
            shown = "; ".join(f"{p}: {json.dumps(v, sort_keys=True)[:120]}" for p, v in sorted(old.items()))
            raise LocalStateError(
                f"job {job.config.job_name!r}: the old tasks' input positions differ ({shown}), so no single "
                "position is right for every new task. Re-partition the input to the new count and pass the "
                "position the new tasks resume from (input_position= / --input-position JSON); for a job run by "
                "StatefulJob pass localstate.contrib.spark.streaming.rescaled_position (--spark-runner). "
                "See docs/rescale.md. Nothing was changed."
            )
        return next(iter(old.values()))
    value = input_position(version, old) if callable(input_position) else input_position
    check_input_position(value)
    return value


def _committed_records(job: RescaleJob, spec: StoreSpec, p: int, ckpt: Checkpoint) -> dict[bytes, bytes]:
    """The store's state in old task ``p``: records ``[0, C)`` below the checkpoint's
    offset, folded (tombstones remove). Opened read-only: the locks are already held."""
    stream = spec.changelog[1]  # type: ignore[index]
    part = job.system.open_partition(stream, p, job.old, readonly=True)
    try:
        end = part.end_offset()
        committed = ckpt.offsets.get(spec.name)
        if committed is None:
            if end:
                raise CorruptionError(
                    f"store {spec.name!r} of task {job.config.job_name}/partition {p}: {part.describe()} holds "
                    "records but no checkpoint names the store; open the job once (`localstate restore`) to decide "
                    "what they are, then rescale. Nothing was changed."
                )
            return {}
        if committed > end:
            raise part.missing_committed(committed)
        state: dict[bytes, bytes] = {}
        for records, _ in part.read_batches(0, committed):
            apply_records(records, state)
        return state
    finally:
        part.close()



def check_state_count(config: Config) -> None:
    """Raise :class:`ChangelogError` unless the job's changelogs hold its state at
    ``job.partitions`` (reads only): a rescale re-run with the new count finds it done."""
    from .rescale_copies import check_layout

    names = {s.changelog[0] for s in config.stores.values() if s.changelog is not None} | {config.checkpoint_system}
    for name in sorted(names):
        system = open_system(config, name)
        try:
            check_layout(config, system)
        finally:
            system.close()


# -- the entry point ------------------------------------------------------------------------------------
def rescale(
    config: Config,
    to: int,
    *,
    input_position: Any = SAME_POSITION,
    spark: Any = None,
) -> RescaleResult:
    """Re-partition the committed state of the stopped job ``config`` (at
    ``job.partitions``) into ``to`` tasks; see the module docstring.

    ``input_position``: the position every new task's checkpoint records (default:
    the old tasks' common position; a JSON value; or ``fn(version, {p: position})``).
    ``spark``: a SparkSession to read and route the old tasks' state on executors
    (large state); the file changelog must then be on a file system they share.
    Returns a :class:`RescaleResult` whose ``config`` has ``job.partitions = to``.
    Raises :class:`LocalStateError` (naming the store, key or file) when it refuses;
    a refusal changes nothing on disk.
    """
    t0 = time.perf_counter()
    job = _job(config, to)
    try:
        locks = _Locks(job)
        try:
            return _run(job, input_position, spark, t0)
        finally:
            locks.release()
    finally:
        job.system.close()


def _run(job: RescaleJob, input_position: Any, spark: Any, t0: float) -> RescaleResult:
    result = job.strategy.run(job, _Plan(job, input_position, spark, t0))
    if not result.already_done:
        log.info("job %r rescaled from %d to %d partitions at version %d: %s", job.config.job_name,
                 result.from_partitions, job.new, result.version, result.records)
    return result


class _Plan(RescalePlan):
    """The shared steps, for the system's strategy."""

    def __init__(self, job: RescaleJob, input_position: Any, spark: Any, t0: float) -> None:
        self.job, self._input_position, self._spark, self._t0 = job, input_position, spark, t0

    def prepare(self) -> tuple[dict[int, Checkpoint], int, Any]:
        return _prepare(self.job, self._input_position)

    def stage(self, ckpts: Mapping[int, Checkpoint]) -> Stage:
        job = self.job
        if self._spark is not None:
            from localstate.contrib.spark.rescale import stage_with_spark

            spark = self._spark
            return lambda target: stage_with_spark(spark, job, ckpts, target)

        def stage(target: Any) -> tuple[dict[str, list[int]], dict[str, int]]:
            ends: dict[str, list[int]] = {}
            records: dict[str, int] = {}
            for name, spec in job.stores.items():
                parts = _new_parts(job, spec, ckpts)
                ends[name] = [job.strategy.write_partition(job, target, name, q, part) for q, part in enumerate(parts)]
                records[name] = sum(len(part) for part in parts)
            return ends, records
        return stage

    def done(self, version: int, records: Mapping[str, int], from_partitions: int | None = None) -> RescaleResult:
        job = self.job
        return RescaleResult(job.config.with_overrides({"job.partitions": job.new}),
                             job.old if from_partitions is None else from_partitions, job.new, version,
                             dict(records), time.perf_counter() - self._t0)

    def already_done(self, ckpt: Checkpoint | None) -> RescaleResult:
        return _already_done(self.job, ckpt, self._t0)


def _already_done(job: RescaleJob, ckpt: Checkpoint | None, t0: float) -> RescaleResult:
    """The result of a re-run that finds the state already at the new count."""
    log.warning("job %r: its state is already at %d partitions (an earlier rescale finished)",
                job.config.job_name, job.new)
    return RescaleResult(job.config.with_overrides({"job.partitions": job.new}), job.old, job.new,
                         ckpt.version if ckpt else -1, {}, time.perf_counter() - t0, already_done=True)


def _prepare(job: RescaleJob, input_position: Any) -> tuple[dict[int, Checkpoint], int, Any]:
    """The refusals every changelog shares, before anything is written: the old tasks'
    checkpoints (at one commit), the stores, and the new tasks' input position."""
    ckpts = _read_checkpoints(job)
    _check_stores(job, ckpts)
    for spec in job.stores.values():  # refuse an unsplittable store before reading anything
        if layout_for(spec).kind == "key":
            route_of(spec)
    version = next(iter(ckpts.values())).version
    return ckpts, version, _positions(job, ckpts, input_position, version)


def _new_parts(job: RescaleJob, spec: StoreSpec, ckpts: Mapping[int, Checkpoint]) -> list[dict[bytes, bytes]]:
    """Store ``spec``'s committed state, re-partitioned: one dict per new task."""
    states = {p: _committed_records(job, spec, p, c) for p, c in ckpts.items()}
    return route_store(spec, job.old, job.new, states)


def route_old_task(config: Config, to: int, name: str, p: int, ckpt: Checkpoint) -> list[dict[bytes, bytes]]:
    """Old task ``p``'s committed records of store ``name``, per new task (run on a
    Spark executor by ``rescale(spark=...)``; the locks are held by the driver)."""
    job = _job(config, to)
    try:
        spec = job.stores[name]
        return route_store(spec, job.old, job.new, {p: _committed_records(job, spec, p, ckpt)})
    finally:
        job.system.close()


def write_task_partition(config: Config, to: int, name: str, q: int,
                         pieces: Iterable[Mapping[bytes, bytes]], generation: Any = None) -> tuple[int, int]:
    """Merge the pieces old tasks sent new task ``q`` of store ``name`` and write them
    into the staging area (file changelog) or into ``generation`` (kafka, objectstore);
    returns ``(end offset, records)`` (run on a Spark executor)."""
    job = _job(config, to)
    try:
        records = merge_records(job.stores[name], pieces)
        return job.strategy.write_partition(job, generation, name, q, records), len(records)
    finally:
        job.system.close()


