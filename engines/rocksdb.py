"""``rocksdb``: a persistent key-value engine on RocksDB (rocksdict, raw bytes mode).

Layout under the store directory (``job.state.dir/<job>/<store>/<partition>``)::

    engine.lock                 flock held while the engine is open (pid inside)
    db/                         the live database
    db.clean                    after a clean close: the changelog prefix db/ equals (see below)
    snapshots/<offset:020d>/    hard-link checkpoints, tagged with the changelog offset
    ingest/                     SST files of a bulk restore (transient)

Modules: this one (the engine: open, reads, writes, restore), ``rocksdb_options`` (the
``stores.<name>.rocksdb.*`` options), ``rocksdb_snapshots`` (the engine's
:class:`~localstate.engines.rocksdb_snapshots.RocksDBSnapshots`: snapshots, the deferred
snapshot, the clean-close claim).

The live database is reused on open only after a clean close that left it equal to a
changelog prefix (``db.clean``); otherwise it is rebuilt from the newest usable snapshot
plus a replay up to the committed offset. Snapshots carry durability, so a logged store
writes without a WAL; bulk writes reach RocksDB as one batch sorted by key; a long
restore runs on vector memtables. The reasons and the exact rules are in
docs/design/rocksdb-engine.md.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, compress, islice, repeat
from operator import is_not
from pathlib import Path
from typing import Any

import rocksdict
from localstate.engine import (
    ChangeRecord,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import (
    CorruptionError,
    EngineError,
    LocalStateError,
    StoreLockedError,
)
from localstate.kv import KeyValueIterator, prefix_upper_bound, reject_none
from localstate.locking import io_error, remove_tree

from ._persistent import NativeKVEngine, deduped_chunks, explain_bad_key, explain_bad_pairs
from .rocksdb_options import RocksDBOptions, statistics_counts
from .rocksdb_snapshots import RocksDBSnapshots

__all__ = ["RocksDBEngine", "RocksDBEngineFactory", "RocksDBOptions"]

log = logging.getLogger("localstate")

_SST_CHUNK_RECORDS = 1 << 21
_RESTORE_WRITE_BUFFER_BYTES = 8 * 1024 * 1024
_RESTORE_WRITE_BUFFERS = 8
"""A restore's vector memtables: many small ones keep RocksDB's flushes running beside the
replay, so less is left to flush at its end (8 MiB x 8 measured as fast as 64 MiB x 3 or faster
at 1M and 3M records, with 25-85 MiB less peak memory; benchmarks/RESULTS.md)."""
_RESTORE_L0_COMPACTION_TRIGGER = 16
"""A restore's L0 files before a compaction starts (normally 4): with random keys every L0 file
spans the whole key range, so each L0->L1 compaction rewrites all of L1, and at 4 a 1M-record
replay pays one mid-way. Left
below the normal options' slow-down trigger (20), so the reopened store does not normally slow
its writes; the leftover L0 files are compacted once, in the background, after the restore."""
_NOT_PENDING = object()

class RocksDBEngine(NativeKVEngine):
    """``KeyValueStore[bytes, bytes]`` over one RocksDB directory, with local snapshots.

    A logged (``rebuildable``) store skips the write-ahead log: its durable local copy
    is the snapshot taken at commit (the live database is rebuilt from a snapshot on
    every open). A store without a changelog keeps the WAL.
    """

    kind = "rocksdb"
    write_behind_records = 65_536

    def __init__(self, context: StoreContext, options: RocksDBOptions | None = None) -> None:
        """A store with a changelog (``context.rebuildable``) writes without a WAL (its
        durable local copy is the snapshot taken at commit), and a live database that
        does not open is set aside and rebuilt."""
        options = options or RocksDBOptions()
        self.use_wal = not context.rebuildable
        self._native = options.to_native()
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.disable_wal = not self.use_wal
        self._snapshots = RocksDBSnapshots(context.store, Path(context.directory), options, context.rebuildable,
                                           self)
        self.snapshot_dir = self._snapshots.snapshot_dir
        super().__init__(context, options)

    def _damaged(self, e: LocalStateError) -> bool:
        # a kill while a directory was being deleted can leave CURRENT naming a lost MANIFEST
        damaged = isinstance(e, CorruptionError) or "No such file" in str(e)
        if damaged:
            self._snapshots.void_claim()  # the live copy is discarded
        return damaged

    # -- plumbing -------------------------------------------------------------------------
    def _translate(self, e: BaseException, action: str) -> LocalStateError:
        """The one place RocksDB errors become localstate errors.

        rocksdict raises a bare ``Exception`` whose text starts with RocksDB's status
        code ("Corruption:", "IO error:", "Invalid argument:"), so the code is read
        from there.
        """
        if isinstance(e, LocalStateError):
            return e
        msg = str(e)
        path = self.live_dir
        where = f"store {self.name!r}: RocksDB at {path}"
        if isinstance(e, OSError):
            return io_error(e, action, path, EngineError)
        if msg.startswith("IO error") and "lock" in msg.lower():
            return StoreLockedError(
                f"{where} is locked by another process or another open engine ({msg}); "
                "stop it (or close its TaskStorage) first"
            )
        if msg.startswith("Corruption"):
            return CorruptionError(
                f"{where} is corrupt ({msg}) while trying to {action}. Its state can be rebuilt from "
                "the changelog: run `localstate restore --wipe` (it deletes the local copy first), or delete "
                f"{self.directory} and reopen the task"
            )
        if msg.startswith("Invalid argument") and ("comparator" in msg or "raw" in msg):
            return EngineError(
                f"{where} was created with incompatible options ({msg}). localstate opens RocksDB in raw "
                f"bytes mode; this directory holds a database written otherwise. Point the store elsewhere "
                f"or delete {self.directory} to rebuild it from the changelog"
            )
        return EngineError(f"{where}: cannot {action}: {type(e).__name__}: {msg}")

    def _check_raw_mode(self) -> None:
        """Refuse a database rocksdict wrote in its default (non-raw, pickled keys) mode.

        RocksDB itself only notices the comparator mismatch once the database has
        table files, so rocksdict's own marker file is read first.
        """
        marker = self.live_dir / "rocksdict-config.json"
        try:
            raw_mode = json.loads(marker.read_text()).get("raw_mode", True)
        except FileNotFoundError:
            return
        except OSError as e:
            raise EngineError(f"store {self.name!r}: cannot read {marker}: {e}; delete {self.directory} "
                              "to rebuild the store from the changelog") from e
        except (ValueError, AttributeError) as e:
            # rocksdict rewrites its marker in place at every open, so a kill during an open
            # can leave it empty or cut short: damage to the local copy, which a logged store
            # sets aside and rebuilds like any other damage
            raise CorruptionError(f"store {self.name!r}: {marker} is damaged ({e}); delete "
                                  f"{self.directory} to rebuild the store from the changelog") from e
        if raw_mode is not True:
            raise EngineError(
                f"store {self.name!r}: RocksDB at {self.live_dir} was created with incompatible options "
                f"(rocksdict raw_mode={raw_mode}, per {marker.name}). localstate opens RocksDB in raw bytes "
                f"mode; point the store elsewhere or delete {self.directory} to rebuild it from the changelog"
            )

    def _open(self, native: rocksdict.Options | None = None) -> None:
        self._snapshots.take_claim_once()
        self._check_raw_mode()
        native = native or self._native
        try:
            # the column family named too: otherwise rocksdict reopens an existing database
            # with the options saved in its OPTIONS file and an 8 MiB block cache, ignoring
            # ours (measured with rocksdict 0.3.29)
            self._db = rocksdict.Rdict(str(self.live_dir), native, column_families={"default": native})
        except Exception as e:
            raise self._translate(e, "open the database") from e
        self._db.set_write_options(self._write_opts)

    def _close_native(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except Exception as e:
                raise self._translate(e, "close the database") from e

    def _new_batch(self) -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def _write_batch(self, batch: rocksdict.WriteBatch) -> None:
        try:
            self._require_open().write(batch)
        except LocalStateError:
            raise
        except Exception as e:
            raise self._translate(e, "write a batch") from e

    def _bulk_loads(self) -> bool:
        return self.options.restore_mode == "sst"

    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        """Apply change records in order (see :meth:`NativeKVEngine.restore`); a replay
        longer than one write batch goes through a vector memtable (module docstring)."""
        if self._bulk_loads():
            return super().restore(records, into_empty=into_empty)
        records = iter(records)
        try:
            head = list(islice(records, self.write_batch_records))
        except LocalStateError:
            raise
        except Exception as e:  # as NativeKVEngine.restore translates what the records raise
            raise self._translate(e, "restore") from e
        if len(head) < self.write_batch_records:
            return super().restore(head, into_empty=into_empty)
        self._reopen(self._restore_native())
        try:
            super().restore(chain(head, records), into_empty=into_empty)
            try:
                self._require_open().flush(True)  # no WAL: the memtables must reach SST files
            except Exception as e:
                raise self._translate(e, "flush the restored records") from e
        finally:
            self._reopen(self._native)

    def _restore_native(self) -> rocksdict.Options:
        opts = self.options.to_native()
        opts.set_memtable_factory(rocksdict.MemtableFactory.vector())
        opts.set_allow_concurrent_memtable_write(False)  # the vector memtable does not support it
        opts.set_write_buffer_size(_RESTORE_WRITE_BUFFER_BYTES)
        opts.set_max_write_buffer_number(_RESTORE_WRITE_BUFFERS)
        opts.set_level_zero_file_num_compaction_trigger(_RESTORE_L0_COMPACTION_TRIGGER)
        # no write stalls on L0 files while replaying: the trigger above bounds them
        opts.set_level_zero_slowdown_writes_trigger(_RESTORE_L0_COMPACTION_TRIGGER * 3)
        opts.set_level_zero_stop_writes_trigger(_RESTORE_L0_COMPACTION_TRIGGER * 4)
        return opts

    def _reopen(self, native: rocksdict.Options) -> None:
        """Close the live database and open it again with ``native`` options."""
        self._close_db()
        self._open(native)

    # -- KeyValueStore --------------------------------------------------------------------------
    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        db = self._db
        if db is None:
            db = self._require_open()  # raises StoreClosedError
        pending = self._pending
        if pending and type(key) is bytes:  # the write-behind buffer holds the newest writes
            v = pending.get(key, _NOT_PENDING)
            if v is not _NOT_PENDING:
                return default if v is None else v
        try:
            v = db.get(key)
            return default if v is None else v
        except Exception as e:
            explain_bad_key(self.name, key)
            raise self._translate(e, "get") from e

    def approximate_len(self) -> int:
        """RocksDB's ``rocksdb.estimate-num-keys``: O(1), but it counts overwritten and
        deleted keys until compaction drops them (``len()`` is exact and scans)."""
        return int(self._require_open().property_int_value("rocksdb.estimate-num-keys") or 0)

    def stats(self) -> dict[str, float]:
        """Engine gauges for the metrics exporters (docs/metrics.md)."""
        db = self._require_open()
        out: dict[str, float] = {
            "estimated_keys": float(db.property_int_value("rocksdb.estimate-num-keys") or 0),
            "sst_bytes": float(db.property_int_value("rocksdb.total-sst-files-size") or 0),
            "memtable_bytes": float(db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0),
            "block_cache_usage_bytes": float(db.property_int_value("rocksdb.block-cache-usage") or 0),
        }
        if self.options.statistics:
            counts = statistics_counts(self._native.get_statistics())
            hit = counts.get("rocksdb.block.cache.hit", 0)
            miss = counts.get("rocksdb.block.cache.miss", 0)
            out["block_cache_hits"] = float(hit)
            out["block_cache_misses"] = float(miss)
            if hit + miss:
                out["block_cache_hit_ratio"] = hit / (hit + miss)
        return out

    def get_all(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        db = self._require_open()
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        try:
            values = db.get(keys)
        except Exception as e:
            for k in keys:
                explain_bad_key(self.name, k)
            raise self._translate(e, "multi-get") from e
        return dict(compress(zip(keys, values), map(is_not, values, repeat(None))))

    def put(self, key: bytes, value: bytes) -> None:
        db = self._require_open()
        try:
            db.put(key, value)
            self.records_written += 1
        except Exception as e:
            if value is None:
                reject_none(self.name, key, value)
            explain_bad_pairs(self.name, [(key, value)])
            raise self._translate(e, "put") from e

    def delete(self, key: bytes) -> None:
        db = self._require_open()
        try:
            db.delete(key)
            self.records_written += 1
        except Exception as e:
            explain_bad_key(self.name, key)
            raise self._translate(e, "delete") from e

    def _iterate(self, db: rocksdict.Rdict, start: bytes | None, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The pairs of ``[start, stop)`` as of **this call** (a RocksDB snapshot taken
        now, not at the first ``next()``): writes made while iterating are not seen."""
        read_opts = rocksdict.ReadOptions()
        if stop is not None:
            read_opts.set_iterate_upper_bound(stop)
        snap = db.snapshot()
        # rocksdict ignores set_iterate_lower_bound: seek to ``start`` instead.
        items = snap.items(from_key=start, read_opt=read_opts)
        return self._scan_items(snap, items, read_opts, start)

    def _scan_items(self, snap: Any, items: Any, read_opts: Any, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        pair = None
        try:
            for pair in items:
                yield pair
        except Exception as e:
            raise self._translate(e, "scan") from e
        del items
        # rocksdict's items() ends silently when the native iterator fails (e.g. a
        # checksum mismatch); a second iterator positioned after the last pair tells a
        # real end from an error.
        probe = snap.iter(read_opts)
        if pair is None:
            if start is None:
                probe.seek_to_first()
            else:
                probe.seek(start)
        else:
            probe.seek(pair[0])
            if probe.valid():
                probe.next()
        if not probe.valid():
            try:
                probe.status()
            except Exception as e:
                raise self._translate(e, "scan") from e

    def prefix(self, prefix: bytes) -> KeyValueIterator[bytes, bytes]:
        explain_bad_key(self.name, prefix)
        return self.range(prefix, prefix_upper_bound(prefix))

    def flush(self) -> None:
        """Nothing to push down that a read would miss: the write-behind buffer is written
        before anything reads or snapshots the database."""
        self._require_open()

    def sync(self) -> None:
        """Make every write so far durable by syncing the WAL.

        Without a WAL (a logged store) this is a no-op: the durable local copies are the
        snapshots (:meth:`checkpoint` flushes the memtable into one) and the live database
        after a clean close (which flushes the memtable before it writes its claim).
        """
        db = self._require_open()
        if not self.use_wal:
            return
        try:
            db.flush_wal(True)
        except Exception as e:
            raise self._translate(e, "flush") from e

    # -- StorageEngine --------------------------------------------------------------------------
    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        """``(key, value or None)`` per key, in order, with one native multi-get."""
        db = self._require_open()
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return []
        try:
            return list(zip(keys, db.get(keys)))
        except Exception as e:
            raise self._translate(e, "multi-get") from e

    def _never_written(self, db: rocksdict.Rdict) -> bool:
        """No table file and nothing in the memtables, by RocksDB's own bookkeeping: a
        database that never held a write. Not decided by reading data, which a damaged
        file could hide (an unknown property counts as written)."""
        props = ("rocksdb.total-sst-files-size", "rocksdb.num-entries-active-mem-table",
                 "rocksdb.num-entries-imm-mem-tables")
        return all(db.property_int_value(p) == 0 for p in props)

    def _is_empty(self, db: rocksdict.Rdict) -> bool:
        probe = db.iter(rocksdict.ReadOptions())
        probe.seek_to_first()
        return not probe.valid()

    def _bulk_load(self, db: rocksdict.Rdict, records: Iterator[ChangeRecord]) -> None:
        """Dedupe each chunk (last write wins), write it sorted to an SST, ingest it.

        A later chunk's SST is ingested above the earlier ones, so its values win;
        its surviving tombstones are then applied as deletes.
        """
        ingest_dir = self.directory / "ingest"
        remove_tree(ingest_dir)
        ingest_dir.mkdir()
        try:
            for chunk_no, (keys, latest, dead) in enumerate(deduped_chunks(records, _SST_CHUNK_RECORDS)):
                if keys:
                    path = ingest_dir / f"chunk-{chunk_no:06d}.sst"
                    writer = rocksdict.SstFileWriter(self._native)
                    writer.open(str(path))
                    deque(map(writer.__setitem__, keys, map(latest.__getitem__, keys)), 0)
                    writer.finish()
                    ingest_opts = rocksdict.IngestExternalFileOptions()
                    ingest_opts.set_move_files(True)
                    db.ingest_external_file([str(path)], ingest_opts)
                if dead and chunk_no:
                    self._apply_batches(zip(dead, repeat(None)))
                del keys, latest, dead
        finally:
            remove_tree(ingest_dir)

    def wipe(self) -> None:
        """Delete the live database and every snapshot; reopen empty."""
        self._require_open()
        self._close_db()
        try:
            remove_tree(self.live_dir)
            remove_tree(self.snapshot_dir)
        except OSError as e:
            raise io_error(e, "wipe", self.directory, EngineError) from e
        self._snapshots.forget_live()
        self._open()

    # -- snapshots and the clean-close claim (RocksDBSnapshots) ---------------------------------
    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        """Rebuild ``db/`` from the newest usable snapshot (:meth:`RocksDBSnapshots.prepare_restore`)."""
        return self._snapshots.prepare_restore(committed_offset, min_valid_offset)

    def persist(self, offset: int | None) -> None:
        """Commit step 3 (:meth:`RocksDBSnapshots.persist`)."""
        self._snapshots.persist(offset)

    def ensure_snapshot(self, offset: int) -> bool:
        """Take a deferred snapshot (:meth:`RocksDBSnapshots.ensure_snapshot`)."""
        return self._snapshots.ensure_snapshot(offset)

    def checkpoint(self, offset: int) -> None:
        """Take a snapshot tagged with ``offset`` (:meth:`RocksDBSnapshots.checkpoint`)."""
        self._snapshots.checkpoint(offset)

    def snapshots(self) -> list[tuple[int, Path]]:
        """Completed local snapshots as ``(offset, directory)``, oldest first."""
        return self._snapshots.snapshots()

    def snapshot_path(self, offset: int) -> Path:
        """The directory of the snapshot at ``offset``."""
        return self._snapshots.snapshot_path(offset)

    def close(self) -> None:
        """Close as the base does, leaving the clean-close claim
        (:meth:`RocksDBSnapshots.before_close`) for the next open."""
        if self._db is None:
            return
        self._snapshots.before_close()
        super().close()  # writes the claim (_after_close) before it releases the lock

    def _after_close(self) -> None:
        self._snapshots.write_clean_marker()


class RocksDBEngineFactory(StorageEngineFactory):
    """Factory ``rocksdb``: options under ``stores.<name>.rocksdb.*`` (:class:`RocksDBOptions`)."""

    options_prefix = "rocksdb"
    options_type = RocksDBOptions
    description = "RocksDB (rocksdict): persistent, bulk restore (write batches or SST ingestion), hard-link snapshots for incremental restore"

    def create(self, spec: StoreSpec, context: StoreContext) -> RocksDBEngine:
        return RocksDBEngine(context, spec.options)
