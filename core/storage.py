"""TaskStorage: the stores of one task partition, with commit and exact restore.

Commit (DESIGN §4), in this order:

1. flush caches into engines; ``engine.prepare_commit()``;
2. flush change loggers → changelog appends → durable changelog ``flush()`` → end offsets;
3. ``engine.persist(offset)``: ``flush()`` and ``checkpoint(offset)`` (local snapshot tagged with it);
4. write the task checkpoint ``{version, input_position, offsets}`` atomically.

Nothing counts as committed before step 4. Restore of a store reads the committed
offset ``C`` from the checkpoint, lets the engine pick local state at ``L <= C``,
replays ``[L, C)`` straight into the engine (never logged, never cached) and then
removes the uncommitted tail ``[C, end)`` before the task writes again.
"""

from __future__ import annotations

import gc
import logging
import math
import numbers
import shutil
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .changelogger import ChangeLogger, NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .engine import StorageEngine, StoreContext, StoreSpec
from .errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    EngineError,
    InvalidValueError,
    LocalStateError,
    StoreClosedError,
)
from .faults import fault_point, paused
from .kv import KeyValueStore
from .layers import build_store
from .layers.ttl import wall_clock_ns
from .layout import home_path, store_dir, task_lock
from .locking import io_error, remove_tree
from .metrics import RestoreProgress, StoreMetrics, TaskMetrics, track, untrack
from .records import ChangeRecord
from .registry import SYSTEMS, did_you_mean, resolve_factory
from .serdes import get_serde
from .typed import check_store_types

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition, ChangelogSystem

__all__ = ["TaskStorage", "RestoreListener", "Recovery", "open_system"]

log = logging.getLogger("localstate")

RestoreListener = Callable[[RestoreProgress], None]
K = TypeVar("K")
V = TypeVar("V")
_REPORT_EVERY_S = 0.5


def open_system(config: Config, name: str) -> ChangelogSystem:
    """Instantiate the changelog system ``name`` declared (or defaulted) in ``config``."""
    options = config.systems.get(name)
    if options is None:
        raise ChangelogError(f"changelog system {name!r} is not configured (systems.{name}.*)")
    cls = SYSTEMS.get(str(options.get("type", name)))
    return cls(name, options, config.job_name)


@dataclass(frozen=True)
class Recovery:
    """Explicit operator decisions for states that opening a task refuses on its own
    (``localstate restore --accept-log-end/--reset/--use-previous-checkpoint/
    --accept-config-change``; RELIABILITY.md, "operator damage"). Each names stores.

    - ``accept_log_end``: take what the store's changelog holds, up to its last readable
      record, as committed (a checkpoint was lost, or committed records are damaged).
    - ``reset``: give up the store's state: its changelog is emptied (file: segments
      removed; Kafka: a tombstone for every key) and its local copy deleted.
    - ``use_previous_checkpoint``: the latest task checkpoint is lost or damaged; go
      back to the one before it (its commit is undone; the input is replayed from there).
    - ``accept_config_change``: the store's engine or serdes changed since its last
      commit and the new ones read the same change records; the local copy is rebuilt.
    """

    accept_log_end: Collection[str] = field(default_factory=frozenset)
    reset: Collection[str] = field(default_factory=frozenset)
    use_previous_checkpoint: bool = False
    accept_config_change: Collection[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.accept_log_end or self.reset or self.use_previous_checkpoint or self.accept_config_change)


@contextmanager
def engine_phase(spec: StoreSpec, phase: str) -> Iterator[None]:
    """Errors a plug-in raises in ``phase`` reach the user as :class:`EngineError`
    naming the store, the phase and the engine (raised ``from`` the original);
    localstate's own errors pass unchanged."""
    try:
        yield
    except LocalStateError:
        raise
    except Exception as e:
        raise EngineError(
            f"store {spec.name!r}: engine {spec.factory!r} failed in {phase}(): {type(e).__name__}: {e}"
        ) from e


def task_partition(partition: Any) -> int:
    """``partition`` as an ``int`` (numpy integers fine); anything else is an error —
    ``0.0`` or ``False`` would otherwise name a different task directory."""
    if isinstance(partition, numbers.Integral) and not isinstance(partition, bool):
        return int(partition)
    raise InvalidValueError(
        f"partition must be an int, got {partition!r} ({type(partition).__name__})"
    )


