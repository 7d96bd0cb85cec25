"""The storage-engine plug-in interface.

An engine keeps one store's state for one task partition. Whatever its data model,
its durable state is a set of **change records** ``(key: bytes, value: bytes | None)``
(``None`` is a tombstone). Mutations are reported to the store's
:class:`~localstate.changelogger.ChangeLogger`; :meth:`StorageEngine.restore` rebuilds
the engine from the same records. No engine talks to a changelog backend directly.

Key-value engines additionally implement :class:`~localstate.kv.KeyValueStore` over
``bytes``; they do **not** log themselves — the ``logged`` layer does it for them.
Every other engine logs its own change records through ``context.change_logger``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import EngineError
from .kv import KeyValueStore
from .records import ChangeRecord

if TYPE_CHECKING:
    from .changelogger import ChangeLogger
    from .metrics import StoreMetrics
    from .serdes import Serde

__all__ = [
    "ChangeRecord",
    "StorageEngine",
    "KeyValueEngine",
    "StorageEngineFactory",
    "StoreSpec",
    "StoreContext",
]



class StorageEngine(ABC):
    """What every engine implements, key-value or not.

    Lifecycle, as driven by :class:`~localstate.TaskStorage`:

    1. the factory builds the engine over ``context.directory``;
    2. ``prepare_restore(C, min_valid)`` picks the local state to start from and
       returns its changelog offset ``L`` (``0`` = start empty);
    3. ``restore(records, into_empty=...)`` applies the records ``[L, C)`` in bulk;
    4. after a restore, and at each commit once the changelog is durable,
       ``persist(offset)`` (``flush()`` + ``checkpoint(offset)``); mutations report
       change records; at each commit ``prepare_commit()`` first hands buffered
       records to the logger;
    5. ``close()`` — idempotent, never commits.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> StorageEngine:
        missing = getattr(cls, "__abstractmethods__", None)
        if missing:
            raise EngineError(
                f"engine class {cls.__module__}.{cls.__qualname__} does not implement "
                f"{', '.join(sorted(missing))}; every StorageEngine defines restore(), current(), "
                "flush() and close() (key-value engines also the KeyValueStore methods). "
                "See docs/custom-engines.md."
            )
        return super().__new__(cls)

    @abstractmethod
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        """Apply change records in order (later records for one key win).

        Restored records are never logged again. ``into_empty`` is the bulk-load
        hint: the engine is known to be empty, so it may build its state wholesale
        (sorted bulk construction, SST ingestion, ...).
        """

    @abstractmethod
    def current(self, keys: Iterable[bytes]) -> Iterable[ChangeRecord]:
        """The engine's present change record for each given change-record key.

        ``(key, None)`` where the engine has nothing for the key. Used to "trim" an
        uncommitted changelog tail on a remote log that cannot be truncated.
        """

    @abstractmethod
    def flush(self) -> None:
        """Push buffered writes into the engine's local state, as ``KeyValueStore.flush``
        means: what the store's layers call when they hand their writes down. It promises
        no durability; :meth:`sync` (through :meth:`persist`) does."""

    def sync(self) -> None:
        """Make local writes durable (a no-op for in-memory engines): the durability half
        of :meth:`persist`, run once per commit. Default: :meth:`flush`, for an engine
        whose flush already makes its writes durable; an engine with a cheaper
        ``flush`` overrides both, so a commit syncs once."""
        self.flush()

    @abstractmethod
    def close(self) -> None:
        """Release every resource; idempotent; does not commit."""

    # -- optional hooks with safe defaults -------------------------------------------
    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        """Choose local state to restore from and return its changelog offset ``L``.

        The engine must leave its local state equal to the changelog prefix
        ``[0, L)`` with ``min_valid_offset <= L <= committed_offset``, or wipe itself
        and return ``0``. ``min_valid_offset`` is the changelog's compaction horizon:
        a snapshot older than it could resurrect deleted keys and must not be used.
        The default suits engines that always start empty (in-memory engines).
        """
        return 0

    def prepare_commit(self) -> None:
        """Hand any buffered change records to the change logger (commit step 1)."""

    def checkpoint(self, offset: int) -> None:
        """Record durably that local state equals the changelog prefix ``[0, offset)``.

        Called at commit after ``flush()``; engines that can snapshot cheaply (RocksDB
        hard-link checkpoints, an offset stored beside the data) do it here.
        """

    def persist(self, offset: int | None) -> None:
        """Make local state durable and, for a logged store, record that it equals the
        changelog prefix ``[0, offset)``: commit step 3, and the step after a restore
        (both run by :class:`~localstate.TaskStorage`, never by the engine itself).

        Default: :meth:`sync` then ``checkpoint(offset)``. An engine that can do both in
        one durable write (an offset stored in the same synced batch as the data)
        overrides this to avoid a second sync.
        """
        self.sync()
        if offset is not None:
            self.checkpoint(offset)

    def ensure_snapshot(self, offset: int) -> bool:
        """Take now a local snapshot at ``offset`` that :meth:`persist` deferred, if the
        local state still equals the changelog prefix ``[0, offset)``; True when a
        snapshot at ``offset`` exists afterwards. Called before a changelog compaction (an
        older snapshot may fall below the compaction horizon) and before a snapshot is
        shipped. Default: False (an engine that keeps no snapshots)."""
        return False

    def stats(self) -> dict[str, float]:
        """Engine gauges exported with the store's metrics (``localstate_engine_<name>``,
        docs/metrics.md): e.g. RocksDB's estimated keys and block-cache hit ratio.
        Must be cheap (read at every scrape). Default: none."""
        return {}

    def wipe(self) -> None:
        """Drop all local state (used before a full rebuild). Default: unsupported."""
        raise NotImplementedError(f"{type(self).__name__} cannot wipe its local state")


