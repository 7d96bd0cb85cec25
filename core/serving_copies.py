"""The follower copies a state server (:mod:`localstate.serving`) answers from: each task's
copy built as the task's own open builds one, advanced commit by commit from the
changelog (read outside the copy's lock, applied as one batch under it), and dropped and
rebuilt when it can no longer be trusted. docs/serving.md states the rules."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .changelogger import NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .engine import ChangeRecord, StorageEngine, StoreContext, StoreSpec
from .errors import LocalStateError
from .kv import KeyValueStore
from .layers import build_store
from .layers.readonly import ReadOnlyStore
from .layers.ttl import ttl_clock
from .layout import store_dir
from .locking import io_error, remove_tree
from .metrics import StoreMetrics
from .reader import READ_ATTEMPTS, read_checkpoint_readonly, still_exact
from .registry import resolve_factory
from .rescale_copies import check_layout, claim_local_copy, log_identity
from .serdes import get_serde
from .serving_answers import BUILDING, FAILED, NOTHING_COMMITTED, SERVING
from .standby import _skip_reason
from .store_open import engine_phase, open_system, restore_start

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogSystem

__all__ = ["FollowerCopies", "TaskCopy", "StoreCopy", "Rebuild"]

log = logging.getLogger("localstate")


@dataclass
class StoreCopy:
    """One store's copy: its engine, the read-only view answers come from, the changelog
    offset it equals and the identity of the log it was built from."""

    spec: StoreSpec
    engine: StorageEngine
    view: KeyValueStore[Any, Any]
    offset: int
    identity: str


class Rebuild(Exception):
    """The copy cannot be advanced to the new commit; build it again (reason in args)."""


class TaskCopy:
    """The follower copy of one task: the stores, the commit they equal, and the lock that
    makes an apply and a read exclusive."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.lock = threading.Lock()
        self.stores: dict[str, StoreCopy] = {}
        self.skipped: dict[str, str] = {}
        self.ckpt: Checkpoint | None = None
        self.status = BUILDING
        self.error: str | None = None
        self.damaged = False
        """Set by a read that got an engine error: the refresher deletes and rebuilds the copy."""
        self.failures = 0
        self.retry_at = 0.0