PLAIN_VALUES = "plain"
TTL_VALUES = "ttl-expiry-ns-v1"


def _store_meta(spec: StoreSpec) -> dict[str, str]:
    meta = {"factory": spec.factory, "key.serde": spec.key_serde, "msg.serde": spec.msg_serde}
    if spec.changelog is not None:
        meta["changelog"] = ".".join(spec.changelog)
    if spec.ttl is not None:
        meta["value.format"] = TTL_VALUES  # absent means PLAIN_VALUES (checkpoints from before TTL)
    return meta


def _value_format_change(spec: StoreSpec, before: dict[str, str] | None, meta: dict[str, str]) -> str | None:
    """A message when TTL was added to or removed from a committed store: its records carry
    (or lack) the 8-byte expiry prefix, so the new config would misread every value."""
    if before is None:
        return None
    was, now = before.get("value.format", PLAIN_VALUES), meta.get("value.format", PLAIN_VALUES)
    if was == now:
        return None
    what = "added to" if now == TTL_VALUES else "removed from"
    return (
        f"stores.{spec.name}.ttl.ms was {what} store {spec.name!r}, which was committed with value format "
        f"{was!r} (now {now!r}): TTL stores keep an expiry with every value, so its stored records would "
        "be misread. Nothing was changed. Set the config back; or start the store over with "
        f"`localstate restore --reset {spec.name}`; or copy the data into a new store with the new setting."
    )


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


@dataclass
class _OpenStore:
    spec: StoreSpec
    engine: StorageEngine
    view: Any
    logger: ChangeLogger
    changelog: ChangelogPartition | None
    metrics: StoreMetrics
    directory: Path


