"""One partition of the file changelog: :class:`FileChangelogPartition`, a directory of
segment files (:mod:`.segments`) written by one holder of its lock.

A torn or corrupt tail found on open (:mod:`.segments`) is cut back to the last good
batch only by :meth:`~FileChangelogPartition.discard_tail`, which knows the committed
offset, and only when every committed record precedes it (a damaged committed batch is
an error that changes nothing on disk). :meth:`~FileChangelogPartition.verify` checks
every batch of every segment; compaction is in :mod:`.compaction`, the shipped engine
snapshots in :mod:`.shipped`, the clean-close claim in :mod:`.clean`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from localstate.errors import ChangelogError, CorruptionError
from localstate.faults import fault_point
from localstate.locking import FileLock, atomic_write, fsync_dir, io_error
from localstate.records import ChangeRecord

from ..base import ChangelogPartition, CurrentFn
from ..format import BatchEncoder
from .clean import leave_claim, take_claim
from .compaction import HORIZON_FILE, compacted, read_horizon, replace_segments, write_horizon
from .segments import (
    UNKNOWN,
    Segment,
    cut_segment,
    read_segment,
    recover_segments,
    segment_path,
    verify_segments,
)
from .segments import read_with_offsets as read_segments_with_offsets
from .shipped import ShippedSnapshots

__all__ = ["FileChangelogPartition", "DEFAULT_SEGMENT_BYTES", "DEFAULT_RETENTION_MS", "LOG_ID"]

log = logging.getLogger("localstate.changelog.file")

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_RETENTION_MS = 24 * 3600 * 1000
LOG_ID = "log.id"
"""In a partition directory: the log's identity (:meth:`FileChangelogPartition.log_id`)."""