class FollowerCopies:
    """The follower copies of a server's tasks, kept in ``copies_config``'s state dir: one
    :class:`TaskCopy` per task, brought to the task's newest commit by :meth:`refresh`.
    The changelog systems it opens are checked against the job's layout and kept open
    until :meth:`close_systems`."""

    def __init__(self, config: Config, copies_config: Config, specs: Mapping[str, StoreSpec],
                 tasks: tuple[int, ...]) -> None:
        self.config = config
        self.job = config.job_name
        self.copies_config = copies_config
        self.specs = specs
        self.copies = {p: TaskCopy(p) for p in tasks}
        self._systems: dict[str, ChangelogSystem] = {}

    def _system(self, name: str) -> ChangelogSystem:
        if name not in self._systems:
            self._systems[name] = open_system(self.config, name)
            check_layout(self.config, self._systems[name])
        return self._systems[name]

    def close_systems(self) -> None:
        """Forget the open changelog systems: the next use opens them again and checks the
        job's layout (:func:`~localstate.rescale_copies.check_layout`) against the config."""
        systems, self._systems = self._systems, {}
        for system in systems.values():
            try:
                system.close()
            except Exception as e:  # a system that fails to close is dropped all the same
                log.warning("state server of job %r: closing %s failed: %s", self.job, system.name, e)

    def _latest(self, p: int) -> Checkpoint | None:
        return read_checkpoint_readonly(self._system(self.config.checkpoint_system).checkpoints(), self.job, p)

    def refresh(self, copy: TaskCopy) -> None:
        """Bring ``copy`` to its task's newest commit: advance it, or (when it cannot be
        trusted to advance) drop and build it again; :class:`Rebuild` when the build itself
        found the copy behind a moving or changed log."""
        if copy.damaged:
            with copy.lock:
                self.drop(copy, wipe=True)
        ckpt = self._latest(copy.partition)
        if ckpt is None or not ckpt.committed:
            with copy.lock:
                self.drop(copy)
                copy.status, copy.error = NOTHING_COMMITTED, None
            return
        if copy.ckpt is not None and copy.status == SERVING:
            if copy.ckpt == ckpt:
                return
            try:
                self._advance(copy, ckpt)
                return
            except Rebuild as why:
                log.info("task %d of job %r: its copy is rebuilt (%s)", copy.partition, self.job, why)
                self.close_systems()
        with copy.lock:
            self.drop(copy)
            copy.status = BUILDING
        self._build(copy, ckpt)

    def drop(self, copy: TaskCopy, *, wipe: bool = False) -> None:
        """Under ``copy.lock``: stop serving the copy and close its engines; ``wipe`` also
        deletes its files (a damaged copy is rebuilt from the changelog)."""
        stores, copy.stores, copy.ckpt = copy.stores, {}, None
        copy.status = BUILDING
        for sc in stores.values():
            try:
                with engine_phase(sc.spec, "close"):
                    sc.engine.close()
            except LocalStateError as e:
                log.warning("task %d of job %r: %s", copy.partition, self.job, e)
        if wipe:
            for name in self.specs:
                directory = store_dir(self.copies_config, name, copy.partition)
                try:
                    remove_tree(directory)
                except OSError as e:
                    raise io_error(e, "delete the damaged copy in", directory, LocalStateError) from e
            copy.damaged = False

    def _open_changelog(self, spec: StoreSpec, p: int) -> tuple[Any, str]:
        assert spec.changelog is not None
        system_name, stream = spec.changelog
        system = self._system(system_name)
        part = system.open_partition(stream, p, self.config.partitions, readonly=True)
        return part, log_identity(system, part)

    def _build(self, copy: TaskCopy, ckpt: Checkpoint) -> None:
        """Build every store's copy at ``ckpt`` (from the local copy an earlier run left, if
        the engine keeps it), catch up until the read was exact, persist and publish."""
        p = copy.partition
        built: dict[str, StoreCopy] = {}
        skipped: dict[str, str] = {}
        try:
            for name, spec in self.specs.items():
                reason = _skip_reason(spec, ckpt)
                if reason is not None:
                    skipped[name] = reason
                    continue
                built[name] = self._build_store(spec, p, ckpt)

            def apply(name: str) -> Callable[[list[ChangeRecord]], None]:
                engine = built[name].engine
                return lambda batch: engine.restore(batch)

            settled = self._settle(p, ckpt, built, apply)
            if settled is None:
                # records of the range may have been compacted away while they were read: the
                # copies are closed unpersisted (the engine drops what it applied) and built again
                raise Rebuild(f"the task committed faster than its copy could be built (version {ckpt.version})")
            for sc in built.values():
                sc.offset = settled.offsets[sc.spec.name]
                with engine_phase(sc.spec, "persist"):
                    sc.engine.persist(sc.offset)
        except BaseException:
            for sc in built.values():
                try:
                    sc.engine.close()
                except Exception as e:  # the error that got here is the one to report
                    log.warning("store %r of task %d: close failed: %s", sc.spec.name, p, e)
            raise
        with copy.lock:
            copy.stores, copy.skipped, copy.ckpt = built, skipped, settled
            copy.status, copy.error = SERVING, None

    def _build_store(self, spec: StoreSpec, p: int, ckpt: Checkpoint) -> StoreCopy:
        committed = ckpt.offsets[spec.name]
        part, identity = self._open_changelog(spec, p)
        try:
            if committed > part.end_offset():
                raise part.missing_committed(committed)
            directory = store_dir(self.copies_config, spec.name, p)
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create store directory", directory, LocalStateError) from e
            claim_local_copy(directory, identity, spec.name)
            metrics = StoreMetrics()
            key_serde = get_serde(spec.key_serde, store=spec.name)
            msg_serde = get_serde(spec.msg_serde, store=spec.name)
            context = StoreContext(
                job=self.job, store=spec.name, partition=p, partitions=self.config.partitions, directory=directory,
                change_logger=NullChangeLogger(spec.name, metrics), metrics=metrics, key_serde=key_serde,
                msg_serde=msg_serde, logged=True,
            )
            with engine_phase(spec, "create"):
                engine = resolve_factory(spec.factory, store=spec.name).create(spec, context)
            try:
                start, _fetched = restore_start(spec, engine, part, committed)
                if start < committed:
                    records = (r for batch, _ in part.read_batches(start, committed) for r in batch)
                    with engine_phase(spec, "restore"):
                        engine.restore(records, into_empty=start == 0)
            except BaseException:
                engine.close()
                raise
        finally:
            part.close()
        copy = self.copies[p]
        clock = ttl_clock(spec.ttl, lambda: None if copy.ckpt is None else copy.ckpt.event_time)
        assert isinstance(engine, KeyValueStore)
        view = build_store(engine, name=spec.name, key_serde=key_serde, msg_serde=msg_serde, metered=False,
                           ttl=spec.ttl, clock=clock)
        view = ReadOnlyStore(view, f"a served copy of task {self.job}/partition {p}")
        return StoreCopy(spec, engine, view, committed, identity)

    def _settle(self, p: int, ckpt: Checkpoint, stores: Mapping[str, StoreCopy],
                sink: Callable[[str], Callable[[list[ChangeRecord]], None]]) -> Checkpoint | None:
        """Hand each store's records from its copy's offset up to ``ckpt``'s to ``sink(name)``,
        then check the read was exact (:func:`~localstate.reader.still_exact`); if the task
        committed more than once meanwhile, read on to its newest commit and check again.
        The checkpoint the records now reach, or None when the task kept committing faster
        than the records could be read (the next pass tries again)."""
        at = {name: sc.offset for name, sc in stores.items()}
        opened: dict[str, Any] = {}
        """Per store, the changelog partition opened in this pass: opening one (a file log
        reads its active segment) is most of a pass's cost, and a partition opened for one
        commit often already holds the next ones (the task flushes before it commits)."""
        try:
            for _ in range(READ_ATTEMPTS):
                for name, sc in stores.items():
                    if _skip_reason(sc.spec, ckpt) is not None:
                        raise Rebuild(f"store {name!r} changed its configuration at version {ckpt.version}")
                    target = ckpt.offsets[name]
                    if target < at[name]:
                        raise Rebuild(f"store {name!r}'s committed offset went back from {at[name]} to {target}")
                    # even with no new record: a rolled-back commit re-done on a cut log reuses offsets
                    part = opened.get(name)
                    if part is None or target > part.end_offset():
                        if part is not None:
                            part.close()
                        part = opened[name] = self._open_checked(sc, p)
                    self._read_records(sc, part, at[name], target, sink(name))
                    at[name] = target
                latest = self._latest(p)
                if latest is None or latest.version < ckpt.version:
                    raise Rebuild(f"the task went back from version {ckpt.version}")
                if all(still_exact(ckpt, latest, n) for n in stores):
                    return ckpt
                ckpt = latest
            return None
        finally:
            for part in opened.values():
                part.close()

    def _open_checked(self, sc: StoreCopy, p: int) -> Any:
        """The store's changelog partition, read-only, if it is the log the copy was built
        from (another log: :class:`Rebuild`)."""
        part, identity = self._open_changelog(sc.spec, p)
        if identity != sc.identity:
            part.close()
            raise Rebuild(f"store {sc.spec.name!r}'s changelog is another log now ({identity}, was {sc.identity})")
        return part

    @staticmethod
    def _read_records(sc: StoreCopy, part: Any, start: int, stop: int,
                      sink: Callable[[list[ChangeRecord]], None]) -> None:
        """Hand the store's change records ``[start, stop)`` to ``sink``, batch by batch."""
        if stop > part.end_offset():
            raise part.missing_committed(stop)
        if start < stop:
            for batch, _ in part.read_batches(start, stop):
                sink(batch)
        if start and part.min_valid_snapshot_offset() > start:
            raise Rebuild(f"store {sc.spec.name!r}'s changelog was compacted past the copy's offset {start}")

    def _advance(self, copy: TaskCopy, ckpt: Checkpoint) -> None:
        """Read each store's records ``[C_old, C_new)`` into memory (last one per key), until
        the read was exact, then apply them all under the copy's lock: readers see the old
        commit or the new one, never a mix."""
        old = copy.ckpt
        assert old is not None
        if ckpt.version < old.version:
            raise Rebuild(f"the task went back from version {old.version} to {ckpt.version}")
        deltas: dict[str, dict[bytes, bytes | None]] = {name: {} for name in copy.stores}
        settled = self._settle(copy.partition, ckpt, copy.stores, lambda name: deltas[name].update)
        if settled is None:
            return
        with copy.lock:
            if copy.ckpt is not old:  # dropped meanwhile (a damaged read): the next pass rebuilds
                return
            try:
                for name, delta in deltas.items():
                    sc = copy.stores[name]
                    puts = [(k, v) for k, v in delta.items() if v is not None]
                    deletes = [k for k, v in delta.items() if v is None]
                    with engine_phase(sc.spec, "apply"):
                        engine: Any = sc.engine
                        if puts:
                            engine.put_all(puts)
                        if deletes:
                            engine.delete_all(deletes)
                        engine.persist(settled.offsets[name])
            except BaseException:
                copy.damaged = True  # half applied: never served; deleted and rebuilt
                copy.status = FAILED
                raise
            for name, sc in copy.stores.items():
                sc.offset = settled.offsets[name]
            copy.ckpt = settled