class TaskStorage:
    """Opens every store of ``config`` for task ``partition``, restoring each first.

    A context manager; ``close()`` is idempotent and does **not** commit.

    >>> with TaskStorage(config, partition=0) as storage:      # doctest: +SKIP
    ...     counts = storage.store("counts")
    ...     counts["page-1"] = counts.get("page-1", 0) + 1
    ...     storage.commit(input_position=42)
    """

    def __init__(
        self,
        config: Config,
        partition: int = 0,
        *,
        restore_listener: RestoreListener | None = None,
        recovery: Recovery | None = None,
        discard_local: bool = False,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"TaskStorage needs a localstate.Config, got {type(config).__name__}")
        partition = task_partition(partition)
        recovery = recovery or Recovery()
        unknown = {n for group in (recovery.accept_log_end, recovery.reset, recovery.accept_config_change)
                   for n in group} - set(config.stores)
        if unknown:
            raise ConfigError(f"recovery names unknown store(s) {sorted(unknown)}; the config has {sorted(config.stores)}")
        if not 0 <= partition < config.partitions:
            raise LocalStateError(
                f"partition {partition} is out of range: job.partitions = {config.partitions}"
            )
        self.config = config
        self.partition = partition
        self.job = config.job_name
        self._listener = restore_listener
        self._stores: dict[str, _OpenStore] = {}
        self._systems: dict[str, ChangelogSystem] = {}
        self._closed = False
        self._failed: BaseException | None = None
        self.last_restore: dict[str, RestoreProgress] = {}
        """Per store: how the restore at open went (records, bytes, seconds)."""
        self.task_metrics = TaskMetrics()
        self._lock = task_lock(config, partition)
        if discard_local:
            self._discard_local_copies()
        self._recovery = recovery
        self._register = bool(recovery)  # write a checkpoint at open (new stores, recovery)
        try:
            self._checkpoints = self._system(config.checkpoint_system).checkpoints()
            if recovery.use_previous_checkpoint:
                ckpt = self._checkpoints.previous(self.job, partition)
                if ckpt is None:
                    raise LocalStateError(
                        f"task {self.job}/partition {partition}: there is no previous checkpoint to go back to "
                        f"in {self._system(config.checkpoint_system).describe()}"
                    )
                log.warning("task %s/partition %d: going back to the previous checkpoint (version %d) as asked",
                            self.job, partition, ckpt.version)
            else:
                ckpt = self._read_checkpoint(recovery)
            home = self._system(config.checkpoint_system).describe()
            if ckpt is None and not recovery:
                self._check_home(home)
            self._committed: Checkpoint | None = ckpt
            self._checkpoint = ckpt if ckpt is not None and ckpt.committed else None
            self.epoch = (ckpt.epoch if ckpt else 0) + 1
            self.event_time: int | None = ckpt.event_time if ckpt else None
            """The task's event-time clock (watermark, ms): advanced by :meth:`advance_event_time`,
            committed with the checkpoint, used by ``ttl.time = event`` stores and event-time timers."""
            self._offsets: dict[str, int] = dict(ckpt.offsets) if ckpt else {}
            self._meta: dict[str, dict[str, str]] = {k: dict(v) for k, v in ckpt.stores.items()} if ckpt else {}
            for spec in config.stores.values():
                self._open_store(spec)
            if self._register:
                with paused():
                    self._write_checkpoint(ckpt.version if ckpt else -1, ckpt.input_position if ckpt else None)
            if ckpt is None or recovery:
                self._write_home(home)
        except BaseException:
            self._close_all(raise_errors=False)
            raise
        track(self)

    # -- opening and restoring ---------------------------------------------------------------
    def _home_file(self) -> Path:
        return home_path(self.config, self.partition)

    def _discard_local_copies(self) -> None:
        """Delete every store's local copy (under the task lock), so each is rebuilt
        from its changelog on open."""
        for name in self.config.stores:
            directory = self.store_dir(name)
            try:
                remove_tree(directory)
            except OSError as e:
                self._lock.release()
                raise io_error(e, "delete the local copy", directory, LocalStateError) from e

    def _check_home(self, home: str) -> None:
        """No checkpoint where the config says, but this state dir remembers the task's
        checkpoints elsewhere (the checkpoint system was changed, e.g. file → kafka):
        an error, not a silently new, empty task."""
        try:
            before = self._home_file().read_text().strip()
        except (FileNotFoundError, OSError):
            return
        if before and before != home:
            raise CorruptionError(
                f"task {self.job}/partition {self.partition}: no checkpoint in {home}, but this state dir "
                f"({self.config.state_dir}) last kept the task's checkpoints in {before}: was the checkpoint "
                "or changelog system changed? Nothing was changed. Set the config back; or start the task "
                "over in the new system with `localstate restore --reset STORE` for each store."
            )

    def _write_home(self, home: str) -> None:
        """Remember (once per task, not per commit) where the task's checkpoints live."""
        path = self._home_file()
        try:
            if not path.exists() or path.read_text().strip() != home:
                path.write_text(home + "\n")
        except OSError as e:
            log.warning("could not record %s (%s); a later change of checkpoint system will not be detected",
                        path, e)

    def _read_checkpoint(self, recovery: Recovery) -> Checkpoint | None:
        """The latest checkpoint; an unreadable one is an error unless the operator
        decided, for every logged store, what its state is (accept the log or reset)."""
        try:
            return self._checkpoints.read(self.job, self.partition)
        except CorruptionError as e:
            logged = {s.name for s in self.config.stores.values() if s.changelog is not None}
            decided = set(recovery.accept_log_end) | set(recovery.reset)
            if not logged or not logged <= decided:
                raise
            log.warning("task %s/partition %d: unreadable checkpoint replaced as asked (%s)", self.job,
                        self.partition, e)
            return None

    def _system(self, name: str) -> ChangelogSystem:
        system = self._systems.get(name)
        if system is None:
            system = self._systems[name] = open_system(self.config, name)
        return system

    def store_dir(self, name: str) -> Path:
        """``job.state.dir/<job>/<store>/<partition>`` (:func:`localstate.layout.store_dir`)."""
        return store_dir(self.config, name, self.partition)

    def _check_meta(self, spec: StoreSpec, directory: Path) -> None:
        """A store whose engine or serdes changed since its last commit is an error
        (its records would be misread), unless the operator accepted the change."""
        meta = _store_meta(spec)
        before = self._meta.get(spec.name)
        if before == meta:
            return
        format_change = _value_format_change(spec, before, meta)
        if format_change is not None and spec.name not in self._recovery.reset:
            raise ConfigError(format_change)  # --accept-config-change cannot help: records differ
        self._register = True
        self._meta[spec.name] = meta
        changed = {k: (before[k], v) for k, v in meta.items() if before is not None and k in before and before[k] != v}
        if not changed:
            return  # new store, or a checkpoint from before a key was recorded
        if spec.name in self._recovery.accept_config_change or spec.name in self._recovery.reset:
            log.warning("store %r: %s changed since its last commit (accepted); rebuilding its local copy",
                        spec.name, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
            shutil.rmtree(directory, ignore_errors=True)
            return
        raise ConfigError(
            f"store {spec.name!r} of task {self.job}/partition {self.partition} was committed with "
            + ", ".join(f"stores.{spec.name}.{k} = {a!r}" for k, (a, _) in changed.items())
            + " but the config now says "
            + ", ".join(f"{b!r}" for _, b in changed.values())
            + ": its stored records would be misread or not found. Nothing was changed. Set the config back; or, if the "
            f"new settings read the same change records, run `localstate restore --accept-config-change "
            f"{spec.name}`; or start the store over with `localstate restore --reset {spec.name}`."
        )

    def _committed_offset(self, spec: StoreSpec, changelog: ChangelogPartition) -> int:
        """The offset the store's state is restored to, checked against the changelog
        *before* anything is read, cut or written."""
        name, rec = spec.name, self._recovery
        committed = self._offsets.get(name)
        if name in rec.reset:
            end = changelog.reset()
            log.warning("store %r partition %d: state reset as asked (changelog emptied up to offset %d)",
                        name, self.partition, end)
            self._offsets[name] = end
            return end
        end = changelog.end_offset()
        if name in rec.accept_log_end:
            log.warning("store %r partition %d: the changelog's readable end (offset %d) taken as committed "
                        "as asked (checkpoint said %s)", name, self.partition, end, committed)
            self._offsets[name] = end
            return end
        if committed is None:
            if end:
                raise CorruptionError(
                    f"store {name!r} of task {self.job}/partition {self.partition}: its changelog "
                    f"({changelog.describe()}) holds records up to offset {end}, but no checkpoint names the "
                    "store (the checkpoint was deleted, or the store's changelog stream is shared with "
                    "another store or job). Nothing was changed. If these records are the store's committed "
                    f"state, run `localstate restore --accept-log-end {name}`; to start the store empty, "
                    f"`localstate restore --reset {name}`."
                )
            self._offsets[name] = 0
            self._register = True
            return 0
        if committed > end:
            raise changelog.missing_committed(committed)
        return committed

    def _open_store(self, spec: StoreSpec) -> None:
        directory = self.store_dir(spec.name)
        self._check_meta(spec, directory)
        if spec.name in self._recovery.reset:
            shutil.rmtree(directory, ignore_errors=True)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, "create store directory", directory, LocalStateError) from e
        metrics = StoreMetrics()
        changelog: ChangelogPartition | None = None
        if spec.changelog is not None:
            system, stream = spec.changelog
            changelog = self._system(system).open_partition(stream, self.partition, self.config.partitions)
            logger: ChangeLogger = ChangeLogger(spec.name, changelog, spec.write_batch_size, metrics)
        else:
            logger = NullChangeLogger(spec.name, metrics)
        key_serde = get_serde(spec.key_serde, store=spec.name)
        msg_serde = get_serde(spec.msg_serde, store=spec.name)
        context = StoreContext(
            job=self.job,
            store=spec.name,
            partition=self.partition,
            partitions=self.config.partitions,
            directory=directory,
            change_logger=logger,
            metrics=metrics,
            key_serde=key_serde,
            msg_serde=msg_serde,
        )
        factory = resolve_factory(spec.factory, store=spec.name)
        try:
            with engine_phase(spec, "create"):
                engine = factory.create(spec, context)
        except BaseException:
            if changelog is not None:
                changelog.close()
            raise
        if not isinstance(engine, StorageEngine):
            if changelog is not None:
                changelog.close()
            raise EngineError(
                f"store {spec.name!r}: factory {spec.factory!r} returned {type(engine).__name__}, "
                "which is not a localstate.StorageEngine; create() must return a StorageEngine subclass"
            )
        if spec.ttl is not None and not isinstance(engine, KeyValueStore):
            engine.close()
            if changelog is not None:
                changelog.close()
            raise ConfigError(
                f"stores.{spec.name}.ttl.ms: engine {spec.factory!r} is not a key-value store and has no TTL; "
                "remove the ttl.* keys or use a key-value engine"
            )
        entry = _OpenStore(spec, engine, engine, logger, changelog, metrics, directory)
        self._stores[spec.name] = entry
        if changelog is not None:
            committed = self._committed_offset(spec, changelog)
            self._restore(entry, committed)
            with engine_phase(spec, "current"):
                changelog.discard_tail(committed, engine.current)
        if isinstance(engine, KeyValueStore):
            entry.view = build_store(
                engine,
                name=spec.name,
                logger=logger,
                key_serde=key_serde,
                msg_serde=msg_serde,
                cache_size=spec.object_cache_size,
                batch_size=spec.write_batch_size,
                metrics=metrics,
                ttl=spec.ttl,
                clock=self._event_clock_ns if spec.ttl is not None and spec.ttl.time == "event" else wall_clock_ns,
            )

    def _restore(self, entry: _OpenStore, committed: int) -> RestoreProgress:
        changelog = entry.changelog
        assert changelog is not None
        name = entry.spec.name
        min_valid = changelog.min_valid_snapshot_offset()
        fetch = getattr(changelog, "fetch_snapshot", None)
        if fetch is not None:
            # a changelog that keeps engine snapshots remotely (objectstore) puts the newest
            # usable one among the local snapshots; the engine then picks it like its own
            fetch(entry.engine, committed, min_valid)
        with engine_phase(entry.spec, "prepare_restore"):
            start = entry.engine.prepare_restore(committed, min_valid)
        if not (0 <= start <= committed) or (start and start < min_valid):
            raise EngineError(
                f"store {name!r}: engine {entry.spec.factory!r} chose local state at offset {start}, "
                f"outside [{min_valid}, {committed}]; its prepare_restore() is wrong"
            )
        listener = self._listener
        t0 = time.perf_counter()
        state = {"records": 0, "bytes": 0, "last": t0}

        def progress(done: bool) -> RestoreProgress:
            return RestoreProgress(
                name, self.partition, state["records"], state["bytes"],
                time.perf_counter() - t0, start, committed, done,
            )

        def batches() -> Iterator[list[ChangeRecord]]:
            first = True
            for records, nbytes in changelog.read_batches(start, committed):
                state["records"] += len(records)
                state["bytes"] += nbytes
                yield records
                if first:
                    first = False
                    fault_point("restore.mid")
                if listener is not None:
                    now = time.perf_counter()
                    if now - state["last"] >= _REPORT_EVERY_S:
                        state["last"] = now
                        listener(progress(False))

        if start < committed:
            # Restore allocates millions of acyclic record tuples; the cyclic GC would
            # traverse them again and again (~15% of a memory-engine restore) for nothing.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                with engine_phase(entry.spec, "restore"):
                    entry.engine.restore(chain.from_iterable(batches()), into_empty=start == 0)
            finally:
                if gc_was_enabled:
                    gc.enable()
            # The protocol step every engine needs, here once: the restored state is
            # durable and tagged with C, so a reopen before the next commit replays nothing.
            with engine_phase(entry.spec, "persist"):
                entry.engine.persist(committed)
        final = progress(True)
        m = entry.metrics
        m.records_restored += final.records
        m.bytes_restored += final.bytes
        m.restore_seconds += final.seconds
        m.restore_latency.observe(final.seconds)
        self.last_restore[name] = final
        if listener is not None:
            listener(final)
        if final.records:
            log.info(
                "restored store %r partition %d: %d records (%d bytes) from offsets [%d, %d) in %.3fs",
                name, self.partition, final.records, final.bytes, start, committed, final.seconds,
            )
        return final

    # -- time -----------------------------------------------------------------------------------------
    def advance_event_time(self, timestamp_ms: int) -> int:
        """Move the task's event-time clock forward to ``timestamp_ms`` (never back) and
        return it. Committed with the checkpoint, so a restore resumes at the committed time."""
        if not isinstance(timestamp_ms, numbers.Integral) or isinstance(timestamp_ms, bool):
            raise InvalidValueError(
                f"event time must be an int (ms since the epoch), got {timestamp_ms!r} ({type(timestamp_ms).__name__})"
            )
        ts = int(timestamp_ms)
        if self.event_time is None or ts > self.event_time:
            self.event_time = ts
        return self.event_time

    def _event_clock_ns(self) -> int | None:
        return None if self.event_time is None else self.event_time * 1_000_000

    # -- the task's view ---------------------------------------------------------------------------
    def _entry(self, name: str) -> _OpenStore:
        if self._closed:
            raise StoreClosedError(f"TaskStorage of {self.job}/partition {self.partition} is closed")
        entry = self._stores.get(name)
        if entry is None:
            raise LocalStateError(
                f"no store named {name!r} in job {self.job!r}.{did_you_mean(name, self._stores)}"
            )
        return entry

    @overload
    def store(self, name: str) -> Any: ...
    @overload
    def store(self, name: str, key_type: type[K], value_type: type[V]) -> KeyValueStore[K, V]: ...

    def store(self, name: str, key_type: type | None = None, value_type: type | None = None) -> Any:
        """The store as the task uses it: a layered :class:`KeyValueStore` for KV engines,
        the engine itself (its own API) for the others.

        With ``key_type`` and ``value_type`` (``storage.store("counts", str, int)``) a type
        checker sees ``KeyValueStore[str, int]``, and the types are checked now against
        the store's serdes (:mod:`localstate.typed`)."""
        entry = self._entry(name)
        return check_store_types(
            name, entry.view, get_serde(entry.spec.key_serde), get_serde(entry.spec.msg_serde),
            key_type, value_type,
        )

    def engine(self, name: str) -> StorageEngine:
        """The raw engine under store ``name`` (for tools and benchmarks)."""
        return self._entry(name).engine

    def metrics(self, name: str) -> StoreMetrics:
        return self._entry(name).metrics

    def changelog(self, name: str) -> ChangelogPartition | None:
        return self._entry(name).changelog

    @property
    def stores(self) -> list[str]:
        return list(self._stores)

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The last committed checkpoint (``input_position``, per-store ``offsets``), or
        None before the first commit."""
        return self._checkpoint

    def _write_checkpoint(self, version: int, input_position: Any) -> Checkpoint:
        ckpt = Checkpoint(
            version=version,
            input_position=input_position,
            offsets=dict(self._offsets),
            epoch=self.epoch,
            stores={k: dict(v) for k, v in self._meta.items()},
            event_time=self.event_time,
        )
        self._checkpoints.write(self.job, self.partition, ckpt)
        self._committed = ckpt
        if ckpt.committed:
            self._checkpoint = ckpt
        return ckpt

    # -- commit -----------------------------------------------------------------------------------
    def commit(self, input_position: Any = None, *, version: int | None = None) -> Checkpoint:
        """Run the commit protocol and return the new :class:`Checkpoint`.

        ``input_position`` (any JSON value) is stored with the state offsets, so after a
        crash the input resumes exactly where the state stands. ``version`` defaults to
        the previous version + 1 (Spark passes its batch id). If a commit fails, the
        error is raised and this TaskStorage refuses further commits: close it and open
        it again, which restores the last successful commit.
        """
        if self._closed:
            raise StoreClosedError(f"TaskStorage of {self.job}/partition {self.partition} is closed")
        if self._failed is not None:
            raise LocalStateError(
                f"a previous commit of {self.job}/partition {self.partition} failed ({self._failed}); "
                "close this TaskStorage and open it again to restore the last commit"
            ) from self._failed
        version = self._next_version(version)
        check_input_position(input_position)
        try:
            return self._commit(input_position, version)
        except BaseException as e:
            self._failed = e
            raise

    def _next_version(self, version: Any) -> int:
        prev = self._checkpoint
        if version is None:
            return prev.version + 1 if prev is not None else 1
        if not isinstance(version, numbers.Integral) or isinstance(version, bool):
            raise InvalidValueError(f"commit version must be an int, got {version!r} ({type(version).__name__})")
        version = int(version)
        if version < 0:
            raise InvalidValueError(f"commit version must be >= 0, got {version}")
        if prev is not None and version <= prev.version:
            raise InvalidValueError(
                f"commit version {version} of {self.job}/partition {self.partition} does not follow the "
                f"committed version {prev.version}: versions only go up (a re-run of a version is rolled "
                "back first, see localstate.contrib.spark.streaming.prepare_version)"
            )
        return version

    def _commit(self, input_position: Any, version: int) -> Checkpoint:
        clock = time.perf_counter
        started = clock()
        entries = list(self._stores.values())
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
        # offsets: self._offsets carries them forward.
        self._offsets.update(offsets)
        checkpoint = self._write_checkpoint(version, input_position)
        self.task_metrics.commits += 1
        self.task_metrics.commit_latency.observe(clock() - started)
        self._upload_snapshots(entries, offsets)
        return checkpoint

    def _upload_snapshots(self, entries: list[_OpenStore], offsets: dict[str, int]) -> None:
        """After the commit point: changelogs that keep engine snapshots remotely
        (objectstore) upload the snapshot at the committed offset. Only an optimization of
        later restores, so a failure is logged and the commit stands."""
        for e in entries:
            upload = getattr(e.changelog, "upload_snapshot", None)
            if upload is None or e.spec.name not in offsets:
                continue
            try:
                upload(e.engine, offsets[e.spec.name])
            except (LocalStateError, OSError) as err:
                log.warning("store %r partition %d: snapshot upload failed (%s); restores replay more of "
                            "the changelog until the next one", e.spec.name, self.partition, err)

    def pending_records(self, name: str) -> int:
        """Change records of store ``name`` buffered in its change logger (not yet in
        the changelog)."""
        return self._entry(name).logger.pending_count()

    def committed_offset(self, name: str) -> int | None:
        """The changelog offset store ``name``'s last commit covers (None: not logged
        or never committed)."""
        self._entry(name)
        return self._offsets.get(name)

    def compact(self) -> dict[str, dict[str, int]]:
        """Compact every store's changelog below the oldest offset any kept checkpoint
        names (the latest and the one before it), so going back to the previous
        checkpoint still rebuilds exactly the state it committed."""
        out = {}
        try:
            previous = self._checkpoints.previous(self.job, self.partition)
        except CorruptionError:
            previous = None
        for name, e in self._stores.items():
            if e.changelog is None or name not in self._offsets:
                continue
            up_to = self._offsets[name]
            ensure = getattr(e.engine, "ensure_snapshot", None)
            if ensure is not None:
                # a snapshot deferred at the last commit is taken now: older ones may fall
                # below the compaction horizon and could no longer be used
                ensure(up_to)
            if previous is not None and name in previous.offsets:
                up_to = min(up_to, previous.offsets[name])
            out[name] = e.changelog.compact(up_to)
        return out

    # -- closing --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every store, changelog and lock; idempotent; does **not** commit.

        Every step runs even if an earlier one fails; failures are reported together.
        """
        if self._closed:
            return
        self._close_all(raise_errors=True)

    def _close_all(self, raise_errors: bool) -> None:
        self._closed = True
        untrack(self)
        errors: list[BaseException] = []
        for e in self._stores.values():
            e.logger.discard_pending()
            for step in (e.view.close if e.view is not e.engine else None, e.engine.close):
                if step is None:
                    continue
                try:
                    with engine_phase(e.spec, "close"):
                        step()
                except Exception as err:
                    errors.append(err)
            e.logger.discard_pending()
            if e.changelog is not None:
                try:
                    e.changelog.close()
                except Exception as err:
                    errors.append(err)
        for system in self._systems.values():
            try:
                system.close()
            except Exception as err:
                errors.append(err)
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()
        if errors and raise_errors:
            if len(errors) == 1:
                raise errors[0]
            raise LocalStateError(
                f"closing {self.job}/partition {self.partition} failed in {len(errors)} steps: "
                + "; ".join(f"{type(x).__name__}: {x}" for x in errors)
            ) from errors[0]

    def __enter__(self) -> TaskStorage:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        # Never let a close error replace the user's own exception: report it beside it.
        try:
            self.close()
        except Exception as close_error:
            log.error("closing %s/partition %d after an error also failed: %s", self.job, self.partition, close_error)
            if hasattr(exc, "add_note"):
                exc.add_note(f"(closing the TaskStorage then also failed: {type(close_error).__name__}: {close_error})")

    def __repr__(self) -> str:
        return f"TaskStorage(job={self.job!r}, partition={self.partition}, stores={self.stores})"

