"""TaskStorage: the stores of one task partition, with commit and exact restore.

Commit (DESIGN §4), in this order:

1. flush caches into engines; ``engine.prepare_commit()``;
2. flush change loggers → changelog appends → durable changelog ``flush()`` → end offsets;
3. ``engine.flush()`` and ``engine.checkpoint(offset)`` (local snapshot tagged with it);
4. write the task checkpoint ``{version, input_position, offsets}`` atomically.

Nothing counts as committed before step 4. Restore of a store reads the committed
offset ``C`` from the checkpoint, lets the engine pick local state at ``L <= C``,
replays ``[L, C)`` straight into the engine (never logged, never cached) and then
removes the uncommitted tail ``[C, end)`` before the task writes again.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .changelogger import ChangeLogger, NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .engine import ChangeRecord, StorageEngine, StoreContext, StoreSpec
from .errors import ChangelogError, EngineError, LocalStateError, StoreClosedError
from .faults import fault_point
from .kv import KeyValueStore
from .layers import build_store
from .locking import FileLock, io_error
from .metrics import RestoreProgress, StoreMetrics
from .registry import SYSTEMS, did_you_mean, resolve_factory
from .serdes import get_serde

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition, ChangelogSystem

__all__ = ["TaskStorage", "RestoreListener", "open_system"]

log = logging.getLogger("localstate")

RestoreListener = Callable[[RestoreProgress], None]
_REPORT_EVERY_S = 0.5


def open_system(config: Config, name: str) -> ChangelogSystem:
    """Instantiate the changelog system ``name`` declared (or defaulted) in ``config``."""
    options = config.systems.get(name)
    if options is None:
        raise ChangelogError(f"changelog system {name!r} is not configured (systems.{name}.*)")
    cls = SYSTEMS.get(str(options.get("type", name)))
    return cls(name, options, config.job_name)


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
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"TaskStorage needs a localstate.Config, got {type(config).__name__}")
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
        task_dir = config.state_dir / self.job
        try:
            (task_dir / ".locks").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, "create state directory", task_dir, LocalStateError) from e
        self._lock = FileLock(
            task_dir / ".locks" / f"partition-{partition}.lock",
            f"task {self.job}/partition {partition} (state dir {config.state_dir})",
        )
        try:
            self._checkpoints = self._system(config.checkpoint_system).checkpoints()
            self._checkpoint = self._checkpoints.read(self.job, partition)
            self.epoch = (self._checkpoint.epoch if self._checkpoint else 0) + 1
            for spec in config.stores.values():
                self._open_store(spec)
        except BaseException:
            self._close_all(raise_errors=False)
            raise

    # -- opening and restoring ---------------------------------------------------------------
    def _system(self, name: str) -> ChangelogSystem:
        system = self._systems.get(name)
        if system is None:
            system = self._systems[name] = open_system(self.config, name)
        return system

    def store_dir(self, name: str) -> Path:
        """``job.state.dir/<job>/<store>/<partition>``."""
        return self.config.state_dir / self.job / name / str(self.partition)

    def _open_store(self, spec: StoreSpec) -> None:
        directory = self.store_dir(spec.name)
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
        entry = _OpenStore(spec, engine, engine, logger, changelog, metrics, directory)
        self._stores[spec.name] = entry
        if changelog is not None:
            committed = self._checkpoint.offsets.get(spec.name, 0) if self._checkpoint else 0
            self._restore(entry, committed)
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
            )

    def _restore(self, entry: _OpenStore, committed: int) -> RestoreProgress:
        changelog = entry.changelog
        assert changelog is not None
        name = entry.spec.name
        min_valid = changelog.min_valid_snapshot_offset()
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
                entry.engine.restore(chain.from_iterable(batches()), into_empty=start == 0)
            finally:
                if gc_was_enabled:
                    gc.enable()
        final = progress(True)
        m = entry.metrics
        m.records_restored += final.records
        m.bytes_restored += final.bytes
        m.restore_seconds += final.seconds
        self.last_restore[name] = final
        if listener is not None:
            listener(final)
        if final.records:
            log.info(
                "restored store %r partition %d: %d records (%d bytes) from offsets [%d, %d) in %.3fs",
                name, self.partition, final.records, final.bytes, start, committed, final.seconds,
            )
        return final

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

    def store(self, name: str) -> Any:
        """The store as the task uses it: a layered :class:`KeyValueStore` for KV engines,
        the engine itself (its own API) for the others."""
        return self._entry(name).view

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
        """The last committed checkpoint (``input_position``, per-store ``offsets``), or None."""
        return self._checkpoint

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
        try:
            return self._commit(input_position, version)
        except BaseException as e:
            self._failed = e
            raise

    def _commit(self, input_position: Any, version: int | None) -> Checkpoint:
        entries = list(self._stores.values())
        for e in entries:
            if e.view is not e.engine:
                e.view.flush()
            e.engine.prepare_commit()
        fault_point("commit.before_changelog_flush")
        offsets: dict[str, int] = {}
        for e in entries:
            if e.changelog is not None:
                offsets[e.spec.name] = e.logger.flush()
        fault_point("commit.after_changelog_flush")
        for e in entries:
            e.engine.flush()
            if e.changelog is not None:
                e.engine.checkpoint(offsets[e.spec.name])
            e.metrics.commits += 1
        fault_point("commit.after_engine_checkpoint")
        prev = self._checkpoint
        ckpt = Checkpoint(
            version=version if version is not None else (prev.version + 1 if prev else 1),
            input_position=input_position,
            offsets=offsets,
            epoch=self.epoch,
        )
        self._checkpoints.write(self.job, self.partition, ckpt)
        self._checkpoint = ckpt
        return ckpt

    def compact(self) -> dict[str, dict[str, int]]:
        """Compact every store's changelog below its committed offset."""
        out = {}
        for name, e in self._stores.items():
            if e.changelog is not None and self._checkpoint is not None:
                out[name] = e.changelog.compact(self._checkpoint.offsets.get(name, 0))
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
        errors: list[BaseException] = []
        for e in self._stores.values():
            e.logger.discard_pending()
            for step in (e.view.close if e.view is not e.engine else None, e.engine.close):
                if step is None:
                    continue
                try:
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TaskStorage(job={self.job!r}, partition={self.partition}, stores={self.stores})"

