"""Opening one task's stores: changelog systems, recovery decisions, the checks of a
store against its last commit, the committed offset, and the restore
(docs/design/protocol.md, "Restore").

Restore of a store reads the committed offset ``C`` from the checkpoint, lets the
engine pick local state at ``L <= C``, replays ``[L, C)`` straight into the engine
(never logged, never cached) and then removes the uncommitted tail ``[C, end)`` before
the task writes again. :class:`StoreOpener` does it for
:class:`~localstate.TaskStorage`, into the task's :class:`TaskState` (the open stores
the committer then commits); ``localstate.storage`` re-exports the names here.
"""

from __future__ import annotations

import gc
import logging
import numbers
import shutil
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .changelogger import ChangeLogger, NullChangeLogger
from .config import Config
from .engine import StorageEngine, StoreContext, StoreSpec
from .errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    EngineError,
    InvalidValueError,
    LocalStateError,
)
from .faults import fault_point
from .kv import KeyValueStore
from .layers import build_store
from .layers.ttl import ttl_clock
from .layout import store_dir
from .locking import io_error
from .metrics import RestoreProgress, StoreMetrics
from .records import ChangeRecord
from .registry import SYSTEMS, resolve_factory
from .rescale_copies import claim_local_copy, log_identity, tag_local_copy
from .serdes import checked_serde, get_serde

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition, ChangelogSystem

__all__ = ["open_system", "Recovery", "engine_phase", "task_partition", "RestoreListener", "TaskState",
           "ChangelogSystems", "StoreOpener"]

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


def store_meta(spec: StoreSpec) -> dict[str, str]:
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


def restore_start(spec: StoreSpec, engine: StorageEngine, changelog: ChangelogPartition,
                  committed: int) -> tuple[int, int | None]:
    """Where a restore of ``engine`` to ``committed`` starts: ``(L, fetched)``. A changelog
    that keeps engine snapshots beside the log first puts the newest usable one among the
    local snapshots (``fetched``: its offset, or None); the engine then picks its state at
    ``L`` like its own (``prepare_restore``), checked to lie in ``[min_valid, committed]``."""
    min_valid = changelog.min_valid_snapshot_offset()
    fetched = changelog.fetch_snapshot(engine, committed, min_valid)
    with engine_phase(spec, "prepare_restore"):
        start = engine.prepare_restore(committed, min_valid)
    if not (0 <= start <= committed) or (start and start < min_valid):
        raise EngineError(
            f"store {spec.name!r}: engine {spec.factory!r} chose local state at offset {start}, "
            f"outside [{min_valid}, {committed}]; its prepare_restore() is wrong"
        )
    return start, fetched


@dataclass
class _OpenStore:
    spec: StoreSpec
    engine: StorageEngine
    view: Any
    logger: ChangeLogger
    changelog: ChangelogPartition | None
    metrics: StoreMetrics
    directory: Path


@dataclass
class TaskState:
    """One task's open stores and what its checkpoint records about them: filled by the
    :class:`StoreOpener`, committed by the :class:`~localstate.commit.TaskCommitter`,
    handed out by :class:`~localstate.TaskStorage`."""

    config: Config
    partition: int
    stores: dict[str, _OpenStore]
    offsets: dict[str, int]
    """Per logged store, the changelog offset its state is committed at (or restored to)."""
    meta: dict[str, dict[str, str]]
    """Per store, the engine and serdes it was committed with (:func:`store_meta`)."""
    epoch: int
    event_time: int | None
    """The task's event-time clock (watermark, ms), committed with the checkpoint."""

    @property
    def job(self) -> str:
        return self.config.job_name


