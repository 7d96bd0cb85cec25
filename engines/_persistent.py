"""What the on-disk key-value engines (``rocksdb``, ``leveldb``) share.

* :class:`NativeKVEngine` — their base class: directory, engine lock, live database
  (rebuilt when damaged), open-or-raise guard, write batches, restore, bulk load;
* :func:`deduped_chunks` — change records deduplicated per chunk for a bulk load;

* :class:`IteratorRegistry` — hands out :class:`~localstate.kv.KeyValueIterator` objects
  and closes every one still open when the engine closes (a live native iterator can
  keep the database lock, so ``close()`` must drop them first);
* :func:`engine_lock` — an exclusive ``flock`` on ``<store dir>/engine.lock`` naming the
  holder's pid, taken before the native library opens the database, so a second
  process gets "locked by pid N" instead of a bare library error;
* :func:`explain_bad_pairs` / :func:`explain_bad_key` — turn the native library's
  terse type error into the standard :class:`~localstate.errors.SerializationError`
  (type checks happen only after the library refused, so the happy path pays nothing);
* the durable file steps (``fsync_dir``, ``remove_tree``) live in :mod:`localstate.locking`.
"""

from __future__ import annotations

import logging
import weakref
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import compress, islice, repeat, starmap
from operator import is_
from pathlib import Path
from typing import Any, ClassVar

from localstate.engine import KeyValueEngine, StoreContext
from localstate.errors import CorruptionError, EngineError, LocalStateError, StoreClosedError
from localstate.kv import KeyValueIterator
from localstate.locking import FileLock, io_error, remove_tree
from localstate.records import ChangeRecord

from ._util import require_bytes, require_bytes_pairs

__all__ = [
    "NativeKVEngine",
    "deduped_chunks",
    "IteratorRegistry",
    "engine_lock",
    "explain_bad_pairs",
    "explain_bad_key",
]


log = logging.getLogger("localstate")


class _TrackedIterator(KeyValueIterator):
    """A KeyValueIterator that can be weakly referenced (the base class has no slot)."""

    __slots__ = ("__weakref__",)


class IteratorRegistry:
    """The open iterators of one engine, weakly held.

    An iterator the caller drops without closing is collected as usual; one still
    referenced when the engine closes is closed by :meth:`close_all`, which releases
    the native iterator it wraps.
    """

    def __init__(self) -> None:
        self._open: weakref.WeakSet[_TrackedIterator] = weakref.WeakSet()

    def open(self, items: Iterable[tuple[bytes, bytes]], what: str) -> KeyValueIterator[bytes, bytes]:
        it = _TrackedIterator(items, what=what)
        registry = self._open
        ref = weakref.ref(it)

        def forget() -> None:
            # through a weak reference: a closure holding ``it`` would make a cycle, and an
            # abandoned iterator (with its native iterator and the DB lock) would then
            # wait for the cyclic GC instead of going away at once
            target = ref()
            if target is not None:
                registry.discard(target)

        it._on_close = forget
        registry.add(it)
        return it

    def close_all(self) -> None:
        for it in list(self._open):
            it.close()
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)


def engine_lock(directory: Path, store: str, engine: str) -> FileLock:
    """Lock ``directory`` for one engine instance (raises ``StoreLockedError``)."""
    return FileLock(directory / "engine.lock", f"store {store!r} ({engine} at {directory})")


def explain_bad_key(store: str, key: object) -> None:
    """Raise the standard error if ``key`` is not bytes; return if it is."""
    if type(key) is not bytes:
        require_bytes(store, "key", key)


def explain_bad_pairs(store: str, entries: Iterable[tuple[object, object]]) -> None:
    """Raise the standard error for the first non-bytes key/value (or ``None`` value)."""
    require_bytes_pairs(store, entries)


def _only_bytes(items: Iterable[object]) -> bool:
    """Every item is exactly ``bytes`` (one C-level pass)."""
    return set(map(type, items)) == {bytes}