class KeyValueEngine(StorageEngine, KeyValueStore[bytes, bytes]):
    """A key-value engine: bytes in, bytes out; change record key == store key."""

    def current(self, keys: Iterable[bytes]) -> Iterable[ChangeRecord]:
        get = self.get
        return [(k, get(k)) for k in keys]


@dataclass(frozen=True)
class StoreSpec:
    """Everything the config says about one store."""

    name: str
    factory: str
    options: Any = None
    """The engine's parsed options dataclass (``factory.options_type``) or ``None``."""
    key_serde: str = "bytes"
    msg_serde: str = "bytes"
    changelog: tuple[str, str] | None = None
    """``(system, stream)`` or ``None`` when the store is not logged."""
    object_cache_size: int = 1000
    write_batch_size: int = 500
    ttl: Any = None
    """The store's :class:`~localstate.layers.TtlPolicy` (``stores.<s>.ttl.*``), or ``None``."""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Every ``stores.<name>.*`` key with the prefix removed, as given."""


def _bytes_serde() -> Serde:
    from .serdes import get_serde

    return get_serde("bytes")


@dataclass
class StoreContext:
    """Where and for whom an engine is built: every built-in engine is constructed as
    ``Engine(context, options)``. :meth:`local` makes one for an engine used on its own
    (tests, benchmarks, a plug-in's conformance suite)."""

    job: str
    store: str
    partition: int
    partitions: int
    directory: Path
    change_logger: ChangeLogger
    metrics: StoreMetrics
    key_serde: Serde = field(default_factory=lambda: _bytes_serde())
    """The store's key serde (``bytes`` unless configured): non-KV engines encode keys with it."""
    msg_serde: Serde = field(default_factory=lambda: _bytes_serde())
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("localstate"))
    logged: bool | None = None
    """Whether the store has a changelog to rebuild from (None: the change logger says)."""

    @property
    def rebuildable(self) -> bool:
        """The store has a changelog, so a damaged or stale local copy may be set aside
        and rebuilt from it (a store without one must keep its local copy durable)."""
        return self.change_logger.enabled if self.logged is None else self.logged

    @classmethod
    def local(cls, directory: Path | str, store: str = "store", *, logged: bool = False,
              key_serde: str = "bytes", msg_serde: str = "bytes") -> StoreContext:
        """A context for an engine used on its own: files under ``directory`` (created),
        no change logger; ``logged=True`` builds the engine as it would be for a store
        with a changelog (RocksDB then writes without a WAL)."""
        from .changelogger import NullChangeLogger
        from .metrics import StoreMetrics
        from .serdes import get_serde

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        metrics = StoreMetrics()
        return cls(job="local", store=store, partition=0, partitions=1, directory=path,
                   change_logger=NullChangeLogger(store, metrics), metrics=metrics,
                   key_serde=get_serde(key_serde), msg_serde=get_serde(msg_serde), logged=logged)


class StorageEngineFactory(ABC):
    """Builds one engine for one store of one task partition.

    Subclasses set ``options_prefix`` and ``options_type`` (a frozen dataclass) to
    receive ``stores.<name>.<options_prefix>.*`` config keys, validated up front:
    ``stores.s.rocksdb.block.cache.size.bytes`` fills field ``block_cache_size_bytes``.
    """

    options_prefix: ClassVar[str | None] = None
    options_type: ClassVar[type | None] = None
    description: ClassVar[str] = ""
    rescale_layout: ClassVar[Any] = None
    """How the engine's change records split by key when a job is rescaled: a
    :class:`localstate.rescale.RecordLayout`, or None (the store cannot be rescaled;
    ``localstate rescale`` refuses it, naming this attribute)."""

    @abstractmethod
    def create(self, spec: StoreSpec, context: StoreContext) -> StorageEngine:
        """A new engine over ``context.directory`` (which exists)."""
