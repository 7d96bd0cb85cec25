"""TaskStorage: the stores of one task partition, with commit and exact restore.

The facade a task uses: it takes the task lock, reads the checkpoint, has every store
opened into the task's :class:`~localstate.store_open.TaskState` (a
:class:`~localstate.store_open.StoreOpener`: checks, committed offset, restore), hands
out the stores, has them committed (a :class:`~localstate.commit.TaskCommitter`: the four
steps of docs/design/protocol.md) and closes them. The opener and the committer share
only that state, passed to each explicitly.
The names of those modules are re-exported here, so ``from localstate.storage import
TaskStorage, Recovery, open_system, ...`` keeps working.
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .checkpoint import Checkpoint
from .commit import TaskCommitter, check_input_position
from .config import Config
from .engine import StorageEngine
from .errors import (
    ConfigError,
    CorruptionError,
    InvalidValueError,
    LocalStateError,
    StoreClosedError,
)
from .faults import paused
from .kv import KeyValueStore
from .layout import home_path, store_dir, task_lock
from .locking import atomic_write, collecting_locks, io_error, remove_tree
from .metrics import RestoreProgress, StoreMetrics, TaskMetrics, track, untrack
from .registry import did_you_mean
from .serdes import checked_serde, get_serde
from .store_open import (
    ChangelogSystems,
    Recovery,
    RestoreListener,
    StoreOpener,
    TaskState,
    _OpenStore,
    engine_phase,
    open_system,
    task_partition,
)
from .typed import check_store_types

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition, ChangelogSystem

    from .layers.columnar import ColumnarStore

# the names of store_open and commit a caller may import from here, as before the split
__all__ = ["TaskStorage", "RestoreListener", "Recovery", "open_system", "task_partition", "check_input_position",
           "engine_phase"]

log = logging.getLogger("localstate")

K = TypeVar("K")
V = TypeVar("V")


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
        self._stores: dict[str, _OpenStore] = {}
        self._columnar: dict[str, ColumnarStore] = {}
        self._changelog_systems = ChangelogSystems(config)
        self._systems = self._changelog_systems.opened
        self._closed = False
        self.task_metrics = TaskMetrics()
        self.memo: dict[str, Any] = {}
        """What a task keeps in memory beside its stores between runs while this storage
        stays open (:mod:`localstate.kept_open`): empty after every open, so a restore, a
        rollback or another process's run never meets a stale memo. The task must keep it
        equal to what its stores hold (the storage is kept only after a successful commit;
        any failure closes it and the memo with it)."""
        self._committed_marks: tuple[Any, ...] | None = None
        with collecting_locks() as self._file_locks:  # every lock the open takes, parked together
            self._lock = task_lock(config, partition)
            if discard_local:
                self._discard_local_copies()
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
                evidence: list[str] = []
                if ckpt is None and not recovery:
                    self._check_home(home)
                    evidence = self._commit_evidence(home)
                self._state = TaskState(
                    config, partition, self._stores,
                    offsets=dict(ckpt.offsets) if ckpt else {},
                    meta={k: dict(v) for k, v in ckpt.stores.items()} if ckpt else {},
                    epoch=(ckpt.epoch if ckpt else 0) + 1,
                    event_time=ckpt.event_time if ckpt else None,
                )
                self._committer = TaskCommitter(self._state, self._checkpoints, self.task_metrics,
                                                ckpt if ckpt is not None and ckpt.committed else None)
                opener = StoreOpener(self._state, self._changelog_systems, recovery, restore_listener, evidence)
                self.last_restore: dict[str, RestoreProgress] = opener.last_restore
                """Per store: how the restore at open went (records, bytes, seconds)."""
                for spec in config.stores.values():
                    opener.open(spec)
                if opener.register:  # write a checkpoint at open (new stores, recovery, accepted changes)
                    with paused():
                        self._committer.write_checkpoint(ckpt.version if ckpt else -1,
                                                         ckpt.input_position if ckpt else None)
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

    def _commit_evidence(self, home: str) -> list[str]:
        """What this state dir holds that only a task with a checkpoint leaves: the home
        file naming the checkpoint system ``home``, when the task logs a store (the open
        that wrote it wrote a checkpoint there first). A store's local files are no such
        evidence: an engine creates them before the task's first checkpoint."""
        path = self._home_file()
        try:
            here = path.read_text().strip() == home
        except OSError:
            return []
        if here and any(spec.changelog is not None for spec in self.config.stores.values()):
            return [f"{path} (an earlier open wrote a checkpoint there)"]
        return []

    def _write_home(self, home: str) -> None:
        """Remember (at open, not per commit; written only when it changes) where the
        task's checkpoints live."""
        path = self._home_file()
        try:
            if not path.exists() or path.read_text().strip() != home:
                atomic_write(path, (home + "\n").encode())  # a torn one would name a wrong home
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
        return self._changelog_systems.get(name)

    def store_dir(self, name: str) -> Path:
        """``job.state.dir/<job>/<store>/<partition>`` (:func:`localstate.layout.store_dir`)."""
        return store_dir(self.config, name, self.partition)

    # -- the task's clock and epoch ------------------------------------------------------------------------------------------
    def advance_event_time(self, timestamp_ms: int) -> int:
        """Move the task's event-time clock forward to ``timestamp_ms`` (never back) and
        return it. Committed with the checkpoint, so a restore resumes at the committed time."""
        if not isinstance(timestamp_ms, numbers.Integral) or isinstance(timestamp_ms, bool):
            raise InvalidValueError(
                f"event time must be an int (ms since the epoch), got {timestamp_ms!r} ({type(timestamp_ms).__name__})"
            )
        ts = int(timestamp_ms)
        state = self._state
        if state.event_time is None or ts > state.event_time:
            state.event_time = ts
        return state.event_time

    @property
    def event_time(self) -> int | None:
        """The task's event-time clock (watermark, ms): advanced by :meth:`advance_event_time`,
        committed with the checkpoint, used by ``ttl.time = event`` stores and event-time timers."""
        return self._state.event_time

    @event_time.setter
    def event_time(self, value: int | None) -> None:
        self._state.event_time = value

    @property
    def epoch(self) -> int:
        """This open's epoch: the committed checkpoint's epoch + 1."""
        return self._state.epoch

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

    def columns(self, name: str) -> ColumnarStore:
        """Arrow-columnar bulk access to key-value store ``name``
        (:class:`~localstate.layers.columnar.ColumnarStore`: keys encoded once, scans as
        columns), beside :meth:`store` over the same engine, changelog and metrics.
        Needs pyarrow, no object cache and no TTL (a ConfigError says which)."""
        entry = self._entry(name)
        view = self._columnar.get(name)
        if view is not None:
            return view
        spec = entry.spec
        refusal = ("it is not a key-value store" if not isinstance(entry.engine, KeyValueStore)
                   else "it has an object cache, which this path would bypass (set object.cache.size = 0)"
                   if spec.object_cache_size > 0
                   else "it has a TTL (values are stored with their expiry)" if spec.ttl is not None else None)
        if refusal:
            raise ConfigError(f"store {name!r}: no columnar access: {refusal}")
        try:
            from .layers.columnar import ColumnarStore
        except ImportError as e:
            raise ConfigError(f"store {name!r}: columnar access needs pyarrow: pip install 'localstate[spark]' "
                              f"({e})") from e
        from .layers import maybe_logging

        view = ColumnarStore(maybe_logging(entry.engine, entry.logger), checked_serde(get_serde(spec.key_serde)),
                             checked_serde(get_serde(spec.msg_serde)), name, entry.metrics)
        self._columnar[name] = view
        return view

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
        return self._committer.checkpoint

    def pending_records(self, name: str) -> int:
        """Change records of store ``name`` buffered in its change logger (not yet in
        the changelog)."""
        return self._entry(name).logger.pending_count()

    def committed_offset(self, name: str) -> int | None:
        """The changelog offset store ``name``'s last commit covers (None: not logged
        or never committed)."""
        self._entry(name)
        return self._state.offsets.get(name)

    # -- committing (core/commit.py) -----------------------------------------------------------------
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
        self._committed_marks = None
        checkpoint = self._committer.commit(input_position, version=version)
        self._committed_marks = self._write_marks()
        return checkpoint

    def compact(self) -> dict[str, dict[str, int]]:
        """Compact every store's changelog below the oldest offset any kept checkpoint
        names (the latest and the one before it), so going back to the previous
        checkpoint still rebuilds exactly the state it committed."""
        return self._committer.compact()

    # -- an idle task kept open between runs (localstate.kept_open) ---------------------------------
    def _write_marks(self) -> tuple[Any, ...]:
        """What changes with any write to a logged store: per store, the records its
        change logger holds and has appended, and the entries its write-behind cache holds."""
        marks = []
        for e in self._stores.values():
            dirty, layer, depth = 0, e.view, 0
            while layer is not None and depth < 8:
                count = getattr(layer, "dirty_count", None)
                if callable(count):
                    dirty += count()
                layer, depth = getattr(layer, "inner", None), depth + 1
            marks.append((e.logger.pending_count(), e.logger.metrics.records_logged, dirty))
        return tuple(marks)

    def park(self) -> bool:
        """Mark this storage idle between runs: its locks stay held but are given up to
        whoever asks (:class:`~localstate.locking.FileLock`). Only a storage whose last
        step was a successful commit parks (nothing written since: a later write would be
        committed by the next run as its own), and only when each changelog system it
        uses can keep a task open
        (:attr:`~localstate.changelog.base.ChangelogSystem.keeps_open`); False, and
        nothing done, otherwise."""
        if self._closed or self._committed_marks is None or self._write_marks() != self._committed_marks:
            return False
        if not all(system.keeps_open for system in self._systems.values()):
            return False  # see ChangelogSystem.keeps_open
        for lock in self._file_locks:
            lock.park()
        return True

    def holds_its_locks(self) -> bool:
        """Whether this open storage still holds each of its locks on the file at its path
        (not on one deleted or replaced since, e.g. with the state dir)."""
        return not self._closed and all(lock.intact() for lock in self._file_locks)

    def release_requested(self) -> bool:
        """Whether another process waits for one of this parked storage's locks."""
        return any(lock.release_requested() for lock in self._file_locks)

    def unpark(self) -> bool:
        """Take a parked storage back for another run. True when it is still the task's
        current state: every lock held on its file (none deleted or replaced meanwhile)
        and, once each changelog system made this instance the task's newest again
        (:meth:`~localstate.changelog.base.ChangelogSystem.renew_task_instance`: Kafka
        fences whoever opened the task meanwhile), the checkpoint store's latest
        checkpoint the one this storage committed (no other instance of the task
        committed since, e.g. on another executor with its own state dir). False
        otherwise: close it and open the task again."""
        if not self.holds_its_locks():
            return False
        for lock in self._file_locks:
            lock.unpark()
        mine = self._committer.checkpoint
        try:
            for system in self._systems.values():
                system.renew_task_instance(self.job, self.partition)
            latest = self._checkpoints.latest_for_kept(self.job, self.partition)
        except LocalStateError as e:
            log.warning("task %s/partition %d: could not renew or re-read the checkpoint of a parked open (%s); "
                        "opening it again", self.job, self.partition, e)
            return False
        if not (latest is not None and mine is not None and latest.version == mine.version
                and latest.epoch == mine.epoch and dict(latest.offsets) == dict(mine.offsets)):
            return False
        # this run restored nothing: each store stands at its committed offset
        self.last_restore = {
            name: replace(progress, records=0, bytes=0, seconds=0.0, start_offset=mine.offsets.get(name, 0),
                          stop_offset=mine.offsets.get(name, 0), done=True)
            for name, progress in self.last_restore.items()}
        return True

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
        self.memo.clear()  # what the task kept beside the stores goes with them
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
        errors.extend(self._changelog_systems.close())
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