def deduped_chunks(records: Iterator[ChangeRecord], chunk_records: int) -> Iterator[tuple[list[bytes], dict[bytes, bytes], list[bytes]]]:
    """Change records in chunks of up to ``chunk_records``, each deduplicated (last write
    wins): ``(live keys sorted, value per live key, deleted keys)``. A bulk load applies
    the chunks in order, so a later chunk's values and deletes win over earlier ones."""
    while True:
        latest = dict(islice(records, chunk_records))
        if not latest:
            return
        dead = list(compress(latest.keys(), map(is_, latest.values(), repeat(None))))
        for k in dead:
            del latest[k]
        yield sorted(latest), latest, dead  # type: ignore[misc]


class NativeKVEngine(KeyValueEngine):
    """Base of the key-value engines over a native on-disk library (``rocksdb``, ``leveldb``).

    It owns what they share: the store directory and its engine lock, the live database
    under ``<directory>/db`` (set aside and rebuilt when it does not open and the store
    is ``rebuildable`` — it has a changelog to rebuild from), the open-or-raise guard
    :meth:`_require_open`, iterators closed before the database, bulk writes and
    restores through the library's write batches, and the deduplicated bulk load.

    A subclass sets ``kind`` and implements :meth:`_open` (sets ``self._db``),
    :meth:`_close_native`, :meth:`_translate` (the one place native errors become
    localstate errors), :meth:`_new_batch`/:meth:`_write_batch`, :meth:`_iterate` and
    :meth:`_bulk_load`.
    """

    kind: ClassVar[str] = "native"
    write_batch_records: ClassVar[int] = 100_000
    """Records per write batch of a restore."""
    write_behind_records: ClassVar[int] = 0
    """``put_all``/``delete_all`` records held back and written as one batch sorted by
    key once this many (or :attr:`write_behind_bytes`) are pending; ``0`` writes each
    call as its own batch. See :meth:`put_all`."""
    write_behind_bytes: ClassVar[int] = 8 << 20
    """The value bytes the write-behind buffer may hold before it is written."""
    records_written: int = 0
    """Puts and deletes applied since the engine's last local snapshot (rocksdb counts
    from its last snapshot; restores count too)."""

    def __init__(self, context: StoreContext, options: Any) -> None:
        self.name = name = context.store
        self.directory = Path(context.directory)
        self.options = options
        self.rebuildable = rebuildable = context.rebuildable
        self.live_dir = self.directory / "db"
        self._iterators = IteratorRegistry()
        self._db: Any = None
        self._pending: dict[bytes, bytes | None] = {}
        """Write-behind buffer: key → value, ``None`` = delete (see :meth:`put_all`)."""
        self._pending_bytes = 0
        self._pending_deletes = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, "create store directory", self.directory, EngineError) from e
        self._lock = engine_lock(self.directory, name, self.kind)
        try:
            try:
                self._open()
            except (CorruptionError, EngineError) as e:
                # A logged store's live database is only a working copy (prepare_restore
                # replaces it from a snapshot or the changelog): a damaged one is set aside.
                if not (rebuildable and self._damaged(e)):
                    raise
                log.warning("%s store %r: the local copy at %s does not open (%s); it is discarded and "
                            "rebuilt from the changelog", self.kind, name, self.live_dir, e)
                remove_tree(self.live_dir)
                self._open()
        except BaseException:
            self._lock.release()
            raise

    # -- what a subclass provides ---------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Open the live database and set ``self._db`` (raise translated errors)."""

    @abstractmethod
    def _close_native(self) -> None:
        """Close the native handle(s) and set ``self._db`` to None."""

    @abstractmethod
    def _translate(self, e: BaseException, action: str) -> LocalStateError:
        """``e`` raised by the library while trying to ``action``, as a localstate error."""

    @abstractmethod
    def _new_batch(self) -> Any:
        """An empty native write batch (with ``put`` and ``delete``)."""

    @abstractmethod
    def _write_batch(self, batch: Any) -> None:
        """Write ``batch`` to the database (raise translated errors)."""

    @abstractmethod
    def _iterate(self, db: Any, start: bytes | None, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The pairs of ``[start, stop)`` as of this call (the iterator rule)."""

    @abstractmethod
    def _bulk_load(self, db: Any, records: Iterator[ChangeRecord]) -> None:
        """Load change records into an empty database, deduplicated (:func:`deduped_chunks`)."""

    def _damaged(self, e: LocalStateError) -> bool:
        """Whether a failed open means a damaged local copy (rebuildable from the changelog)."""
        return isinstance(e, CorruptionError)

    def _bulk_loads(self) -> bool:
        """Whether a restore into an empty store uses :meth:`_bulk_load`."""
        return True

    def _discard_batch(self, batch: Any) -> None:
        """Drop a batch that failed to build (nothing of it may be written)."""

    # -- the shared plumbing ----------------------------------------------------------------------
    def _require_open(self) -> Any:
        """The open database with every write so far applied (the write-behind buffer
        written first), or :class:`StoreClosedError`."""
        db = self._db
        if db is None:
            raise StoreClosedError(f"store {self.name!r} ({self.kind} engine at {self.live_dir}) is closed")
        if self._pending:
            self._write_pending()
        return db

    def _write_pending(self) -> None:
        """Write the write-behind buffer as one native batch, sorted by key.

        Sorted, because RocksDB's memtable (a skip list) inserts a run of ascending keys
        from where the previous one went instead of searching from the top each time:
        a batch of 10,000 random keys measured 2-2.5x cheaper to apply sorted, more than
        the sort costs. On a
        failed write the buffer is kept, so nothing acknowledged is lost silently.
        """
        pending, deletes = self._pending, self._pending_deletes
        self._pending, self._pending_bytes, self._pending_deletes = {}, 0, False
        try:
            batch = self._new_batch()
            keys = sorted(pending)
            values = list(map(pending.__getitem__, keys))
            if deletes:
                put, delete = batch.put, batch.delete
                for k, v in zip(keys, values):
                    if v is None:
                        delete(k)
                    else:
                        put(k, v)
            else:
                deque(map(batch.put, keys, values), 0)
            self._write_batch(batch)
        except BaseException:
            pending.update(self._pending)  # (empty: nothing can write in between)
            self._pending, self._pending_deletes = pending, deletes
            self._pending_bytes = sum(map(len, filter(None, pending.values())))
            raise

    def _buffer(self, entries: Mapping[bytes, bytes | None], value_bytes: int, deletes: bool) -> None:
        """Add checked writes to the write-behind buffer; write it once it is full."""
        pending = self._pending
        pending.update(entries)
        self._pending_bytes += value_bytes
        self._pending_deletes |= deletes
        self.records_written += len(entries)
        if len(pending) >= self.write_behind_records or self._pending_bytes >= self.write_behind_bytes:
            self._require_open()

    def _require_writable(self) -> Any:
        """The open database, about to be written (a subclass may note that first)."""
        return self._require_open()

    def _close_db(self) -> None:
        try:
            if self._pending and self._db is not None:
                self._write_pending()  # as before the buffer: the writes reach the database
        finally:
            self._iterators.close_all()  # a live native iterator can keep the database lock
            self._close_native()

    # -- KeyValueStore ------------------------------------------------------------------------------
    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        """Write ``entries`` (later pairs for one key win).

        With :attr:`write_behind_records`, a mapping of ``bytes`` to ``bytes`` joins the
        write-behind buffer (checked here, so a bad key or value still raises at this
        call with nothing changed); every read, scan, flush, snapshot and close writes
        the buffer first, so nothing observable differs but the cost. Anything else
        (pairs, other types: then the standard error) is written at once, after the buffer.
        """
        if self._db is None:
            self._require_open()
        if not isinstance(entries, (Mapping, list, tuple)):
            entries = list(entries)
        if not entries:
            return
        if self.write_behind_records and isinstance(entries, dict):
            values = entries.values()
            if _only_bytes(entries) and _only_bytes(values):
                self._buffer(entries, sum(map(len, values)), False)
                return
        self._require_open()
        batch = self._new_batch()
        try:
            if isinstance(entries, Mapping):
                deque(map(batch.put, entries.keys(), entries.values()), 0)
            else:
                deque(starmap(batch.put, entries), 0)
        except Exception as e:
            self._discard_batch(batch)
            explain_bad_pairs(self.name, entries.items() if isinstance(entries, Mapping) else entries)
            raise self._translate(e, "build a write batch") from e
        self._write_batch(batch)
        self.records_written += len(entries)

    def delete_all(self, keys: Iterable[bytes]) -> None:
        """Delete ``keys`` (buffered like :meth:`put_all` when every key is ``bytes``)."""
        if self._db is None:
            self._require_open()
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        if not keys:
            return
        if self.write_behind_records and _only_bytes(keys):
            self._buffer(dict.fromkeys(keys), 0, True)
            return
        self._require_open()
        batch = self._new_batch()
        try:
            deque(map(batch.delete, keys), 0)
        except Exception as e:
            self._discard_batch(batch)
            for k in keys:
                explain_bad_key(self.name, k)
            raise self._translate(e, "build a write batch") from e
        self._write_batch(batch)
        self.records_written += len(keys)

    def range(self, start: bytes | None, stop: bytes | None) -> KeyValueIterator[bytes, bytes]:
        db = self._require_open()
        for bound in (start, stop):
            if bound is not None:
                explain_bad_key(self.name, bound)
        what = f"store {self.name!r} iterator"
        if start is not None and stop is not None and start >= stop:
            return self._iterators.open((), what)
        return self._iterators.open(self._iterate(db, start, stop), what)

    def all(self) -> KeyValueIterator[bytes, bytes]:
        return self.range(None, None)

    def close(self) -> None:
        """Close open iterators, then the database, then release the lock; idempotent."""
        if self._db is None:
            return
        try:
            self._close_db()
            self._after_close()
        finally:
            self._lock.release()

    def _after_close(self) -> None:
        """Runs once the database closed cleanly, while the engine lock is still held (a
        file written here is never seen half-way by the next opener)."""

    @property
    def open_iterators(self) -> int:
        """How many iterators handed out are still open."""
        return len(self._iterators)

    # -- StorageEngine ----------------------------------------------------------------------------
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        """Apply change records in order through write batches; into an empty store, a
        deduplicated bulk load where the engine has one.

        TaskStorage then calls ``persist(C)``, so reopening before the next commit
        replays nothing.
        """
        db = self._require_writable()
        # the persist after a restore always snapshots: the next open replays nothing
        self.records_written = max(self.records_written, 1 << 62)
        try:
            if into_empty and self._bulk_loads() and self._is_empty(db):
                self._bulk_load(db, iter(records))
            else:
                self._apply_batches(records)
        except LocalStateError:
            raise
        except Exception as e:
            raise self._translate(e, "restore") from e

    def _is_empty(self, db: Any) -> bool:
        it = self._iterate(db, None, None)
        try:
            return next(it, None) is None
        finally:
            getattr(it, "close", lambda: None)()

    def _apply_batches(self, records: Iterable[ChangeRecord]) -> None:
        """Change records in order, ``write_batch_records`` per native write batch."""
        size = self.write_batch_records
        batch = self._new_batch()
        put, delete = batch.put, batch.delete
        n = 0
        for k, v in records:
            if v is None:
                delete(k)
            else:
                put(k, v)
            n += 1
            if n == size:
                self._write_batch(batch)
                batch = self._new_batch()
                put, delete = batch.put, batch.delete
                n = 0
        if n:
            self._write_batch(batch)
