"""The local durability of the ``rocksdb`` engine: hard-link snapshots tagged with the
changelog offset, the deferred snapshot of ``snapshot.interval.records``, and the clean-close
claim (``db.clean``: the changelog prefix the live database equals) that lets an open keep
it. The rules are in the module docstring of :mod:`localstate.engines.rocksdb`;
:class:`~localstate.engines.rocksdb.RocksDBEngine` owns one :class:`RocksDBSnapshots`,
built with the store directory, the options and a :class:`LiveDatabase` handle.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import rocksdict
from localstate.claims import ClaimDamaged, leave_claim, take_claim
from localstate.errors import CorruptionError, EngineError, LocalStateError
from localstate.faults import fault_point
from localstate.locking import fsync_dir, io_error, remove_tree

__all__ = ["RocksDBSnapshots", "LiveDatabase", "CLEAN_MARKER"]

if TYPE_CHECKING:
    from .rocksdb_options import RocksDBOptions

log = logging.getLogger("localstate")

SNAPSHOT_PREFIX_TMP = ".tmp-"
HARD_LINKABLE = (".sst", ".blob")
CLEAN_MARKER = "db.clean"
"""In the store directory after a clean close: ``{"offset": X, "records": R}``, the live
database equals the changelog prefix ``[0, X)`` and holds ``R`` records written since its
newest snapshot (``R`` = 0, or absent as before: it equals the snapshot at ``X``)."""


_UNREAD = object()


class LiveDatabase(Protocol):
    """What the snapshots use of the engine's live database (``<directory>/db``)."""

    records_written: int
    """Puts and deletes since the live database last equaled a snapshot; the snapshots
    reset it when they take one or keep a claimed live database."""
    _db: Any
    """The open native database, or None while it is closed."""

    def _require_open(self) -> Any: ...
    def _close_db(self) -> None: ...
    def _open(self) -> None: ...
    def _translate(self, e: BaseException, action: str) -> LocalStateError: ...
    def _never_written(self, db: Any) -> bool: ...
    def sync(self) -> None: ...