class ChangelogSystems:
    """The changelog systems of one task, each opened on first use and closed together."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.opened: dict[str, ChangelogSystem] = {}

    def get(self, name: str) -> ChangelogSystem:
        system = self.opened.get(name)
        if system is None:
            system = self.opened[name] = open_system(self._config, name)
        return system

    def close(self) -> list[BaseException]:
        """Close every opened system; the errors, not raised."""
        errors: list[BaseException] = []
        for system in self.opened.values():
            try:
                system.close()
            except Exception as err:
                errors.append(err)
        return errors


class StoreOpener:
    """Opens the stores of one task into ``state``: each store's checks, its committed
    offset, its restore and the layered view the task sees.

    ``evidence``: no checkpoint was found, but this machine shows that the task committed:
    what it shows (a store with an empty changelog is then an error, :meth:`_lost_error`).
    ``register`` tells after opening whether a checkpoint must be written at open (new
    stores, a recovery, a changed config); ``last_restore`` how each restore went."""

    def __init__(self, state: TaskState, systems: ChangelogSystems, recovery: Recovery,
                 listener: RestoreListener | None, evidence: list[str]) -> None:
        self._state = state
        self._systems = systems
        self._recovery = recovery
        self._listener = listener
        self._evidence = evidence
        self.register = bool(recovery)
        self.last_restore: dict[str, RestoreProgress] = {}

    def _lost_error(self, store: str) -> CorruptionError:
        """No checkpoint, the changelog of ``store`` empty, and evidence of a commit found."""
        config, partition = self._state.config, self._state.partition
        home = self._systems.get(config.checkpoint_system).describe()
        stores = " ".join(f"--reset {n}" for n in config.stores)
        return CorruptionError(
            f"task {self._state.job}/partition {partition}: no checkpoint in {home} and store {store!r} has an "
            f"empty changelog, but this machine holds evidence that the task committed there: "
            f"{'; '.join(self._evidence)}. Its checkpoints and changelogs are gone (topics deleted, the cluster "
            "wiped or replaced, bootstrap servers pointing at an empty cluster, the log directory or bucket "
            "prefix deleted), or the config points at the wrong place. Nothing was changed, local files "
            "included. Point the config at the place that holds them, or restore them from a backup; to start "
            f"the task over, empty, on purpose: `localstate restore -c CONFIG -p {partition} {stores}`."
        )

    def _check_meta(self, spec: StoreSpec, directory: Path) -> None:
        """A store whose engine or serdes changed since its last commit is an error
        (its records would be misread), unless the operator accepted the change."""
        meta = store_meta(spec)
        before = self._state.meta.get(spec.name)
        if before == meta:
            return
        format_change = _value_format_change(spec, before, meta)
        if format_change is not None and spec.name not in self._recovery.reset:
            raise ConfigError(format_change)  # --accept-config-change cannot help: records differ
        self.register = True
        self._state.meta[spec.name] = meta
        changed = {k: (before[k], v) for k, v in meta.items() if before is not None and k in before and before[k] != v}
        if not changed:
            return  # new store, or a checkpoint from before a key was recorded
        if spec.name in self._recovery.accept_config_change or spec.name in self._recovery.reset:
            log.warning("store %r: %s changed since its last commit (accepted); rebuilding its local copy",
                        spec.name, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
            shutil.rmtree(directory, ignore_errors=True)
            return
        raise ConfigError(
            f"store {spec.name!r} of task {self._state.job}/partition {self._state.partition} was committed with "
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
        name, rec, offsets, partition = spec.name, self._recovery, self._state.offsets, self._state.partition
        committed = offsets.get(name)
        if name in rec.reset:
            end = changelog.reset()
            log.warning("store %r partition %d: state reset as asked (changelog emptied up to offset %d)",
                        name, partition, end)
            offsets[name] = end
            return end
        end = changelog.end_offset()
        if name in rec.accept_log_end:
            log.warning("store %r partition %d: the changelog's readable end (offset %d) taken as committed "
                        "as asked (checkpoint said %s)", name, partition, end, committed)
            offsets[name] = end
            return end
        if committed is None:
            if end:
                raise CorruptionError(
                    f"store {name!r} of task {self._state.job}/partition {partition}: its changelog "
                    f"({changelog.describe()}) holds records up to offset {end}, but no checkpoint names the "
                    "store (the checkpoint was deleted, or the store's changelog stream is shared with "
                    "another store or job). Nothing was changed. If these records are the store's committed "
                    f"state, run `localstate restore --accept-log-end {name}`; to start the store empty, "
                    f"`localstate restore --reset {name}`."
                )
            offsets[name] = 0
            self.register = True
            return 0
        if committed > end:
            raise changelog.missing_committed(committed)
        return committed

    def open(self, spec: StoreSpec) -> None:
        """Check, restore and open store ``spec`` into the task's state."""
        state = self._state
        config, partition = state.config, state.partition
        directory = store_dir(config, spec.name, partition)
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
            changelog = self._systems.get(system).open_partition(stream, partition, config.partitions)
            if self._evidence and changelog.end_offset() == 0:  # before the engine touches its local copy
                changelog.close()
                raise self._lost_error(spec.name)
            logger: ChangeLogger = ChangeLogger(spec.name, changelog, spec.write_batch_size, metrics)
        else:
            logger = NullChangeLogger(spec.name, metrics)
        key_serde = checked_serde(get_serde(spec.key_serde, store=spec.name))
        msg_serde = checked_serde(get_serde(spec.msg_serde, store=spec.name))
        context = StoreContext(
            job=state.job,
            store=spec.name,
            partition=partition,
            partitions=config.partitions,
            directory=directory,
            change_logger=logger,
            metrics=metrics,
            key_serde=key_serde,
            msg_serde=msg_serde,
        )
        factory = resolve_factory(spec.factory, store=spec.name)
        committed: int | None = None
        identity: str | None = None
        try:
            if changelog is not None:
                committed = self._committed_offset(spec, changelog)
                identity = log_identity(self._systems.get(spec.changelog[0]), changelog)  # type: ignore[index]
                claim_local_copy(directory, identity, spec.name)
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
        state.stores[spec.name] = entry
        if changelog is not None:
            assert committed is not None and identity is not None
            self._restore(entry, committed)
            with engine_phase(spec, "current"):
                changelog.discard_tail(committed, engine.current)
            after = log_identity(self._systems.get(spec.changelog[0]), changelog)  # type: ignore[index]
            if after != identity:  # a cut tail: the copy restored to C is a prefix of the new log
                tag_local_copy(directory, after, spec.name)
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
                clock=ttl_clock(spec.ttl, lambda: state.event_time),
            )

    def _restore(self, entry: _OpenStore, committed: int) -> RestoreProgress:
        changelog = entry.changelog
        assert changelog is not None
        name = entry.spec.name
        start, _ = restore_start(entry.spec, entry.engine, changelog, committed)
        listener, partition = self._listener, self._state.partition
        t0 = time.perf_counter()
        state = {"records": 0, "bytes": 0, "last": t0}

        def progress(done: bool) -> RestoreProgress:
            return RestoreProgress(
                name, partition, state["records"], state["bytes"],
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
                name, partition, final.records, final.bytes, start, committed, final.seconds,
            )
        return final
