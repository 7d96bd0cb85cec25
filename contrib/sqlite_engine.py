"""A worked example: a key-value engine on Python's standard ``sqlite3``.

Written only against localstate's public interface, as a user would write a plug-in
(see ``docs/custom-engines.md``). Register it with::

    stores.profiles.factory = localstate.contrib.sqlite_engine:SQLiteEngineFactory

How it meets the contract:

* data lives in ``<store dir>/store.sqlite`` (WAL mode), table ``kv(key BLOB PRIMARY KEY,
  value BLOB) WITHOUT ROWID`` — SQLite compares BLOBs with memcmp, so the primary-key
  index gives exactly the byte order ``range()`` needs;
* writes run inside one open SQL transaction; ``checkpoint(offset)`` writes the
  changelog offset into table ``meta`` and commits **in the same transaction**, so the
  database on disk always equals the changelog prefix ``[0, offset)`` of some commit;
* ``prepare_restore(C, min_valid)`` reuses the file when its offset ``L`` is in
  ``[min_valid, C]`` (only ``[L, C)`` is replayed); otherwise it wipes and returns 0;
* ``close()`` rolls back whatever was not checkpointed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localstate import (
    ChangeRecord,
    ConfigError,
    CorruptionError,
    EngineError,
    InvalidValueError,
    KeyValueEngine,
    KeyValueIterator,
    SerializationError,
    StorageEngineFactory,
    StoreClosedError,
    StoreContext,
    StoreLockedError,
    StoreSpec,
)
from localstate.rescale import RecordLayout

__all__ = ["SQLiteEngine", "SQLiteEngineFactory", "SQLiteOptions"]

_CHUNK = 512


@dataclass(frozen=True)
class SQLiteOptions:
    """``stores.<s>.sqlite.*`` options.

    * ``synchronous`` — SQLite's ``PRAGMA synchronous`` at commit (default ``normal``:
      durable with WAL except on power loss; ``full`` for that too).
    * ``cache.size.kib`` — page cache per connection (default 16384 KiB).
    """

    synchronous: Literal["off", "normal", "full"] = "normal"
    cache_size_kib: int = 16384

    def validate(self, prefix: str) -> None:
        if self.cache_size_kib <= 0:
            raise ConfigError(f"{prefix}.cache.size.kib = {self.cache_size_kib}: must be > 0")


def _translate(e: sqlite3.Error, path: Path, store: str) -> Exception:
    msg = str(e)
    if isinstance(e, sqlite3.OperationalError) and "locked" in msg:
        return StoreLockedError(f"store {store!r}: SQLite database {path} is locked by another process; stop it first")
    if isinstance(e, sqlite3.DatabaseError) and ("malformed" in msg or "not a database" in msg):
        return CorruptionError(
            f"store {store!r}: SQLite database {path} is corrupt ({msg}); delete it and reopen the task "
            "to rebuild it from the changelog (or run `localstate restore`)"
        )
    return EngineError(f"store {store!r}: SQLite error on {path}: {msg}")


class SQLiteEngine(KeyValueEngine):
    """``KeyValueStore[bytes, bytes]`` over one SQLite file."""

    def __init__(self, context: StoreContext, options: SQLiteOptions | None = None) -> None:
        """One SQLite file, ``store.sqlite`` in ``context.directory``."""
        self.name = context.store
        self.path = Path(context.directory) / "store.sqlite"
        self.options = options or SQLiteOptions()
        self._db: sqlite3.Connection | None = None
        self._open()

    # -- plumbing -------------------------------------------------------------------
    def _open(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0.1)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self.options.synchronous.upper()}")
            db.execute(f"PRAGMA cache_size=-{self.options.cache_size_kib}")
            db.execute("CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise _translate(e, self.path, self.name) from e
        self._db = db

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreClosedError(f"store {self.name!r} (sqlite engine at {self.path}) is closed")
        return self._db

    def _check(self, key: object, value: object = b"") -> None:
        if type(key) is not bytes or type(value) is not bytes:
            bad, what = (key, "key") if type(key) is not bytes else (value, "value")
            if bad is None:
                raise InvalidValueError(f"store {self.name!r}: put(key, None) is not allowed; use delete(key)")
            raise SerializationError(
                f"store {self.name!r}: engines store bytes, but a {what} of type {type(bad).__name__} reached "
                f"the engine; set stores.{self.name}.key.serde / msg.serde"
            )

    # -- KeyValueStore ------------------------------------------------------------------
    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        row = self._conn().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def get_all(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        db = self._conn()
        keys = list(keys)
        out: dict[bytes, bytes] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(db.execute(f"SELECT key, value FROM kv WHERE key IN ({marks})", chunk).fetchall())
        return out

    def put(self, key: bytes, value: bytes) -> None:
        self._check(key, value)
        self._conn().execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))

    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        if isinstance(entries, Mapping):
            entries = list(entries.items())
        elif not isinstance(entries, list):
            entries = list(entries)
        for k, v in entries:
            self._check(k, v)
        self._conn().executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", entries)

    def delete(self, key: bytes) -> None:
        self._conn().execute("DELETE FROM kv WHERE key = ?", (key,))

    def delete_all(self, keys: Iterable[bytes]) -> None:
        self._conn().executemany("DELETE FROM kv WHERE key = ?", [(k,) for k in keys])

    def range(self, start: bytes | None, stop: bytes | None) -> KeyValueIterator[bytes, bytes]:
        """The pairs of ``[start, stop)`` as of this call — localstate's iterator rule:
        read now, in one query, so writes made while iterating are not seen."""
        where, args = [], []
        if start is not None:
            where.append("key >= ?")
            args.append(start)
        if stop is not None:
            where.append("key < ?")
            args.append(stop)
        sql = "SELECT key, value FROM kv" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY key"
        rows = self._conn().execute(sql, args).fetchall()
        return KeyValueIterator(iter(rows), what=f"store {self.name!r} iterator")

    def prefix(self, prefix: bytes) -> KeyValueIterator[bytes, bytes]:
        upper = bytearray(prefix)
        while upper and upper[-1] == 0xFF:
            upper.pop()
        if upper:
            upper[-1] += 1
        return self.range(prefix, bytes(upper) if upper else None)

    def all(self) -> KeyValueIterator[bytes, bytes]:
        return self.range(None, None)

    def flush(self) -> None:
        self._conn()  # durability comes with checkpoint(): data and offset in one transaction

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.rollback()
            db.close()

    # -- StorageEngine ---------------------------------------------------------------------
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        db = self._conn()
        puts: dict[bytes, bytes | None] = {}
        for k, v in records:
            puts[k] = v
            if len(puts) >= 50_000:
                self._apply(db, puts)
                puts = {}
        self._apply(db, puts)

    @staticmethod
    def _apply(db: sqlite3.Connection, records: dict[bytes, bytes | None]) -> None:
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", [(k, v) for k, v in records.items() if v is not None])
        db.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k, v in records.items() if v is None])

    def checkpoint(self, offset: int) -> None:
        db = self._conn()
        try:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('changelog_offset', ?)", (offset,))
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise _translate(e, self.path, self.name) from e

    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        row = self._conn().execute("SELECT value FROM meta WHERE name = 'changelog_offset'").fetchone()
        local = row[0] if row else 0
        if row and min_valid_offset <= local <= committed_offset:
            return local
        self.wipe()
        return 0

    def wipe(self) -> None:
        db = self._conn()
        db.execute("DELETE FROM kv")
        db.execute("DELETE FROM meta")

    def __len__(self) -> int:
        return self._conn().execute("SELECT count(*) FROM kv").fetchone()[0]


class SQLiteEngineFactory(StorageEngineFactory):
    """Factory for :class:`SQLiteEngine`; options under ``stores.<s>.sqlite.*``."""

    options_prefix = "sqlite"
    options_type = SQLiteOptions
    description = "example plug-in: sqlite3 (WAL), offset stored in the same transaction as the data"
    rescale_layout = RecordLayout()
    """Its change records are ``key -> value``: ``localstate rescale`` may split them by key."""

    def create(self, spec: StoreSpec, context: StoreContext) -> SQLiteEngine:
        return SQLiteEngine(context, spec.options)