class FileChangelogPartition(ChangelogPartition):
    """One partition directory. ``readonly=True`` opens without the lock and never writes
    (for ``localstate inspect`` on a live store)."""

    def __init__(
        self,
        directory: Path,
        *,
        stream: str = "",
        partition: int = 0,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        retention_ms: int = DEFAULT_RETENTION_MS,
        fsync: bool = True,
        readonly: bool = False,
        snapshots: bool = False,
        snapshot_every: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self._shipped = ShippedSnapshots(self.directory, self.describe(), enabled=snapshots, every=snapshot_every)
        self.stream = stream or self.directory.parent.name
        self.partition = partition
        self.segment_bytes = segment_bytes
        self.retention_ms = retention_ms
        self.fsync = fsync
        self.readonly = readonly
        self._lock: FileLock | None = None
        self._writer: BinaryIO | None = None
        self._encoder = BatchEncoder()  # the append path's reused batch buffer
        self._write_failed: ChangelogError | None = None  # set by a failed append: no more writes
        self._closed = False
        self._torn: tuple[Path, int, int] | None = None  # (segment, byte, offset) of an uncut bad tail
        self._compacted_to = 0  # end offset of the last segment holding a compacted batch
        # byte position of the last segment's last batch (None: no batch; UNKNOWN: rewritten
        # since it was known) and the end offset made durable: a clean close needs both
        self._last_batch: int | None = UNKNOWN
        self._synced_end = 0
        self._opened = False  # a close after a failed open leaves no claim
        if not readonly:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create changelog directory", self.directory) from e
            self._lock = FileLock(self.directory / ".lock", f"changelog partition {self.directory}")
        try:
            # removed before anything can write (the lock is held): see clean.py
            found = recover_segments(self.directory, None if readonly else take_claim(self.directory),
                                     readonly=readonly)
            self._segments = found.segments
            self._torn, self._last_batch, self._compacted_to = found.torn, found.last_batch, found.compacted_to
            self._horizon = read_horizon(self.directory, self._compacted_to)
            self._check_head()
            self._log_id = self._read_log_id()
        except BaseException:
            self.close()
            raise
        self._end = self._synced_end = self._segments[-1].next_offset if self._segments else 0
        self._opened = True

    # -- open ---------------------------------------------------------------------------------
    def _check_head(self) -> None:
        """A log starts at offset 0, or at the horizon a reset (or compaction) recorded:
        a later first segment means the first segment files were deleted, and a restore
        would silently miss their records (the gap check between segments cannot see it)."""
        first = self._segments[0].base if self._segments else 0
        if first > self._horizon:
            raise CorruptionError(
                f"changelog {self.directory}: offsets 0..{first - 1} are missing (the first segment file(s) "
                f"before {self._segments[0].path.name} were deleted); nothing was changed. Restore the files "
                "from a backup, or give up the store's state explicitly with `localstate restore --reset "
                "STORE` (docs: RELIABILITY.md, operator damage)."
            )

    # -- writing ----------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self._closed:
            raise ChangelogError(f"changelog partition {self.directory} is closed")
        if self.readonly:
            raise ChangelogError(f"changelog partition {self.directory} was opened read-only")
        if self._write_failed is not None:
            raise ChangelogError(
                f"changelog partition {self.directory}: an earlier append failed ({self._write_failed}); "
                "reopen it (opening cuts the uncommitted tail; nothing committed is lost)"
            )

    def _cut_torn_tail(self) -> None:
        """Cut the bad tail noted on open (its records were never committed)."""
        if self._torn is None:
            return
        path, pos, offset = self._torn
        size = path.stat().st_size
        log.warning(
            "changelog %s: torn or corrupt tail at byte %d (%d bytes, uncommitted) cut back to offset %d",
            path, pos, size - pos, offset,
        )
        with open(path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())
        self._torn = None
        self._last_batch = UNKNOWN

    def _open_writer(self) -> BinaryIO:
        if self._torn is not None:
            self._cut_torn_tail()
        if self._writer is None:
            if not self._segments:
                self._new_segment()
            try:
                self._writer = open(self._segments[-1].path, "ab", buffering=1 << 20)
            except OSError as e:
                raise io_error(e, "open changelog segment", self._segments[-1].path) from e
        return self._writer

    def _new_segment(self) -> None:
        path = segment_path(self.directory, self._end)
        try:
            path.touch()
            fsync_dir(self.directory)
        except OSError as e:
            raise io_error(e, "create changelog segment", path) from e
        self._segments.append(Segment(self._end, path, self._end, 0))
        self._last_batch = None

    def append(self, records: list[ChangeRecord]) -> None:
        if not records:
            return
        self._check_writable()
        fault_point("changelog.append")
        seg = self._segments[-1] if self._segments else None
        if seg is not None and seg.size >= self.segment_bytes:
            self._roll()
        writer = self._open_writer()
        try:
            size = self._encoder.write_plain(self._end, records, writer.write)
        except OSError as e:
            # part of the batch (its header, a buffer) may be in the segment: a batch
            # written after it would sit behind a torn one, so this instance writes no more
            self._write_failed = error = io_error(e, "append to", self._segments[-1].path)
            raise error from e
        except (TypeError, ValueError) as e:
            raise ChangelogError(f"changelog {self.directory}: records must be (bytes, bytes | None) pairs: {e}") from e
        self._end += len(records)
        seg = self._segments[-1]
        seg.next_offset = self._end
        self._last_batch = seg.size
        seg.size += size

    def _roll(self) -> None:
        self._sync()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._new_segment()

    def _sync(self) -> None:
        w = self._writer
        if w is None:
            return
        try:
            w.flush()
            if self.fsync:
                os.fsync(w.fileno())
        except OSError as e:
            raise io_error(e, "flush", self._segments[-1].path) from e
        self._synced_end = self._end

    def flush(self) -> int:
        self._check_writable()
        self._sync()
        return self._end

    def end_offset(self) -> int:
        return self._end

    # -- reading ----------------------------------------------------------------------------
    def read_batches(self, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        if self._writer is not None:
            self._writer.flush()
        stop = min(stop, self._end)
        if start >= stop:
            return
        for seg in list(self._segments):
            if seg.next_offset <= start:
                continue
            if seg.base >= stop:
                break
            yield from read_segment(seg, start, stop)

    def read_with_offsets(self, start: int, stop: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """``(offset, key, value)`` for inspection tools (slower than read_batches)."""
        return read_segments_with_offsets(list(self._segments), start, min(stop, self._end))

    # -- tail and compaction ------------------------------------------------------------------
    def discard_tail(self, committed_offset: int, current: CurrentFn) -> None:
        self._check_writable()
        c = committed_offset
        if c > self._end:
            raise self.missing_committed(c)
        self._cut_torn_tail()
        if c == self._end:
            return
        self._last_batch = UNKNOWN
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._shipped.drop_past(c)
        # The offsets [c, end) are written again by this task: from c on it is another
        # log. A local copy of the discarded tail (its writer persisted it and died before
        # its checkpoint) on a machine this one cannot reach carries the old identity, so
        # it is rebuilt there; the copy this task restored (at or below c) is re-tagged by
        # TaskStorage and keeps serving its opens.
        self._new_log_id()
        keep: list[Segment] = []
        for seg in self._segments:
            if seg.base >= c:
                seg.path.unlink()
            else:
                keep.append(seg)
        self._segments = keep
        if keep:
            cut_segment(keep[-1], c)
        fsync_dir(self.directory)
        log.info("changelog %s: discarded uncommitted tail [%d, %d)", self.directory, c, self._end)
        self._end = c

    def describe(self) -> str:
        return f"file changelog {self.directory}"

    # -- engine snapshots shipped beside the log ---------------------------------------------
    def upload_snapshot(self, engine: Any, offset: int) -> bool:
        """After a commit at ``offset`` (its checkpoint is written): ship the engine's
        snapshot into ``shipped/`` when it took one (:meth:`RemoteSnapshots.ship`), so an
        open on another machine replays only what follows it. True if shipped."""
        if self.readonly or self._closed:
            return False
        return self._shipped.upload(engine, offset)

    def fetch_snapshot(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: put the newest usable shipped snapshot among the engine's
        local ones (:meth:`RemoteSnapshots.fetch`)."""
        return self._shipped.fetch(engine, committed, min_valid)

    def shipped_snapshots(self) -> list[int]:
        return self._shipped.offsets()

    def reset(self) -> int:
        """Remove every segment; the next segment starts at the old end offset, so offsets
        never go back. The horizon (the log's recorded start) goes one past it: a local
        copy of the given-up state left on another machine, tagged with an offset at or
        below the end (its last commit), is never loaded — replaying the empty log over it
        would change nothing and bring the whole state back."""
        self._check_writable()
        self._last_batch = UNKNOWN
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        # The new start is recorded first (as the horizon: no snapshot of the given-up state
        # is valid), so a crash part-way leaves a log whose head is accounted for and a reset
        # that can run again.
        self.raise_horizon(self._end + 1)
        self._shipped.drop_past(-1)
        self._new_log_id()
        for seg in self._segments:
            seg.path.unlink(missing_ok=True)
        if self._torn is not None:
            self._torn[0].unlink(missing_ok=True)
            self._torn = None
        self._segments = []
        self._new_segment()
        fsync_dir(self.directory)
        return self._end

    def missing_committed(self, committed: int) -> CorruptionError:
        """The error for a checkpoint that names offset ``committed`` past the readable end."""
        if self._torn is not None:
            path, pos, offset = self._torn
            why = (f"the batch at byte {pos} of {path} (offset {offset}) is damaged, so committed records "
                   f"{offset}..{committed - 1} cannot be read")
        else:
            why = f"it ends at offset {self._end}: committed records are missing (deleted or truncated segment files?)"
        return CorruptionError(
            f"changelog {self.directory}: the task checkpoint says offset {committed} was committed, but "
            f"{why}. Nothing was changed on disk. Restore the files from a backup; or keep what is readable "
            "with `localstate restore --accept-log-end STORE` (the state goes back to the last readable "
            "record), or give up the store's state with `localstate restore --reset STORE`."
        )

    def verify(self) -> dict[str, Any]:
        """Check every batch of every segment (CRC32, dense offsets) without changing
        anything; returns ``{"segments", "batches", "records", "bytes", "end_offset",
        "problems": [str, ...]}``."""
        report = verify_segments(list(self._segments), None if self._torn is None else self._torn[0])
        return {**report, "end_offset": self._end}

    def min_valid_snapshot_offset(self) -> int:
        return self._horizon

    def log_id(self) -> str:
        """A random token written when the partition is created and replaced whenever its
        history is rewritten (an uncommitted tail cut, a reset): two logs with one id
        hold the same records at every offset both have. ``""`` for a partition opened
        read-only before any writer gave it one."""
        return self._log_id

    def _read_log_id(self) -> str:
        try:
            return (self.directory / LOG_ID).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return "" if self.readonly else self._new_log_id()
        except (OSError, UnicodeDecodeError) as e:
            if self.readonly:
                return ""
            log.warning("changelog %s: %s is unreadable (%s); the log gets a new identity (local copies "
                        "are rebuilt once)", self.directory, LOG_ID, e)
            return self._new_log_id()

    def _new_log_id(self) -> str:
        self._check_writable()
        value = os.urandom(8).hex()
        atomic_write(self.directory / LOG_ID, value.encode("ascii"))
        self._log_id = value
        return value

    def raise_horizon(self, horizon: int) -> None:
        """Make every snapshot tagged below ``horizon`` invalid (never lowers it): a reset
        records the log's new start here."""
        if horizon > self._horizon:
            write_horizon(self.directory, horizon)
            self._horizon = horizon

    def compact(self, up_to: int) -> dict[str, int]:
        """Keep the latest record per key in closed segments entirely below ``up_to``.

        Tombstones that are the latest for their key are dropped once their batch is
        older than ``delete.retention.ms``; the tombstone horizon then advances so
        snapshots older than it are never used. Offsets of survivors never change.
        """
        self._check_writable()
        closed = [s for s in self._segments[:-1] if s.next_offset <= up_to]
        stats, horizon, rewritten = compacted(closed, self._horizon, self.retention_ms)
        if not closed:
            return stats
        if horizon != self._horizon or not (self.directory / HORIZON_FILE).exists():
            # written by every compaction, so its absence beside compacted batches is damage
            write_horizon(self.directory, horizon)
            self._horizon = horizon
        replace_segments(self.directory, rewritten)
        return stats

    def size_bytes(self) -> int:
        """Bytes on disk of every segment (``localstate inspect``)."""
        return sum(s.size for s in self._segments)

    def segments(self) -> list[tuple[int, int, Path]]:
        """``(base_offset, next_offset, path)`` per segment, oldest first."""
        return [(s.base, s.next_offset, s.path) for s in self._segments]

    def close(self) -> None:
        """Release the partition (idempotent). Does not flush: bytes still buffered were
        never made durable, so they are uncommitted by definition and a failure to write
        them (disk full) is logged, not raised — the next open cuts any torn tail."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as e:
                log.warning("changelog %s: unflushed (uncommitted) records were not written on close: %s",
                            self.directory, e)
            self._writer = None
        if self._lock is not None:
            self._leave_claim()  # while the lock is held: the next opener sees it whole or not at all
            self._lock.release()
            self._lock = None

    def _leave_claim(self) -> None:
        """Leave the clean-close claim (clean.py) when every appended batch was
        flushed, no torn tail is pending and the last batch's position is known."""
        if (self.readonly or not self._opened or not self._segments or self._torn is not None or self._last_batch is UNKNOWN
                or self._synced_end != self._end):
            return
        seg = self._segments[-1]
        leave_claim(self.directory, seg.path, seg.next_offset, self._last_batch, self._compacted_to, seg.size)
