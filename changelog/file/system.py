"""``file``: the embedded changelog — segmented append-only files, no server.

Layout under ``systems.<name>.path``::

    <stream>/stream.json                 {"partitions": N}
    <stream>/<partition>/.lock           single-writer lock (flock; holds the pid)
    <stream>/<partition>/<base:020d>.log segments of record batches (see format.py)
    <stream>/<partition>/compaction.json {"tombstone_horizon": offset}
    <stream>/<partition>/clean.json      the clean-close claim (file_clean.py)
    <stream>/<partition>/log.id          the log's identity (:meth:`~FileChangelogPartition.log_id`)
    <stream>/<partition>/shipped/        the engine snapshots shipped here after commits
                                         (``objectstore_snapshots.py``; ``snapshots = false``: none)
    _checkpoints/<job>/partition-<p>.ckpt (+ .prev)   task checkpoints

On open the active (last) segment is verified batch by batch, unless the previous close
was clean and left a claim that still matches the file (``clean.json``, see
``file_clean.py``: then only its last batch is read and checked). A torn or corrupt
**tail** is only *noted* on open: it is cut back to the last good batch by
:meth:`~FileChangelogPartition.discard_tail`, which knows the committed offset, and
only when every committed record precedes it (a damaged committed batch is an error
that changes nothing on disk). A bad batch followed by a good one is corruption
**before** the tail and raises :class:`CorruptionError` naming the file and byte
offset. Older segments are walked header by header on open and CRC-checked when read;
:meth:`~FileChangelogPartition.verify` checks every batch of every segment.

Checkpoints: ``partition-<p>.ckpt`` always exists once written (the previous one is
hard-linked to ``.prev`` before the new one is renamed over it, so no crash leaves
only ``.prev``). A missing or corrupt ``.ckpt`` is damage and an error; ``.prev`` is
used only when asked (``localstate restore --use-previous-checkpoint``).

Why one module of ~730 lines: it is one concern, the segmented log of a partition,
read top to bottom in the order of a partition's life (recover on open, append and
roll, read, cut the tail, reset, verify, compact, close); every method works on the
same list of segments and its invariants (dense offsets, only the last segment open
for writing). The byte format is in ``format.py`` and the checkpoints in
``file_checkpoints.py``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from localstate.errors import ChangelogError, ConfigError, CorruptionError
from localstate.faults import fault_point
from localstate.locking import FileLock, atomic_write, fsync_dir, io_error
from localstate.records import ChangeRecord

from ..base import ChangelogPartition, ChangelogSystem, CurrentFn, check_stream_partitions
from ..directory_store import DirectoryStore
from ..format import (
    FLAG_COMPACTED,
    HEADER_SIZE,
    BatchEncoder,
    BatchHeader,
    check_crc,
    decode_payload,
    encode_batch,
    find_valid_batch_after,
    parse_header,
    walk,
)
from ..snapshots import RemoteSnapshots, instance_epoch
from .checkpoints import FileCheckpointStore
from .clean import TailClaim, claim_holds, leave_claim, take_claim

if TYPE_CHECKING:
    from localstate.rescale_job import RescaleStrategy

__all__ = ["FileChangelogSystem", "FileChangelogPartition", "FileCheckpointStore", "FileChangelogOptions"]

log = logging.getLogger("localstate.changelog.file")

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_RETENTION_MS = 24 * 3600 * 1000


@dataclass
class _Segment:
    base: int
    path: Path
    next_offset: int
    size: int


_UNKNOWN: Any = object()
"""``FileChangelogPartition._last_batch`` after a rewrite of the segment (no clean-close claim)."""
SHIPPED = "shipped"
"""In a partition directory: the engine snapshots shipped after commits."""
LOG_ID = "log.id"
"""In a partition directory: the log's identity (:meth:`FileChangelogPartition.log_id`)."""


