"""Read a task's committed state from outside the job: :class:`StateReader`.

A state query (Kafka Streams' interactive queries, Flink's State Processor API,
Spark's ``statestore`` data source) wants the state **as of a commit**, while the job
keeps running. The task's local copy is the wrong place to read it: it holds writes
made since the last commit, and the engine (RocksDB) takes the writer's lock. The
committed state is defined by the task checkpoint and the changelog: the prefix
``[0, C)`` of the store's changelog, ``C`` being the offset the checkpoint names. So
the reader

* reads the checkpoint (files are replaced by rename, so it is always whole),
* replays the changelog ``[0, C)`` through a read-only changelog reader into an
  in-memory map (a ``memory`` engine) — it takes no lock, creates no file and never
  writes: not the state dir, not the changelog, not the checkpoints;
* after the replay, checks the checkpoint again: the task's compaction only keeps
  the latest commit and the one before it reconstructible (docs/design/protocol.md), so the read
  was exact if the task has committed at most once more meanwhile and has not rolled
  back. Otherwise it reads again from the newer checkpoint (a few times, then an
  error that says the writer commits faster than the store can be read).

Key-value stores come back as read-only :class:`KeyValueStore` views with the job's
serdes (writes raise :class:`ReadOnlyStoreError`); other engines (top-N, sketches,
search) are rebuilt in a temporary directory removed on :meth:`StateReader.close`
and returned with their own API — writes to them change only that throw-away copy.
The whole store is held in memory: the cost of a state query is a full replay.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .changelogger import NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .engine import ChangeRecord, StorageEngine, StoreContext, StoreSpec
from .errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    InvalidValueError,
    LocalStateError,
    StoreClosedError,
)
from .kv import KeyValueStore
from .layers import build_store
from .layers.readonly import ReadOnlyStore
from .layers.ttl import ttl_clock, ttl_serde
from .metrics import StoreMetrics
from .registry import did_you_mean, resolve_factory
from .rescale_copies import check_layout
from .serdes import describe_encode_error, get_serde
from .store_open import open_system, task_partition
from .typed import check_store_types

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogSystem, CheckpointStore

__all__ = ["StateReader", "read_committed", "sample_committed", "read_checkpoint_readonly", "still_exact"]

log = logging.getLogger("localstate")

K = TypeVar("K")
V = TypeVar("V")

READ_ATTEMPTS = 5
"""How many newer checkpoints a store read follows before giving up (see module doc)."""


def read_checkpoint_readonly(store: CheckpointStore, job: str, partition: int) -> Checkpoint | None:
    """The task's latest checkpoint as a reader must read it: without fencing the running
    task and without creating anything
    (:meth:`~localstate.changelog.base.CheckpointStore.read_readonly`)."""
    return store.read_readonly(job, partition)


def still_exact(read: Checkpoint, latest: Checkpoint, name: str) -> bool:
    """Whether store ``name``'s changelog records up to ``read``'s offset, read while the
    task went on to ``latest``, were all still there: the task's compaction keeps the latest
    commit and the one before it reconstructible (docs/design/protocol.md), so the read
    was exact if the task committed at most once more meanwhile and did not roll back."""
    return (read.version <= latest.version <= read.version + 1
            and latest.offsets.get(name, -1) >= read.offsets[name])


class StateReader:
    """The committed state of task ``partition`` of ``config``'s job, read-only.

    Usable beside the running job (no lock, no writes). Stores are loaded on first
    use, each as of the latest commit when it is loaded (:attr:`loaded_versions`
    says which). A context manager; ``close()`` is idempotent.

    >>> with StateReader(config, partition=0) as reader:     # doctest: +SKIP
    ...     counts = reader.store("counts", str, int)
    ...     counts.get("page-1")
    """

    def __init__(self, config: Config, partition: int = 0, *, in_memory: bool = True) -> None:
        """``in_memory=False`` rebuilds key-value stores with their own engine (RocksDB,
        LevelDB) in a temporary directory instead of a memory map: for states larger than
        memory, at the cost of the engine's write path."""
        if not isinstance(config, Config):
            raise TypeError(f"StateReader needs a localstate.Config, got {type(config).__name__}")
        partition = task_partition(partition)
        if not 0 <= partition < config.partitions:
            raise LocalStateError(f"partition {partition} is out of range: job.partitions = {config.partitions}")
        self.config = config
        self.partition = partition
        self.job = config.job_name
        self._systems: dict[str, ChangelogSystem] = {}
        self._views: dict[str, Any] = {}
        self._engines: list[StorageEngine] = []
        self._scratch: Path | None = None
        self._closed = False
        self.in_memory = in_memory
        self.loaded_versions: dict[str, int] = {}
        """Per loaded store: the commit version its state is from."""

    # -- checkpoints and changelogs ------------------------------------------------------------
    def _system(self, name: str) -> ChangelogSystem:
        system = self._systems.get(name)
        if system is None:
            system = self._systems[name] = open_system(self.config, name)
            check_layout(self.config, system)
        return system

    def _where(self) -> str:
        return self._system(self.config.checkpoint_system).describe()

    @property
    def checkpoint(self) -> Checkpoint:
        """The task's latest committed checkpoint, read afresh at each access (the job may
        have committed since); an error if it has none. A property, as
        :attr:`TaskStorage.checkpoint <localstate.TaskStorage.checkpoint>` is (which is
        ``None`` before the first commit: a reader has nothing to read then)."""
        self._check_open()
        ckpt = read_checkpoint_readonly(self._system(self.config.checkpoint_system).checkpoints(), self.job,
                                        self.partition)
        if ckpt is None or not ckpt.committed:
            raise LocalStateError(
                f"task {self.job}/partition {self.partition} has no committed state in {self._where()}: "
                "the job has not committed yet, or job.name / the checkpoint system point elsewhere"
            )
        return _CalledCheckpoint.of(ckpt)

    def _spec(self, name: str) -> StoreSpec:
        spec = self.config.stores.get(name)
        if spec is None:
            raise LocalStateError(
                f"no store named {name!r} in job {self.job!r}.{did_you_mean(name, self.config.stores)}"
            )
        if spec.changelog is None:
            raise ConfigError(
                f"store {name!r} has no changelog (stores.{name}.changelog is not set): its state lives only "
                "in the running task's local copy, so it cannot be read from outside the task"
            )
        return spec

    def _committed_offset(self, spec: StoreSpec, ckpt: Checkpoint) -> int:
        offset = ckpt.offsets.get(spec.name)
        if offset is None:
            raise LocalStateError(
                f"store {spec.name!r} of task {self.job}/partition {self.partition} has no committed offset in "
                f"checkpoint version {ckpt.version} ({self._where()}): it was added after the last commit"
            )
        return offset

    def _replay(self, spec: StoreSpec, committed: int, consume: Callable[[Iterator[ChangeRecord]], None]) -> None:
        """Hand the change records ``[0, committed)`` of ``spec``'s changelog to ``consume``."""
        assert spec.changelog is not None
        system, stream = spec.changelog
        part = self._system(system).open_partition(stream, self.partition, self.config.partitions, readonly=True)
        try:
            end = part.end_offset()
            if committed > end:
                raise part.missing_committed(committed)
            consume(r for batch, _ in part.read_batches(0, committed) for r in batch)
        finally:
            part.close()

    def _exactly(self, spec: StoreSpec, read: Callable[[int], None]) -> Checkpoint:
        """Run ``read(committed offset)`` until it ran against a commit that stayed
        reconstructible while it ran (see the module docstring); the checkpoint it read."""
        ckpt = self.checkpoint
        for attempt in range(READ_ATTEMPTS):
            try:
                read(self._committed_offset(spec, ckpt))
            except (CorruptionError, ChangelogError) as e:
                # The task's compaction replaces closed segments (by rename) while they are
                # read: a fresh open sees a consistent set. Damage that stays is re-raised.
                if attempt == READ_ATTEMPTS - 1:
                    raise
                log.info("store %r: changelog changed under the reader (%s); reading again", spec.name, e)
                ckpt = self.checkpoint
                continue
            newer = self._stable(spec.name, ckpt)
            if newer is None:
                return ckpt
            log.info("store %r: task %s/partition %d committed (or rolled back) while it was read; reading "
                     "again at version %d", spec.name, self.job, self.partition, newer.version)
            ckpt = newer
        raise LocalStateError(
            f"store {spec.name!r} of task {self.job}/partition {self.partition}: the task committed more "
            f"than once during each of {READ_ATTEMPTS} reads of the store, so no read was exact; try again "
            "(or read while the job commits less often)"
        )

    def _stable(self, name: str, read: Checkpoint) -> Checkpoint | None:
        """None if the state read for ``read`` is exact, else the newer checkpoint to read."""
        latest = self.checkpoint
        return None if still_exact(read, latest, name) else latest

    # -- building stores ---------------------------------------------------------------------
    def _new_engine(self, spec: StoreSpec) -> StorageEngine:
        """An empty engine to replay into: ``memory`` for key-value stores (their change
        records are their pairs) unless ``in_memory`` is off, else the store's own engine
        over a throw-away directory."""
        from localstate.engines.memory import MemoryEngine

        factory = resolve_factory(spec.factory, store=spec.name)
        if self.in_memory and _creates_kv(factory):
            return MemoryEngine()
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"localstate-reader-{self.job}-"))
        directory = self._scratch / spec.name
        directory.mkdir(parents=True, exist_ok=True)
        metrics = StoreMetrics()
        context = StoreContext(
            job=self.job, store=spec.name, partition=self.partition, partitions=self.config.partitions,
            directory=directory, change_logger=NullChangeLogger(spec.name, metrics), metrics=metrics,
            key_serde=get_serde(spec.key_serde, store=spec.name), msg_serde=get_serde(spec.msg_serde, store=spec.name),
        )
        engine = factory.create(spec, context)
        if self.in_memory and isinstance(engine, KeyValueStore):  # a plug-in that did not declare its type
            engine.close()
            shutil.rmtree(directory, ignore_errors=True)
            return MemoryEngine()
        return engine

    def _load(self, spec: StoreSpec) -> Any:
        engines: list[StorageEngine] = []

        def read(committed: int) -> None:
            while engines:  # an earlier attempt's state: superseded
                engines.pop().close()
            engine = self._new_engine(spec)
            engines.append(engine)
            # an empty directory: the engine finds no snapshot and starts empty (0)
            if engine.prepare_restore(committed, committed) != 0:
                raise LocalStateError(f"store {spec.name!r}: a new engine in {self._scratch} was not empty")
            self._replay(spec, committed, lambda records: engine.restore(records, into_empty=True))

        try:
            ckpt = self._exactly(spec, read)
        except BaseException:
            for engine in engines:
                engine.close()
            raise
        engine = engines[0]
        self._engines.append(engine)
        self.loaded_versions[spec.name] = ckpt.version
        if isinstance(engine, KeyValueStore):
            view = build_store(
                engine, name=spec.name, key_serde=get_serde(spec.key_serde, store=spec.name),
                msg_serde=get_serde(spec.msg_serde, store=spec.name), metered=False,
                ttl=spec.ttl, clock=_ttl_clock(spec, ckpt),  # expired entries stay invisible
            )
            return ReadOnlyStore(view, f"the committed state of task {self.job}/partition {self.partition}")
        return engine

    # -- public API ----------------------------------------------------------------------------
    @overload
    def store(self, name: str) -> Any: ...
    @overload
    def store(self, name: str, key_type: type[K], value_type: type[V]) -> KeyValueStore[K, V]: ...

    def store(self, name: str, key_type: type | None = None, value_type: type | None = None) -> Any:
        """Store ``name`` as of the latest commit (loaded on first use, then kept).

        A read-only :class:`KeyValueStore` for key-value engines (with types: checked
        like :meth:`TaskStorage.store <localstate.TaskStorage.store>`); the rebuilt
        engine for the others. Errors: an unknown store, a store without a changelog,
        a task that never committed."""
        self._check_open()
        spec = self._spec(name)
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self._load(spec)
        return check_store_types(
            name, view, get_serde(spec.key_serde), get_serde(spec.msg_serde), key_type, value_type
        )

    def get(self, name: str, key: Any) -> Any:
        """The committed value of ``key`` in key-value store ``name`` (``None``: absent),
        found by one pass over the committed changelog without building the store in
        memory (a store already loaded by :meth:`store` is asked instead)."""
        self._check_open()
        spec = self._spec(name)
        if name in self._views:
            return self._views[name].get(key)
        if not _creates_kv(resolve_factory(spec.factory, store=name)):
            raise ConfigError(f"store {name!r} uses engine {spec.factory!r}, not a key-value engine: use store({name!r})")
        key_serde = get_serde(spec.key_serde, store=name)
        if key is None:
            raise InvalidValueError(f"store {name!r}: None is not a valid key")
        try:
            wanted = key_serde.encode(key)
        except Exception as e:
            raise describe_encode_error(name, "key", key_serde, key, e) from e
        found: list[bytes | None] = [None]

        def scan(records: Iterator[ChangeRecord]) -> None:
            found[0] = None
            for k, v in records:
                if k == wanted:
                    found[0] = v

        def read(committed: int) -> None:
            self._replay(spec, committed, scan)

        ckpt = self._exactly(spec, read)
        self.loaded_versions[name] = ckpt.version
        raw = found[0]
        return None if raw is None else _live_value(spec, ckpt, raw)

    @property
    def stores(self) -> list[str]:
        """The stores that can be read (those with a changelog)."""
        return [n for n, s in self.config.stores.items() if s.changelog is not None]

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"StateReader of {self.job}/partition {self.partition} is closed")

    def close(self) -> None:
        """Drop the loaded stores and the scratch directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        for view in self._views.values():
            if isinstance(view, KeyValueStore):
                view.close()
        for engine in self._engines:
            engine.close()
        for system in self._systems.values():
            system.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateReader(job={self.job!r}, partition={self.partition}, loaded={sorted(self._views)})"


class _CalledCheckpoint(Checkpoint):
    """The :class:`Checkpoint` :attr:`StateReader.checkpoint` returns: also callable, returning
    itself with a :class:`DeprecationWarning`, for code written when it was a method
    (``reader.checkpoint()``). Equal to the plain checkpoint with the same fields."""

    @classmethod
    def of(cls, ckpt: Checkpoint) -> _CalledCheckpoint:
        return cls(**{f.name: getattr(ckpt, f.name) for f in dataclasses.fields(Checkpoint)})

    def __call__(self) -> Checkpoint:
        warnings.warn("StateReader.checkpoint is a property: drop the call parentheses", DeprecationWarning,
                      stacklevel=2)
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(Checkpoint))

    __hash__ = Checkpoint.__hash__

    def __repr__(self) -> str:
        return "Checkpoint" + Checkpoint.__repr__(self).removeprefix(type(self).__qualname__)


def _creates_kv(factory: Any) -> bool:
    """Whether ``factory.create`` is declared to return a key-value engine."""
    import typing

    try:
        ret = typing.get_type_hints(type(factory).create).get("return")
    except Exception:  # an annotation that does not resolve: find out by creating one
        return False
    return isinstance(ret, type) and issubclass(ret, KeyValueStore)


def read_committed(
    config: Config, store: str, partitions: Iterable[int] | None = None, *, in_memory: bool = True
) -> Iterator[tuple[int, Any, Any]]:
    """``(partition, key, value)`` of ``store``'s committed state, partition by partition
    (``partitions``: all by default), keys ascending within a partition. Each
    partition is read by its own :class:`StateReader` (``in_memory`` as there) and
    released before the next."""
    parts = range(config.partitions) if partitions is None else partitions
    for p in parts:
        with StateReader(config, p, in_memory=in_memory) as reader:
            view = reader.store(store)
            if not isinstance(view, KeyValueStore):
                raise ConfigError(
                    f"store {store!r} uses engine {config.stores[store].factory!r}, not a key-value engine: "
                    "read it with StateReader(config, p).store(name) and its own API"
                )
            with view.all() as it:
                for k, v in it:
                    yield p, k, v


def _ttl_clock(spec: StoreSpec, ckpt: Checkpoint) -> Callable[[], int | None]:
    """"Now" (ns) for a TTL store read as of ``ckpt``: the task's own clock rule
    (:func:`~localstate.layers.ttl.ttl_clock`) over the event time committed with the
    checkpoint, so a reader hides exactly what the task hides."""
    return ttl_clock(spec.ttl, lambda: ckpt.event_time)


def _live_value(spec: StoreSpec, ckpt: Checkpoint, raw: bytes) -> Any:
    """The decoded value of a committed change record; ``None`` when a TTL store's
    entry has expired (the same rule as :class:`~localstate.layers.TtlStore`: expired
    from the moment ``now >= expiry``)."""
    msg_serde = get_serde(spec.msg_serde, store=spec.name)
    if spec.ttl is None:
        return msg_serde.decode(raw)
    expiry, value = ttl_serde(msg_serde).decode(raw)
    now = _ttl_clock(spec, ckpt)()
    return value if now is None or expiry > now else None


def sample_committed(config: Config, store: str, limit: int = 100) -> list[tuple[Any, Any]]:
    """Up to ``limit`` decoded ``(key, value)`` pairs from the start of ``store``'s
    committed changelog (partition by partition), without building any state: what a
    schema inference needs. Tombstones are skipped; a pair may be superseded later."""
    with StateReader(config, 0) as reader:
        spec = reader._spec(store)
    key_serde = get_serde(spec.key_serde, store=store)
    assert spec.changelog is not None
    system_name, stream = spec.changelog
    out: list[tuple[Any, Any]] = []
    for p in range(config.partitions):
        with StateReader(config, p) as reader:
            try:
                ckpt = reader.checkpoint
                committed = reader._committed_offset(spec, ckpt)
            except LocalStateError:
                continue
            part = reader._system(system_name).open_partition(stream, p, config.partitions, readonly=True)
            try:
                for batch, _ in part.read_batches(0, committed):
                    for k, v in batch:
                        value = None if v is None else _live_value(spec, ckpt, v)
                        if value is not None:
                            out.append((key_serde.decode(k), value))
                            if len(out) >= limit:
                                return out
            finally:
                part.close()
    return out