class RocksDBSnapshots:
    """The snapshots of one rocksdb store directory and the claim on its live database:
    what a restore starts from, what a commit persists, what a clean close leaves."""

    def __init__(self, name: str, directory: Path, options: RocksDBOptions, rebuildable: bool,
                 live: LiveDatabase) -> None:
        self.name = name
        self.directory = directory
        self.live_dir = directory / "db"
        self.snapshot_dir = directory / "snapshots"
        self.options = options
        self.rebuildable = rebuildable
        self._live = live
        self._deferred_snapshot: int | None = None
        """The offset of the last ``persist`` that left its snapshot for later."""
        self._written_at_persist = 0
        self._clean_offset: Any = _UNREAD
        """``(offset, records)`` of the ``db.clean`` claim found when the engine opened
        (consumed by the first open)."""
        self._closing_claim: tuple[int, int] | None = None
        self._live_snapshot: tuple[int, int] | None = None
        """``(offset, records_written)`` when the live database last equaled the snapshot at
        ``offset``: it still does while ``records_written`` has not moved."""

    def take_claim_once(self) -> None:
        """At the engine's first open, before the live database can be written: take the
        clean-close claim (later opens are the engine's own reopens)."""
        if self._clean_offset is _UNREAD:
            self._clean_offset = self._take_clean_marker()

    def void_claim(self) -> None:
        """The live database is discarded: a claim on it means nothing."""
        self._clean_offset = None

    def forget_live(self) -> None:
        """The live database was wiped: it equals no snapshot."""
        self._live_snapshot = None

    def _take_clean_marker(self) -> tuple[int, int] | None:
        """Read and durably delete ``db.clean`` (before the live database can be written):
        ``(offset, records since the newest snapshot)``."""
        marker = self.directory / CLEAN_MARKER
        try:
            claim = take_claim(marker, {"offset": (int,), "records": (int,)})
        except ClaimDamaged as e:
            log.warning("rocksdb store %r: %s; the live database is rebuilt", self.name, e)
            return None
        except OSError as e:  # a claim left on disk could outlive this open: stop
            raise io_error(e, "take the clean-close claim", marker, EngineError) from e
        if claim is None:
            return None
        offset, records = claim["offset"], claim["records"]
        return offset, records

    def _clean_claim(self) -> tuple[int, int] | None:
        """``(X, R)`` when the live database equals the changelog prefix ``[0, X)``: it
        equals its newest snapshot (``R`` = 0), or nothing was written since the commit
        whose ``persist(X)`` deferred the snapshot (``R`` records since the newest one)."""
        if not self.rebuildable:
            return None
        written = self._live.records_written
        live = self._live_snapshot
        if live is not None and live[1] == written:
            snapshots = self._snapshots()
            if snapshots and snapshots[-1][0] == live[0]:
                return live[0], 0
        deferred = self._deferred_snapshot
        if deferred is not None and written == self._written_at_persist:
            return deferred, written
        return None

    def write_clean_marker(self) -> None:
        """At close, under the engine lock (an opener waiting for it must find the claim
        complete or absent): claim what the live database equals (:meth:`before_close`
        computed it, and flushed the memtable for it, before the database closed)."""
        claim, self._closing_claim = self._closing_claim, None
        if claim is None:
            return
        try:
            leave_claim(self.directory / CLEAN_MARKER, {"offset": claim[0], "records": claim[1]})
        except OSError as e:  # only an optimization of the next open
            log.warning("rocksdb store %r: could not write %s (%s); the next open rebuilds the live "
                        "database from its snapshot", self.name, CLEAN_MARKER, e)

    def _snapshots(self) -> list[tuple[int, Path]]:
        """Completed snapshots as ``(offset, path)``, oldest first."""
        if not self.snapshot_dir.is_dir():
            return []
        out = []
        for p in self.snapshot_dir.iterdir():
            if p.name.isdigit():
                if not (p / "CURRENT").is_file():
                    # a snapshot that lost its files would open as an empty database and
                    # silently skip the records before its offset: never use it
                    log.warning(
                        "rocksdb store %r: snapshot %s has no CURRENT file; deleting it", self.name, p)
                    remove_tree(p)
                    continue
                out.append((int(p.name), p))
        out.sort()
        return out

    def snapshots(self) -> list[tuple[int, Path]]:
        """Completed local snapshots as ``(offset, directory)``, oldest first: what a
        changelog that keeps snapshots remotely (``objectstore``) uploads."""
        return self._snapshots()

    def snapshot_path(self, offset: int) -> Path:
        """The directory of the snapshot at ``offset`` (a downloaded snapshot is put there,
        complete, and then used like a local one)."""
        return self.snapshot_dir / f"{offset:020d}"

    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        """Rebuild ``db/`` from the newest snapshot at ``min_valid <= L <= C``; return ``L``.

        Snapshots past ``C`` come from a commit that never completed and snapshots
        older than ``min_valid`` could resurrect compacted deletes: both are deleted.
        A snapshot that fails to open (lost or damaged files) is deleted with a warning
        and the next older one is tried. Without a usable snapshot the store is wiped
        and ``0`` returned (a full restore from the changelog follows).
        """
        live = self._live
        live._require_open()
        clean, self._clean_offset = self._clean_offset, None
        usable: list[tuple[int, Path]] = []
        for offset, path in self._snapshots():
            if offset > committed_offset or offset < min_valid_offset:
                remove_tree(path)
            else:
                usable.append((offset, path))
        if clean is not None and live.records_written == 0:
            at, since = clean
            # closed cleanly equal to the changelog prefix [0, at), and no open since: db/ is
            # kept if that is the commit, or (the claim of a close at a snapshot) the newest
            # usable snapshot before it; a claim naming anything else is stale. Like a
            # snapshot, never below the compaction horizon (TaskStorage's rule for a start)
            current = at == committed_offset or (since == 0 and usable and usable[-1][0] == at)
            if current and (at >= min_valid_offset or at == 0):
                live.records_written = self._written_at_persist = since
                newest = usable[-1][0] if usable else None
                self._live_snapshot = (at, since) if since == 0 and newest == at else None
                # the deferred snapshot of the commit db/ equals (ensure_snapshot may take it)
                self._deferred_snapshot = at if at == committed_offset and usable else None
                return at
        if not usable and live._never_written(live._require_open()):
            # a full restore into a database that never held a write (a first open on this
            # machine): rebuilding it empty would only cost a close, a delete and a reopen
            self._live_snapshot = None
            return 0
        live._close_db()
        start = 0
        for offset, path in reversed(usable):
            try:
                remove_tree(self.live_dir)
                self._copy_snapshot(path, self.live_dir)
                live._open()
            except (OSError, CorruptionError, EngineError) as e:
                log.warning("rocksdb store %r: snapshot %s cannot be used (%s); trying an older one "
                            "or a full restore from the changelog", self.name, path, e)
                remove_tree(path)
                continue
            start = offset
            self._live_snapshot = (offset, live.records_written)
            break
        if live._db is None:
            try:
                remove_tree(self.live_dir)
            except OSError as e:
                raise io_error(e, "rebuild the live database in", self.live_dir, EngineError) from e
            live._open()
        return start

    @staticmethod
    def _copy_snapshot(source: Path, target: Path) -> None:
        tmp = target.with_name(target.name + ".loading")
        remove_tree(tmp)
        tmp.mkdir()
        for f in source.iterdir():
            if f.suffix in HARD_LINKABLE:
                os.link(f, tmp / f.name)  # immutable files: share the inode
            else:
                shutil.copy2(f, tmp / f.name)  # MANIFEST, CURRENT, OPTIONS, WAL: rewritten in place
        os.replace(tmp, target)

    def persist(self, offset: int | None) -> None:
        """Commit step 3: a snapshot at ``offset`` once ``snapshot.interval.records``
        records were written since the last one; otherwise the snapshot is deferred (the
        changelog holds everything past the newest snapshot, and a reopen replays it)."""
        live = self._live
        live.sync()
        if offset is None:
            return
        self._written_at_persist = live.records_written
        if live.records_written < self.options.snapshot_interval_records and self._snapshots():
            self._deferred_snapshot = offset
            return
        self.checkpoint(offset)

    def ensure_snapshot(self, offset: int) -> bool:
        """Take the snapshot ``persist(offset)`` deferred, if the live database still
        equals the changelog prefix ``[0, offset)`` (nothing written since). True when a
        snapshot at ``offset`` exists afterwards. Called before a changelog compaction, a
        snapshot upload and a close."""
        if (self.snapshot_dir / f"{offset:020d}" / "CURRENT").is_file():
            return True
        if self._deferred_snapshot != offset or self._live.records_written != self._written_at_persist:
            return False
        self.checkpoint(offset)
        return True

    def before_close(self) -> None:
        """Before the engine closes the live database: compute the claim of what it
        equals (:meth:`_clean_claim`), which :meth:`write_clean_marker` leaves once it
        closed, so the next open keeps it and replays nothing. A deferred
        snapshot is not taken here (a task opened once per micro-batch would take one
        per micro-batch, ~30 ms of each close): the memtable is flushed instead, and the
        claim carries the records written since the newest snapshot, so
        ``snapshot.interval.records`` still bounds what a reopen after a crash replays."""
        claim = self._clean_claim()
        if claim is not None and claim[1]:
            try:  # RocksDB's own flush at close would not report a failure (no WAL here)
                self._live._require_open().flush(True)  # (the write-behind buffer first)
            except Exception as e:
                claim = None
                # a store whose directory was deleted under it (its state dir removed) has
                # nothing left to rebuild: not worth a warning
                log.log(logging.WARNING if self.directory.exists() else logging.DEBUG,
                        "rocksdb store %r: the flush at close failed (%s); the next open rebuilds "
                        "the live database from its newest snapshot", self.name, self._live._translate(e, "flush"))
        self._closing_claim = claim

    def checkpoint(self, offset: int) -> None:
        """Take a hard-link snapshot tagged with ``offset``; keep the newest ``snapshots.keep``."""
        live = self._live
        db = live._require_open()
        target = self.snapshot_dir / f"{offset:020d}"
        if (target / "CURRENT").is_file():
            self._live_snapshot = (offset, live.records_written)
            return  # same offset, same changelog prefix, same content
        remove_tree(target)
        tmp = self.snapshot_dir / f"{SNAPSHOT_PREFIX_TMP}{offset:020d}"
        try:
            self.snapshot_dir.mkdir(exist_ok=True)
            for p in self.snapshot_dir.iterdir():
                if p.name.startswith(SNAPSHOT_PREFIX_TMP):
                    remove_tree(p)
            db.flush(True)
            rocksdict.Checkpoint(db).create_checkpoint(str(tmp))
            fault_point("snapshot.mid")
            os.replace(tmp, target)
            fsync_dir(self.snapshot_dir)
            snapshots = self._snapshots()
            for _offset, path in snapshots[: -self.options.snapshots_keep]:
                remove_tree(path)
            live.records_written = self._written_at_persist = 0
            self._deferred_snapshot = None
            self._live_snapshot = (offset, 0)
        except OSError as e:
            raise io_error(e, "write a snapshot to", tmp, EngineError) from e
        except LocalStateError:
            raise
        except Exception as e:
            raise live._translate(e, "take a snapshot") from e