def _segment_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


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
        self._shipping = (snapshots, snapshot_every)
        self._shipped: RemoteSnapshots | None = None
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
        # byte position of the last segment's last batch (None: no batch; _UNKNOWN: rewritten
        # since it was known) and the end offset made durable: a clean close needs both
        self._last_batch: int | None = _UNKNOWN
        self._synced_end = 0
        self._opened = False  # a close after a failed open leaves no claim
        if not readonly:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create changelog directory", self.directory) from e
            self._lock = FileLock(self.directory / ".lock", f"changelog partition {self.directory}")
        try:
            # removed before anything can write (the lock is held): see file_clean.py
            self._segments = self._recover(None if readonly else take_claim(self.directory))
            self._horizon = self._read_horizon()
            self._check_head()
            self._log_id = self._read_log_id()
        except BaseException:
            self.close()
            raise
        self._end = self._synced_end = self._segments[-1].next_offset if self._segments else 0
        self._opened = True

    # -- recovery on open -----------------------------------------------------------------
    def _recover(self, claim: TailClaim | None) -> list[_Segment]:
        if not self.directory.exists():
            return []
        if not self.readonly:
            for leftover in self.directory.glob("*.compacting"):
                leftover.unlink()
        paths = sorted(self.directory.glob("*.log"))
        segments: list[_Segment] = []
        for i, path in enumerate(paths):
            try:
                base = int(path.stem)
            except ValueError:
                raise CorruptionError(f"unexpected file {path} in changelog directory; move it away") from None
            last = i == len(paths) - 1
            if last and claim is not None and claim_holds(path, base, claim):
                seg = _Segment(base, path, claim.next_offset, claim.size)
                self._last_batch = claim.last_batch
                self._compacted_to = max(self._compacted_to, claim.compacted_to)
                log.debug("changelog %s: active segment as the clean close left it (not re-read)", self.directory)
            else:
                seg = self._scan_segment(path, base, verify=last)
            if segments and segments[-1].next_offset != base:
                raise CorruptionError(
                    f"changelog {self.directory}: offsets {segments[-1].next_offset}..{base - 1} are missing "
                    f"(a segment before {path.name} was deleted or truncated); nothing was changed. Restore "
                    "the file from a backup, or give up the store's state explicitly with "
                    "`localstate restore --reset STORE` (docs: RELIABILITY.md, operator damage)."
                )
            segments.append(seg)
        return segments

    def _scan_segment(self, path: Path, base: int, *, verify: bool) -> _Segment:
        """The active segment (``verify``) batch by batch with CRCs, noting a torn tail;
        an older one from its headers (:meth:`_walk_older_segment`)."""
        if not verify:
            return self._walk_older_segment(path, base)
        data = path.read_bytes()
        next_offset = base
        good_end = 0
        last_batch: int | None = None
        for h, pos in walk(data):
            if h is None or not check_crc(data, h) or h.base_offset != next_offset:
                if find_valid_batch_after(data, pos) is not None:
                    raise CorruptionError(
                        f"changelog segment {path} is corrupt at byte {pos} (offset {next_offset}) and "
                        "valid batches follow, so this is not a torn tail. Restore the file from a backup."
                    )
                # Not cut here: only discard_tail knows whether the damaged bytes held
                # committed records (then it is an error, and the bytes stay for forensics).
                self._torn = (path, pos, next_offset)
                if self.readonly:
                    log.warning("changelog %s: torn tail at byte %d ignored (read-only)", path, pos)
                break
            next_offset = h.next_offset
            good_end = h.end_position
            last_batch = pos
            if h.flags & FLAG_COMPACTED:
                self._compacted_to = max(self._compacted_to, h.next_offset)
        self._last_batch = last_batch
        return _Segment(base, path, next_offset, good_end)

    def _walk_older_segment(self, path: Path, base: int) -> _Segment:
        """An older segment on open, from its batch headers alone (offsets dense, sizes
        within the file, compaction flags); payload CRCs are checked when batches are
        read. Reading whole segments here made every open read the whole log."""
        next_offset, pos = base, 0
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                while pos < size:
                    f.seek(pos)
                    h = parse_header(f.read(HEADER_SIZE), 0)
                    end = pos + HEADER_SIZE + h.payload_len if h is not None else size + 1
                    if h is None or end > size or h.base_offset != next_offset:
                        raise CorruptionError(
                            f"changelog segment {path} is corrupt at byte {pos} (after offset {next_offset - 1}). "
                            "Restore it from a backup or rebuild the store from another replica."
                        )
                    next_offset = h.next_offset
                    if h.flags & FLAG_COMPACTED:
                        self._compacted_to = max(self._compacted_to, next_offset)
                    pos = end
        except OSError as e:
            raise io_error(e, "read", path) from e
        return _Segment(base, path, next_offset, pos)

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

    def _read_horizon(self) -> int:
        p = self.directory / "compaction.json"
        if not p.exists():
            if self._compacted_to:
                # Compaction always writes this file: compacted batches without it mean it
                # was lost, and with it the tombstone horizon. Assume the worst (every
                # tombstone so far may be gone): no local snapshot below it is used.
                log.warning("changelog %s: compaction.json is missing but segments are compacted; "
                            "local snapshots below offset %d are not trusted (full rebuild)",
                            self.directory, self._compacted_to)
                return self._compacted_to
            return 0
        try:
            return int(json.loads(p.read_text())["tombstone_horizon"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{p} is corrupt ({e}); delete it to force full restores") from e

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
        self._last_batch = _UNKNOWN

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
        path = _segment_path(self.directory, self._end)
        try:
            path.touch()
            fsync_dir(self.directory)
        except OSError as e:
            raise io_error(e, "create changelog segment", path) from e
        self._segments.append(_Segment(self._end, path, self._end, 0))
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
            yield from self._read_segment(seg, start, stop)

    def _read_segment(self, seg: _Segment, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        where = f"changelog segment {seg.path}"
        try:
            with open(seg.path, "rb") as f:
                data = f.read(seg.size)
        except OSError as e:
            raise io_error(e, "read", seg.path) from e
        for h, pos in walk(data):
            if h is None:
                raise CorruptionError(f"{where} is corrupt at byte {pos}")
            if h.next_offset <= start:
                continue
            if h.base_offset >= stop:
                return
            if not check_crc(data, h):
                raise CorruptionError(
                    f"{where}: record batch at byte {pos} (offset {h.base_offset}) fails its CRC32 check"
                )
            records, offsets = decode_payload(data, h, where)
            nbytes = HEADER_SIZE + h.payload_len
            if offsets is None:
                if h.base_offset < start or h.next_offset > stop:
                    lo = max(0, start - h.base_offset)
                    hi = min(h.span, stop - h.base_offset)
                    records = records[lo:hi]
            elif h.base_offset < start or h.next_offset > stop:
                records = tuple(r for r, o in zip(records, offsets) if start <= o < stop)
            if records:
                yield records, nbytes  # type: ignore[misc]

    def read_with_offsets(self, start: int, stop: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """``(offset, key, value)`` for inspection tools (slower than read_batches)."""
        stop = min(stop, self._end)
        for seg in list(self._segments):
            if seg.next_offset <= start or seg.base >= stop:
                continue
            data = seg.path.read_bytes()[: seg.size]
            for h, pos in walk(data):
                if h is None:
                    raise CorruptionError(f"changelog segment {seg.path} is corrupt at byte {pos}")
                if h.next_offset <= start or h.base_offset >= stop:
                    continue
                records, offsets = decode_payload(data, h, str(seg.path))
                offs = offsets if offsets is not None else range(h.base_offset, h.next_offset)
                for o, (k, v) in zip(offs, records):
                    if start <= o < stop:
                        yield o, k, v

    # -- tail and compaction ------------------------------------------------------------------
    def discard_tail(self, committed_offset: int, current: CurrentFn) -> None:
        self._check_writable()
        c = committed_offset
        if c > self._end:
            raise self.missing_committed(c)
        self._cut_torn_tail()
        if c == self._end:
            return
        self._last_batch = _UNKNOWN
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._drop_shipped_past(c)
        # The offsets [c, end) are written again by this task: from c on it is another
        # log. A local copy of the discarded tail (its writer persisted it and died before
        # its checkpoint) on a machine this one cannot reach carries the old identity, so
        # it is rebuilt there; the copy this task restored (at or below c) is re-tagged by
        # TaskStorage and keeps serving its opens.
        self._new_log_id()
        keep: list[_Segment] = []
        for seg in self._segments:
            if seg.base >= c:
                seg.path.unlink()
            else:
                keep.append(seg)
        self._segments = keep
        if keep:
            seg = keep[-1]
            data = seg.path.read_bytes()[: seg.size]
            cut, redo = seg.size, []
            for h, pos in walk(data):
                if h is None or h.next_offset <= c:
                    continue
                cut = pos
                if h.base_offset < c:
                    records, offsets = decode_payload(data, h, str(seg.path))
                    offs = offsets if offsets is not None else range(h.base_offset, h.next_offset)
                    redo = [r for r, o in zip(records, offs) if o < c]
                    if offsets is not None:
                        redo_offs = [o for o in offs if o < c]
                        redo_bytes = encode_batch(h.base_offset, redo, offsets=redo_offs, span=c - h.base_offset, timestamp_ms=h.timestamp_ms)
                    else:
                        redo_bytes = encode_batch(h.base_offset, redo, timestamp_ms=h.timestamp_ms)
                    redo = [redo_bytes]
                break
            with open(seg.path, "r+b") as f:
                f.truncate(cut)
                for chunk in redo:
                    f.seek(cut)
                    f.write(chunk)
                    cut += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            seg.size = cut
            seg.next_offset = c
        fsync_dir(self.directory)
        log.info("changelog %s: discarded uncommitted tail [%d, %d)", self.directory, c, self._end)
        self._end = c

    def describe(self) -> str:
        return f"file changelog {self.directory}"

    # -- engine snapshots shipped beside the log (objectstore_snapshots.py) ------------------
    def _snapshots(self) -> RemoteSnapshots | None:
        if not self._shipping[0]:
            return None
        if self._shipped is None:
            self._shipped = self._shipped_in(self._shipping[1])
        return self._shipped

    def _shipped_in(self, every: int = 0) -> RemoteSnapshots:
        return RemoteSnapshots(DirectoryStore(self.directory), SHIPPED, self.describe(), every)

    def upload_snapshot(self, engine: Any, offset: int) -> bool:
        """After a commit at ``offset`` (its checkpoint is written): ship the engine's
        snapshot into ``shipped/`` when it took one (:meth:`RemoteSnapshots.ship`), so an
        open on another machine replays only what follows it. True if shipped."""
        shipped = self._snapshots()
        if shipped is None or self.readonly or self._closed:
            return False
        return shipped.ship(engine, offset, instance_epoch())

    def fetch_snapshot(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: put the newest usable shipped snapshot among the engine's
        local ones (:meth:`RemoteSnapshots.fetch`)."""
        shipped = self._snapshots()
        return None if shipped is None else shipped.fetch(engine, committed, min_valid)

    def _shipped_here(self) -> RemoteSnapshots | None:
        """The snapshots in ``shipped/``, also when this instance ships none (turned off
        since, or opened by a tool)."""
        if not (self.directory / SHIPPED).is_dir():
            return None
        return self._snapshots() or self._shipped_in()

    def shipped_snapshots(self) -> list[int]:
        shipped = self._shipped_here()
        return [] if shipped is None else shipped.offsets()

    def _drop_shipped_past(self, offset: int) -> None:
        """Before offsets past ``offset`` are written again: no shipped snapshot of the
        discarded records may be fetched (``-1``: none at all)."""
        shipped = self._shipped_here()
        if shipped is not None:
            shipped.delete_past(offset)

    def reset(self) -> int:
        """Remove every segment; the next segment starts at the old end offset, so offsets
        never go back. The horizon (the log's recorded start) goes one past it: a local
        copy of the given-up state left on another machine, tagged with an offset at or
        below the end (its last commit), is never loaded — replaying the empty log over it
        would change nothing and bring the whole state back."""
        self._check_writable()
        self._last_batch = _UNKNOWN
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        # The new start is recorded first (as the horizon: no snapshot of the given-up state
        # is valid), so a crash part-way leaves a log whose head is accounted for and a reset
        # that can run again.
        self.raise_horizon(self._end + 1)
        self._drop_shipped_past(-1)
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
        problems: list[str] = []
        batches = records = nbytes = 0
        expect: int | None = None
        for seg in list(self._segments):
            if expect is not None and seg.base != expect:
                problems.append(f"{seg.path}: starts at offset {seg.base}, expected {expect} (records missing)")
            try:
                with open(seg.path, "rb") as f:
                    data = f.read()
            except OSError as e:
                problems.append(f"{seg.path}: unreadable ({e})")
                expect = seg.next_offset
                continue
            nbytes += len(data)
            nxt = seg.base
            for h, pos in walk(data):
                if h is None or h.base_offset != nxt or not check_crc(data, h):
                    what = "torn tail" if (self._torn and self._torn[0] == seg.path) else "corrupt batch"
                    problems.append(f"{seg.path}: {what} at byte {pos} (offset {nxt})")
                    break
                batches += 1
                records += h.span
                nxt = h.next_offset
            expect = nxt
        return {"segments": len(self._segments), "batches": batches, "records": records, "bytes": nbytes,
                "end_offset": self._end, "problems": problems}

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
            atomic_write(self.directory / "compaction.json", json.dumps({"tombstone_horizon": horizon}).encode())
            self._horizon = horizon

    def compact(self, up_to: int) -> dict[str, int]:
        """Keep the latest record per key in closed segments entirely below ``up_to``.

        Tombstones that are the latest for their key are dropped once their batch is
        older than ``delete.retention.ms``; the tombstone horizon then advances so
        snapshots older than it are never used. Offsets of survivors never change.
        """
        self._check_writable()
        closed = [s for s in self._segments[:-1] if s.next_offset <= up_to]
        stats = {"segments": len(closed), "records_before": 0, "records_after": 0, "tombstones_dropped": 0}
        if not closed:
            return stats
        latest: dict[bytes, int] = {}
        parsed: list[tuple[_Segment, bytes, list[tuple[BatchHeader, Any, Any]]]] = []
        for seg in closed:
            data = seg.path.read_bytes()[: seg.size]
            batches = []
            for h, pos in walk(data):
                if h is None or not check_crc(data, h):
                    raise CorruptionError(f"changelog segment {seg.path} is corrupt at byte {pos}; not compacting")
                records, offsets = decode_payload(data, h, str(seg.path))
                offs = offsets if offsets is not None else range(h.base_offset, h.next_offset)
                for o, (k, _v) in zip(offs, records):
                    latest[k] = o
                batches.append((h, records, offs))
            parsed.append((seg, data, batches))
        now_ms = time.time() * 1000
        horizon = self._horizon
        rewritten: list[tuple[_Segment, bytes]] = []
        for seg, _data, batches in parsed:
            out = bytearray()
            for h, records, offs in batches:
                keep_r, keep_o = [], []
                expired = h.timestamp_ms + self.retention_ms < now_ms
                for o, rec in zip(offs, records):
                    stats["records_before"] += 1
                    if latest[rec[0]] != o:
                        continue
                    if rec[1] is None and expired:
                        stats["tombstones_dropped"] += 1
                        horizon = max(horizon, o + 1)
                        continue
                    keep_r.append(rec)
                    keep_o.append(o)
                stats["records_after"] += len(keep_r)
                out += encode_batch(h.base_offset, keep_r, offsets=keep_o, span=h.span, timestamp_ms=h.timestamp_ms)
            rewritten.append((seg, bytes(out)))
        if horizon != self._horizon or not (self.directory / "compaction.json").exists():
            # written by every compaction, so its absence beside compacted batches is damage
            atomic_write(self.directory / "compaction.json", json.dumps({"tombstone_horizon": horizon}).encode())
            self._horizon = horizon
        for seg, data in rewritten:
            tmp = seg.path.with_name(seg.path.name + ".compacting")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fault_point("compaction.before_rename")
            os.replace(tmp, seg.path)
            seg.size = len(data)
            fault_point("compaction.mid")
        fsync_dir(self.directory)
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
        """Leave the clean-close claim (file_clean.py) when every appended batch was
        flushed, no torn tail is pending and the last batch's position is known."""
        if (self.readonly or not self._opened or not self._segments or self._torn is not None or self._last_batch is _UNKNOWN
                or self._synced_end != self._end):
            return
        seg = self._segments[-1]
        leave_claim(self.directory, seg.path, seg.next_offset, self._last_batch, self._compacted_to, seg.size)


@dataclass(frozen=True)
class FileChangelogOptions:
    """``systems.<name>.*`` of the file changelog."""

    path: str = "./changelog"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    """Roll to a new segment file at this size (compaction works on closed segments)."""
    delete_retention_ms: int = DEFAULT_RETENTION_MS
    """How long compaction keeps a tombstone (as Kafka's ``delete.retention.ms``)."""
    fsync: bool = True
    """false is for benchmarks only: a commit is then not durable."""
    snapshots: bool = True
    """Ship the engine's local snapshots (RocksDB) into the partition directory after
    commits, so a task that moves to another machine replays only what follows the newest
    one (hard links where the state dir is on the same filesystem: no extra disk)."""
    snapshot_every: int = 0
    """Also ship one every N commits (the engine takes the snapshot it deferred); 0: only
    when the engine takes one (every ``snapshot.interval.records`` records)."""

    def validate(self, prefix: str) -> None:
        if self.segment_bytes < 4096:
            raise ConfigError(f"{prefix}.segment.bytes = {self.segment_bytes}: must be >= 4096")
        if self.delete_retention_ms < 0:
            raise ConfigError(f"{prefix}.delete.retention.ms = {self.delete_retention_ms}: must be >= 0")
        if self.snapshot_every < 0:
            raise ConfigError(f"{prefix}.snapshot.every = {self.snapshot_every}: must be >= 0")


class FileChangelogSystem(ChangelogSystem):
    """The embedded default; options: :class:`FileChangelogOptions`."""

    options_type = FileChangelogOptions

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings: FileChangelogOptions = self.parse_settings(name, options)
        self.root = Path(self.settings.path)
        self.segment_bytes = self.settings.segment_bytes
        self.retention_ms = self.settings.delete_retention_ms
        self.fsync = self.settings.fsync
        self._checkpoints = FileCheckpointStore(self.root / "_checkpoints")

    def describe(self) -> str:
        return f"file changelog at {self.root}"

    def inspect_partition(self, stream: str, physical: str, partition: int, partitions: int) -> dict[str, Any]:
        """As ``localstate inspect DIR`` shows it: segments and the writer's pid too."""
        from .inspect import partition_row

        return partition_row(self.partition_dir(physical, partition), str(self.root))

    @classmethod
    def inspect_location(cls, name: str, options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Every file changelog under the directory ``options["path"]``."""
        from .inspect import inspect_directory

        return inspect_directory(Path(options["path"]))

    def count_records(self, stream: str, partition: int, partitions: int, start: int, stop: int) -> int | None:
        from .inspect import count_records

        part = self.open_partition(stream, partition, partitions, readonly=True)
        try:
            return count_records(part, start, stop)
        finally:
            part.close()

    def rescale_strategy(self) -> RescaleStrategy:
        """Stage the new job beside the old one and swap directories (a file system renames)."""
        from .rescale import FileRescale

        return FileRescale()

    def partition_dir(self, stream: str, partition: int) -> Path:
        return self.root / stream / str(partition)

    def stream_partitions(self, stream: str) -> int | None:
        meta = self.root / stream / "stream.json"
        try:
            data = meta.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise io_error(e, "read", meta) from e
        try:
            return int(json.loads(data)["partitions"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{meta} is corrupt ({e}); nothing was changed") from e

    def open_partition(self, stream: str, partition: int, partitions: int, *, readonly: bool = False) -> FileChangelogPartition:
        sdir = self.root / stream
        if not readonly:
            try:
                sdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create changelog directory", sdir) from e
            meta = sdir / "stream.json"
            if meta.exists():
                check_stream_partitions(
                    stream, str(meta), meta.read_bytes(), partitions,
                    "Set job.partitions = {have} (`localstate rescale --to N` changes the count of a stopped "
                    "job), or use a new changelog stream.",
                )
            else:
                try:
                    atomic_write(meta, json.dumps({"partitions": partitions}).encode())
                except OSError as e:
                    raise io_error(e, "write", meta) from e
        if not 0 <= partition < partitions:
            raise ConfigError(f"partition {partition} is out of range for job.partitions = {partitions}")
        return FileChangelogPartition(
            sdir / str(partition),
            stream=stream,
            partition=partition,
            segment_bytes=self.segment_bytes,
            retention_ms=self.retention_ms,
            fsync=self.fsync,
            readonly=readonly,
            snapshots=self.settings.snapshots,
            snapshot_every=self.settings.snapshot_every,
        )

    def checkpoints(self) -> FileCheckpointStore:
        return self._checkpoints
