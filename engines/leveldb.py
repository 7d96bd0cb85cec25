"""``leveldb``: a persistent key-value engine on LevelDB (plyvel).

Layout under the store directory::

    engine.lock     flock held while the engine is open (pid inside)
    db/             the database

Inside the database the store's keys live under the one-byte prefix ``d`` (a plyvel
``prefixed_db``, so the prefix is added and stripped in C), and engine metadata under
``m``: user keys can be any bytes, and ``range``/``all`` never see the metadata.

Fault tolerance: LevelDB has no checkpoints, so the database itself is the local copy.
``checkpoint(offset)`` writes the changelog offset as metadata key ``m:offset`` (synced,
after everything before it). The first mutation after that deletes the key *before*
writing anything, and LevelDB's log recovers a prefix of the writes in order, so an
offset found on disk always describes exactly the data written before it: after a
clean close without commit (writes past the offset on disk) or a crash, the key is
gone. ``prepare_restore(C, min_valid)`` keeps the database when its offset ``L`` is in
``[min_valid, C]`` (only ``[L, C)`` is replayed) and otherwise wipes it (full rebuild).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import is_not
from typing import Any

import plyvel
from localstate.engine import (
    ChangeRecord,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import (
    ConfigError,
    CorruptionError,
    EngineError,
    LocalStateError,
    StoreClosedError,
    StoreLockedError,
)
from localstate.kv import KeyValueIterator, reject_none
from localstate.locking import io_error, remove_tree

from ._persistent import NativeKVEngine, deduped_chunks, explain_bad_key, explain_bad_pairs

__all__ = ["LevelDBEngine", "LevelDBEngineFactory", "LevelDBOptions"]

log = logging.getLogger("localstate.engines.leveldb")
_DATA_PREFIX = b"d"
_OFFSET_KEY = b"m:offset"
_SYNC_KEY = b"m:sync"
_BULK_CHUNK_RECORDS = 1 << 21
_COMPRESSIONS = ("snappy", "none")


@dataclass(frozen=True)
class LevelDBOptions:
    """``stores.<name>.leveldb.*`` options.

    * ``block.cache.size.bytes`` — LRU block cache (default 8 MiB, LevelDB's own default).
    * ``block.size.bytes`` — data block size (default 4096).
    * ``write.buffer.size.bytes`` — memtable size before a flush (default 4 MiB).
    * ``compression`` — ``snappy`` (default) or ``none``; LevelDB (plyvel) has no
      lz4/zstd: use the ``rocksdb`` engine for those.
    * ``bloom.bits.per.key`` — bloom filter bits per key, ``0`` disables (default 10).
    * ``max.open.files`` — table files kept open (default 1000).
    * ``paranoid.checks`` — LevelDB stops at damage instead of skipping it: a damaged
      log or table makes the open fail (then a logged store is rebuilt from its
      changelog) rather than silently dropping the records in the damaged block
      (default **true**: without it one flipped byte in the log can drop hundreds of
      committed keys while the stored offset survives).
    * ``verify.checksums`` — every read (get, multi-get, scans) checks the block CRC, so
      a damaged table block is an error, never a wrong value (default **true**).
    """

    block_cache_size_bytes: int = 8 * 1024 * 1024
    block_size_bytes: int = 4096
    write_buffer_size_bytes: int = 4 * 1024 * 1024
    compression: str = "snappy"
    bloom_bits_per_key: int = 10
    max_open_files: int = 1000
    paranoid_checks: bool = True
    verify_checksums: bool = True

    def validate(self, prefix: str) -> None:
        """Raise :class:`ConfigError` naming the full key of the first bad value."""
        if self.compression not in _COMPRESSIONS:
            hint = " (use the rocksdb engine for lz4/zstd)" if self.compression in ("lz4", "zstd") else ""
            raise ConfigError(
                f"{prefix}.compression = {self.compression!r}: LevelDB supports "
                f"{' or '.join(_COMPRESSIONS)}{hint}"
            )
        checks = (
            ("block.cache.size.bytes", self.block_cache_size_bytes >= 0, ">= 0"),
            ("block.size.bytes", self.block_size_bytes >= 256, ">= 256"),
            ("write.buffer.size.bytes", self.write_buffer_size_bytes >= 64 * 1024, ">= 65536"),
            ("bloom.bits.per.key", 0 <= self.bloom_bits_per_key <= 64, "between 0 and 64"),
            ("max.open.files", self.max_open_files >= 16, ">= 16"),
        )
        for key, ok, rule in checks:
            if not ok:
                value = getattr(self, key.replace(".", "_"))
                raise ConfigError(f"{prefix}.{key} = {value!r}: must be {rule}")

    def to_options(self) -> dict[str, object]:
        """Keyword arguments for ``plyvel.DB``."""
        return {
            "create_if_missing": True,
            "lru_cache_size": self.block_cache_size_bytes or None,
            "block_size": self.block_size_bytes,
            "write_buffer_size": self.write_buffer_size_bytes,
            "compression": None if self.compression == "none" else self.compression,
            "bloom_filter_bits": self.bloom_bits_per_key,
            "max_open_files": self.max_open_files,
            "paranoid_checks": self.paranoid_checks,
        }


class LevelDBEngine(NativeKVEngine):
    """``KeyValueStore[bytes, bytes]`` over one LevelDB directory; offset kept inside."""

    kind = "leveldb"

    def __init__(self, context: StoreContext, options: LevelDBOptions | None = None) -> None:
        """A store with a changelog (``context.rebuildable``): a local copy that LevelDB
        finds damaged on open is set aside and rebuilt instead of being an error."""
        self._raw: plyvel.DB | None = None
        self._offset_on_disk = False
        super().__init__(context, options or LevelDBOptions())

    # -- plumbing -------------------------------------------------------------------------
    def _translate(self, e: BaseException, action: str) -> LocalStateError:
        """The one place LevelDB errors become localstate errors."""
        if isinstance(e, LocalStateError):
            return e
        msg = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        where = f"store {self.name!r}: LevelDB at {self.live_dir}"
        if isinstance(e, plyvel.CorruptionError) or msg.startswith("Corruption"):
            return CorruptionError(
                f"{where} is corrupt ({msg}) while trying to {action}. Its state can be rebuilt from the "
                "changelog: run `localstate restore --wipe` (it deletes the local copy first), or delete "
                f"{self.directory} and reopen the task"
            )
        if isinstance(e, plyvel.IOError) and "lock" in msg.lower():
            return StoreLockedError(
                f"{where} is locked by another process ({msg}); stop it (or close its TaskStorage) first"
            )
        if msg.startswith("Invalid argument"):
            return EngineError(
                f"{where} was created with incompatible options ({msg}). localstate opens LevelDB with the "
                f"default bytewise comparator; point the store elsewhere or delete {self.directory} to "
                "rebuild it from the changelog"
            )
        if isinstance(e, OSError) and not isinstance(e, plyvel.Error):
            return io_error(e, action, self.live_dir, EngineError)
        return EngineError(f"{where}: cannot {action}: {type(e).__name__}: {msg}")

    def _open(self) -> None:
        try:
            raw = plyvel.DB(str(self.live_dir), **self.options.to_options())
        except Exception as e:
            raise self._translate(e, "open the database") from e
        self._raw = raw
        self._db = data = raw.prefixed_db(_DATA_PREFIX)
        self._verify = self.options.verify_checksums
        self._get = partial(data.get, verify_checksums=True) if self._verify else data.get
        self._offset_on_disk = raw.get(_OFFSET_KEY, verify_checksums=True) is not None

    def _close_native(self) -> None:
        raw, self._raw, self._db = self._raw, None, None
        if raw is not None:
            try:
                raw.close()
            except Exception as e:
                raise self._translate(e, "close the database") from e

    def _require_writable(self) -> plyvel.DB:
        """The data namespace, for a write: the on-disk offset goes first (see module doc)."""
        data = self._require_open()
        if self._offset_on_disk:
            assert self._raw is not None
            self._raw.delete(_OFFSET_KEY)
            self._offset_on_disk = False
        return data

    def _new_batch(self) -> Any:
        return self._require_open().write_batch()

    def _discard_batch(self, batch: Any) -> None:
        batch.clear()

    def _write_batch(self, batch: Any) -> None:
        self._require_writable()
        try:
            batch.write()
        except Exception as e:
            raise self._translate(e, "write a batch") from e

    def persisted_offset(self) -> int | None:
        """The changelog offset the database equals, or ``None`` if it was written since."""
        self._require_open()
        assert self._raw is not None
        raw = self._raw.get(_OFFSET_KEY)
        return None if raw is None else int(raw)

    # -- KeyValueStore --------------------------------------------------------------------------
    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._db is None:
            self._require_open()
        try:
            v = self._get(key)
            return default if v is None else v
        except Exception as e:
            explain_bad_key(self.name, key)
            raise self._translate(e, "get") from e

    def get_all(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        self._require_open()
        keys = keys if isinstance(keys, list) else list(keys)
        try:
            values = list(map(self._get, keys))
        except Exception as e:
            for k in keys:
                explain_bad_key(self.name, k)
            raise self._translate(e, "get") from e
        return dict(compress(zip(keys, values), map(is_not, values, repeat(None))))

    def put(self, key: bytes, value: bytes) -> None:
        if value is None:
            reject_none(self.name, key, value)
        data = self._require_writable()
        try:
            data.put(key, value)
        except Exception as e:
            explain_bad_pairs(self.name, [(key, value)])
            raise self._translate(e, "put") from e

    def delete(self, key: bytes) -> None:
        data = self._require_writable()
        try:
            data.delete(key)
        except Exception as e:
            explain_bad_key(self.name, key)
            raise self._translate(e, "delete") from e

    def _scan(self, native: plyvel.Iterator) -> Iterator[tuple[bytes, bytes]]:
        try:
            yield from native
        except plyvel.Error as e:
            raise self._translate(e, "scan") from e
        except RuntimeError as e:  # plyvel: "Cannot operate on closed LevelDB database"
            raise StoreClosedError(f"store {self.name!r} (leveldb engine) was closed during a scan") from e
        finally:
            native.close()

    def _iterate(self, db: plyvel.DB, start: bytes | None, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        # the native iterator is created now (LevelDB snapshots at creation): the iterator rule
        return self._scan(db.iterator(start=start, stop=stop, verify_checksums=self._verify))

    def prefix(self, prefix: bytes) -> KeyValueIterator[bytes, bytes]:
        data = self._require_open()
        explain_bad_key(self.name, prefix)
        native = data.iterator(prefix=prefix, verify_checksums=self._verify)
        return self._iterators.open(self._scan(native), f"store {self.name!r} iterator")

    def flush(self) -> None:
        """Nothing to push down: every write went straight into LevelDB."""
        self._require_open()

    def sync(self) -> None:
        """Sync LevelDB's log: every write so far survives a machine crash."""
        self._require_open()
        assert self._raw is not None
        try:
            self._raw.put(_SYNC_KEY, b"", sync=True)
        except Exception as e:
            raise self._translate(e, "flush") from e

    # -- StorageEngine --------------------------------------------------------------------------
    def _bulk_load(self, data: plyvel.DB, records: Iterator[ChangeRecord]) -> None:
        """Dedupe each chunk (last write wins), then write its live keys in sorted batches
        (sorted input keeps LevelDB's compactions trivial); later chunks' tombstones are
        applied as deletes."""
        step = self.write_batch_records
        for chunk_no, (keys, latest, dead) in enumerate(deduped_chunks(records, _BULK_CHUNK_RECORDS)):
            value_of = latest.__getitem__
            for i in range(0, len(keys), step):
                part = keys[i : i + step]
                batch = data.write_batch()
                deque(map(batch.put, part, map(value_of, part)), 0)
                batch.write()
            if dead and chunk_no:
                batch = data.write_batch()
                deque(map(batch.delete, dead), 0)
                batch.write()
            del keys, latest, dead

    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        """Keep the database if its persisted offset ``L`` is in ``[min_valid, C]``; else wipe.

        ``L > C`` means the database holds writes of a commit that never completed;
        ``L < min_valid`` means compaction may have dropped deletes it would need.
        """
        offset = self.persisted_offset()
        if offset is None or not min_valid_offset <= offset <= committed_offset:
            self.wipe()
            offset = 0
        return offset

    def persist(self, offset: int | None) -> None:
        """One synced write per commit: LevelDB's log is sequential, so syncing the offset
        key (or, for a store without a changelog, the sync marker) makes every earlier
        write durable too — ``sync()`` + ``checkpoint()`` would sync twice."""
        if offset is None:
            self.sync()
        else:
            self.checkpoint(offset)

    def checkpoint(self, offset: int) -> None:
        """Write ``offset`` as the database's changelog offset (synced, after all data)."""
        self._require_open()
        assert self._raw is not None
        try:
            self._raw.put(_OFFSET_KEY, b"%d" % offset, sync=True)
        except Exception as e:
            raise self._translate(e, "write the changelog offset") from e
        self._offset_on_disk = True

    def wipe(self) -> None:
        """Delete the database and reopen it empty."""
        self._require_open()
        self._close_db()
        try:
            remove_tree(self.live_dir)
        except OSError as e:
            raise io_error(e, "wipe", self.live_dir, EngineError) from e
        self._open()


class LevelDBEngineFactory(StorageEngineFactory):
    """Factory ``leveldb``: options under ``stores.<name>.leveldb.*`` (:class:`LevelDBOptions`)."""

    options_prefix = "leveldb"
    options_type = LevelDBOptions
    description = "LevelDB (plyvel): persistent, changelog offset stored in the database for incremental restore"

    def create(self, spec: StoreSpec, context: StoreContext) -> LevelDBEngine:
        return LevelDBEngine(context, spec.options)
