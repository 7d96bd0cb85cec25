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

Supported: the file changelog (checkpoints and every logged store in one
``systems.<name>`` of type ``file``). Steps 3–4 (the files) live in
:mod:`localstate.rescale_files`; this module decides what is refused and what goes where.
"""

from __future__ import annotations

import json
import logging
import numbers
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .checkpoint import Checkpoint
from .commit import check_input_position
from .config import Config
from .engine import StoreSpec
from .errors import ChangelogError, ConfigError, CorruptionError, InvalidValueError, LocalStateError
from .layout import task_lock
from .locking import FileLock, io_error
from .partitioning import spark_hash, spark_hashes
from .registry import resolve_factory
from .rescale_files import (
    JobFiles,
    manifest_still_valid,
    pending,
    stream_count,
    streams,
    swap,
    write_new_partition,
    write_staging,
)
from .serdes import get_serde
from .store_open import _store_meta, open_system

__all__ = [
    "RecordLayout",
    "RescaleResult",
    "SAME_POSITION",
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

_META_KEY = b"\x00"


@dataclass(frozen=True)
class RecordLayout:
    """How a store's change records relate to its keys, for rescaling.

    ``kind = "key"``: a record key is the store's encoded key followed by
    ``key_suffix`` bytes (a register or word index); records go to the task of their
    key. ``kind = "task"``: the records describe the whole task (one filter per task);
    they can only be merged — old task ``p`` goes to new task ``p % N``, which is where
    its keys go exactly when ``N`` divides the old count — and ``merge`` combines the
    values two old tasks hold for one record key. ``shared_keys`` are records every
    task holds alike (an engine's meta record); each new task gets them.
    """

    kind: Literal["key", "task"] = "key"
    key_suffix: int = 0
    shared_keys: frozenset[bytes] = frozenset()
    merge: Callable[[bytes, bytes], bytes] | None = None


def _or_words(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") | int.from_bytes(b, "big")).to_bytes(len(a), "big")


_KEYED = RecordLayout()
_NOT_SPLITTABLE = {
    "topn": "a topn store keeps one heap of the best N members per task; members an old task evicted are "
            "gone, so neither splitting nor merging the heaps gives the heap a task of the new job would "
            "hold. Rebuild it from its source, or start it over with `localstate restore --reset STORE` "
            "after the rescale (drop it from the config for the rescale)",
}


def layout_for(spec: StoreSpec) -> RecordLayout:
    """The :class:`RecordLayout` of ``spec``'s engine; raises :class:`ConfigError`
    naming the store when its state cannot be re-partitioned.

    Built in: ``memory``, ``rocksdb``, ``leveldb``, ``search`` (record key = key),
    ``hyperloglog`` and keyed ``bloom`` (key + register/word index; meta record
    shared), a single ``bloom`` filter per task (merged by OR on scale-down to a
    divisor of the count); ``topn`` is refused. A plug-in declares its layout as the
    factory attribute ``rescale_layout``.
    """
    name = spec.factory
    if name in ("memory", "rocksdb", "leveldb", "search"):
        return _KEYED
    if name == "hyperloglog":
        return RecordLayout(key_suffix=2, shared_keys=frozenset({_META_KEY}))
    if name == "bloom":
        if getattr(spec.options, "keyed", False):
            return RecordLayout(key_suffix=4, shared_keys=frozenset({_META_KEY}))
        return RecordLayout(kind="task", shared_keys=frozenset({_META_KEY}), merge=_or_words)
    if name in _NOT_SPLITTABLE:
        raise ConfigError(f"store {spec.name!r} ({name}) cannot be rescaled: {_NOT_SPLITTABLE[name]}")
    layout = getattr(resolve_factory(name, store=spec.name), "rescale_layout", None)
    if isinstance(layout, RecordLayout):
        return layout
    raise ConfigError(
        f"store {spec.name!r}: engine {name!r} does not say how its change records split by key "
        "(a factory attribute rescale_layout = localstate.rescale.RecordLayout(...)), so it cannot be rescaled"
    )


_ROUTE = re.compile(r"^key(?:\[(\d+)\])?(\s+as\s+int32)?$")


def route_of(spec: StoreSpec) -> Callable[[bytes], Any]:
    """``stores.<s>.rescale.key``: how to get the routing value (the input key column's
    value) from a store key's bytes. ``key`` (default): the decoded key itself;
    ``key[i]``: element ``i`` of a tuple key (``tuple`` serde); ``... as int32``: the
    input key column is int32, not int64 (Spark hashes them differently)."""
    text = str(spec.raw.get("rescale.key", "key")).strip()
    m = _ROUTE.match(text)
    if not m:
        raise ConfigError(
            f"stores.{spec.name}.rescale.key = {text!r}: expected 'key', 'key[i]' (element i of a tuple key), "
            "optionally followed by ' as int32'"
        )
    decode = get_serde(spec.key_serde, store=spec.name).decode
    index = None if m.group(1) is None else int(m.group(1))
    int32 = m.group(2) is not None
    if index is not None and spec.key_serde != "tuple":
        raise ConfigError(f"stores.{spec.name}.rescale.key = {text!r} needs key.serde = tuple, not {spec.key_serde!r}")

    def route(key: bytes) -> Any:
        value = decode(key)
        if index is not None:
            if not isinstance(value, tuple) or index >= len(value):
                raise InvalidValueError(f"store {spec.name!r}: key {value!r} has no element {index}")
            value = value[index]
        return value

    route.as_int32 = int32  # type: ignore[attr-defined]
    return route


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


def _job(config: Config, to: Any) -> JobFiles:
    if not isinstance(config, Config):
        raise TypeError(f"rescale needs a localstate.Config, got {type(config).__name__}")
    to = _check_target(to)
    from localstate.changelog.file import FileChangelogSystem

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
            "supports one file changelog system for every store and the checkpoints"
        )
    (name,) = names
    system = open_system(config, name)
    if not isinstance(system, FileChangelogSystem):
        system.close()
        raise ConfigError(
            f"job {config.job_name!r}: rescale supports the file changelog; systems.{name} is "
            f"{type(system).__name__} ({system.describe()}). Nothing was changed."
        )
    return JobFiles(config, config.partitions, to, system, system.root, stores)


class _Locks:
    """Every old task's state-dir lock and changelog-partition locks, held together."""

    def __init__(self, job: JobFiles) -> None:
        self._held: list[FileLock] = []
        config = job.config
        try:
            if "{executor}" not in str(config.state_dir):
                for p in range(job.old):
                    self._held.append(task_lock(config, p))
            for stream in streams(job):
                for p in range(job.old):
                    d = job.root / stream / str(p)
                    if d.is_dir():
                        self._held.append(FileLock(d / ".lock", f"changelog partition {d}"))
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


def _read_checkpoints(job: JobFiles) -> dict[int, Checkpoint]:
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


def _check_stores(job: JobFiles, ckpts: Mapping[int, Checkpoint]) -> None:
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
            if before is not None and dict(before) != _store_meta(spec):
                raise ConfigError(
                    f"store {name!r} of task {job.config.job_name}/partition {p} was committed with {dict(before)} "
                    f"but the config now says {_store_meta(spec)}: open the job once with the committed settings "
                    "(or accept the change with `localstate restore --accept-config-change`) first. Nothing was changed."
                )


def _positions(job: JobFiles, ckpts: Mapping[int, Checkpoint], input_position: Any, version: int) -> Any:
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


def _committed_records(job: JobFiles, spec: StoreSpec, p: int, ckpt: Checkpoint) -> dict[bytes, bytes]:
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
            for k, v in records:
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
        return state
    finally:
        part.close()


def _route_store(
    job: JobFiles, spec: StoreSpec, states: Mapping[int, dict[bytes, bytes]]
) -> list[dict[bytes, bytes]]:
    """The new tasks' records of one store from the old tasks' states."""
    layout = layout_for(spec)
    out: list[dict[bytes, bytes]] = [{} for _ in range(job.new)]
    shared: dict[bytes, bytes] = {}
    for p, state in states.items():
        for key in layout.shared_keys & state.keys():
            value = state.pop(key)
            if shared.setdefault(key, value) != value:
                raise CorruptionError(
                    f"store {spec.name!r}: old tasks hold different {key!r} records ({shared[key]!r} vs {value!r} in "
                    f"partition {p}); they were written with different engine settings. Nothing was changed."
                )
    if layout.kind == "task":
        if job.old % job.new:
            raise ConfigError(
                f"store {spec.name!r} ({spec.factory}) holds one structure per task: it can only be merged, old "
                f"task p into new task p % N, which keeps each key with its rows only when N divides the old count "
                f"({job.old}); {job.new} does not. Rescale to a divisor of {job.old}. Nothing was changed."
            )
        merge = layout.merge
        for p, state in states.items():
            target = out[p % job.new]
            for k, v in state.items():
                before = target.get(k)
                target[k] = v if before is None or merge is None else merge(before, v)
    else:
        route = route_of(spec)
        int32 = getattr(route, "as_int32", False)
        suffix = layout.key_suffix
        checkable = job.old > 1 or "rescale.key" in spec.raw
        if not checkable:
            raise ConfigError(
                f"store {spec.name!r}: with one old task nothing shows that its keys are the input's keys (a "
                f"task-level store, e.g. a watermark, would be split wrongly). Say how they are: set "
                f"stores.{spec.name}.rescale.key = key (or key[i] for an element of a tuple key). Nothing was changed."
            )
        for p, state in states.items():
            keys = list(state)
            values = [_route_value(spec, route, p, k, suffix) for k in keys]
            try:
                hashes = spark_hashes(values, as_int32=int32)
            except LocalStateError:  # name the key: hash one at a time to find it
                hashes = [_hash_value(spec, p, k, value, int32) for k, value in zip(keys, values)]
            # task_for(value, n) is spark_hash(value) % n: one hash serves both counts.
            for k, value, h in zip(keys, values, hashes):
                if h % job.old != p:
                    raise ConfigError(
                        f"store {spec.name!r}: key {value!r} is held by old task {p} but its input rows go to task "
                        f"{h % job.old}: the store is not partitioned by the input key (a task-level store such as "
                        f"a watermark, or keys with the input key inside: set stores.{spec.name}.rescale.key = "
                        "key[i]). Its state cannot be moved with the rows. Nothing was changed."
                    )
                out[h % job.new][k] = state[k]
    if shared:
        for target in out:
            target.update(shared)
    return out


def _route_value(spec: StoreSpec, route: Callable[[bytes], Any], p: int, key: bytes, suffix: int) -> Any:
    """The routing value of record key ``key`` of old task ``p``, or an error naming it."""
    if suffix and len(key) < suffix:
        raise CorruptionError(
            f"store {spec.name!r} partition {p}: change record key {key!r} is shorter than the "
            f"{spec.factory} layout allows. Nothing was changed."
        )
    try:
        return route(key[:-suffix] if suffix else key)
    except LocalStateError as e:
        raise type(e)(f"store {spec.name!r} partition {p}: key {key!r}: {e}. Nothing was changed.") from e
    except Exception as e:
        raise InvalidValueError(
            f"store {spec.name!r} partition {p}: key {key!r} does not decode with key.serde = "
            f"{spec.key_serde!r} ({e}). Nothing was changed."
        ) from e


def _hash_value(spec: StoreSpec, p: int, key: bytes, value: Any, int32: bool) -> int:
    try:
        return spark_hash(value, as_int32=int32)
    except LocalStateError as e:
        raise type(e)(f"store {spec.name!r} partition {p}: key {key!r}: {e}. Nothing was changed.") from e


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


def _run(job: JobFiles, input_position: Any, spark: Any, t0: float) -> RescaleResult:
    config = job.config
    new_config = config.with_overrides({"job.partitions": job.new})
    manifest = pending(job)
    if manifest is not None:
        if manifest["to"] != job.new or manifest["from"] not in (job.old, job.new):
            raise LocalStateError(
                f"job {config.job_name!r}: an earlier rescale from {manifest['from']} to {manifest['to']} partitions "
                f"was committed but not finished ({job.staging}); finish it first with --to {manifest['to']}"
            )
        if manifest_still_valid(job, manifest):
            log.warning("job %r: finishing the rescale to %d partitions that a crash interrupted",
                        config.job_name, job.new)
            swap(job, manifest)
            return RescaleResult(new_config, manifest["from"], job.new, manifest["version"],
                                 dict(manifest["records"]), time.perf_counter() - t0)
        log.warning("job %r committed again after an unfinished rescale was staged: restaging", config.job_name)
        shutil.rmtree(job.staging)
    counts = {s: stream_count(job, s) for s in streams(job)}
    if counts and all(c == job.new for c in counts.values()) and job.old != job.new:
        ckpt = job.system.checkpoints().read(config.job_name, 0)
        log.warning("job %r: its changelog is already at %d partitions (an earlier rescale finished)",
                    config.job_name, job.new)
        return RescaleResult(new_config, job.old, job.new, ckpt.version if ckpt else -1, {},
                             time.perf_counter() - t0, already_done=True)
    if job.old == job.new:
        raise InvalidValueError(f"job {config.job_name!r} already has {job.new} partitions: nothing to rescale")
    for stream, count in counts.items():
        if count is not None and count != job.old:
            raise ChangelogError(
                f"changelog stream {stream!r} at {job.root / stream} has {count} partitions but the job has "
                f"job.partitions = {job.old}: rescale from the count the state is at. Nothing was changed."
            )
    ckpts = _read_checkpoints(job)
    _check_stores(job, ckpts)
    for spec in job.stores.values():  # refuse an unsplittable store before reading anything
        if layout_for(spec).kind == "key":
            route_of(spec)
    version = next(iter(ckpts.values())).version
    position = _positions(job, ckpts, input_position, version)
    if job.staging.exists():
        shutil.rmtree(job.staging)
    ends: dict[str, list[int]] = {}
    records: dict[str, int] = {}
    try:
        if spark is not None:
            from localstate.contrib.spark.rescale import stage_with_spark

            ends, records = stage_with_spark(spark, job, ckpts)
        else:
            for name, spec in job.stores.items():
                states = {p: _committed_records(job, spec, p, c) for p, c in ckpts.items()}
                parts = _route_store(job, spec, states)
                del states
                ends[name] = [write_new_partition(job, name, q, part) for q, part in enumerate(parts)]
                records[name] = sum(len(part) for part in parts)
        write_staging(job, ends, records, version, position, ckpts)
    except Exception:
        # A refusal found while staging (a later store's keys): the old job was never
        # touched; remove what was staged so a refusal changes nothing on disk.
        if not (job.staging / "manifest.json").exists():
            shutil.rmtree(job.staging, ignore_errors=True)
            try:
                job.staging.parent.rmdir()
            except OSError:
                pass
        raise
    manifest = pending(job)
    assert manifest is not None
    swap(job, manifest)
    log.info("job %r rescaled from %d to %d partitions at version %d: %s", config.job_name, job.old, job.new,
             version, records)
    return RescaleResult(new_config, job.old, job.new, version, records, time.perf_counter() - t0)


def route_old_task(config: Config, to: int, name: str, p: int, ckpt: Checkpoint) -> list[dict[bytes, bytes]]:
    """Old task ``p``'s committed records of store ``name``, per new task (run on a
    Spark executor by ``rescale(spark=...)``; the locks are held by the driver)."""
    job = _job(config, to)
    try:
        spec = job.stores[name]
        return _route_store(job, spec, {p: _committed_records(job, spec, p, ckpt)})
    finally:
        job.system.close()


def write_task_partition(config: Config, to: int, name: str, q: int,
                         pieces: Iterable[Mapping[bytes, bytes]]) -> tuple[int, int]:
    """Merge the pieces old tasks sent new task ``q`` of store ``name`` and write them
    into the staging area; returns ``(end offset, records)`` (run on a Spark executor)."""
    job = _job(config, to)
    try:
        records = _merge_records(job.stores[name], pieces)
        return write_new_partition(job, name, q, records), len(records)
    finally:
        job.system.close()


def _merge_records(spec: StoreSpec, parts: Iterable[Mapping[bytes, bytes]]) -> dict[bytes, bytes]:
    """One new task's records of ``spec`` from the pieces several old tasks sent it."""
    merge = layout_for(spec).merge
    out: dict[bytes, bytes] = {}
    for part in parts:
        for k, v in part.items():
            before = out.get(k)
            out[k] = v if before is None or merge is None else merge(before, v)
    return out


_PARTITIONS_LINE = {
    ".toml": re.compile(r'^(\s*(?:"?job\.partitions"?|job\s*\.\s*partitions|partitions)\s*=\s*)(\S+)', re.M),
    ".properties": re.compile(r"^(\s*job\.partitions\s*[=:\s]\s*)(\S+)", re.M),
}


def update_config_file(path: str | Path, to: int) -> None:
    """Set ``job.partitions = to`` in the config file at ``path`` (TOML or properties),
    atomically, and only if the file then loads to the same config with the new count;
    otherwise raise :class:`ConfigError` asking for the edit by hand (the file is unchanged)."""
    from localstate.locking import atomic_write

    p = Path(path)
    before = Config.load(p)
    text = p.read_text(encoding="utf-8")
    kind = ".toml" if p.suffix == ".toml" else ".properties"
    new_text, n = _PARTITIONS_LINE[kind].subn(lambda m: m.group(1) + str(to), text)
    if n == 0:
        line = f"job.partitions = {to}\n"
        new_text = line + text if kind == ".toml" else text + ("" if text.endswith("\n") or not text else "\n") + line
    tmp = p.with_name(f".{p.stem}.rescale-check{p.suffix}")
    try:
        tmp.write_text(new_text, encoding="utf-8")
        try:
            after = Config.load(tmp)
        except ConfigError:
            after = None
    finally:
        tmp.unlink(missing_ok=True)

    def rest(c: Config) -> dict[str, Any]:
        return {k: str(v) for k, v in c.to_dict().items() if k != "job.partitions"}

    if after is None or after.partitions != to or rest(after) != rest(before):
        raise ConfigError(
            f"could not set job.partitions = {to} in {p} safely (its layout is unusual); the state is rescaled: "
            f"edit the file by hand to job.partitions = {to}"
        )
    atomic_write(p, new_text.encode("utf-8"))
