"""One partition of the object-store changelog: :class:`ObjectStoreChangelogPartition`, its
log as a chain of immutable objects (:mod:`.chain`) — append and flush, roll-up, read,
tail cut, reset, compaction — and its shipped snapshots. docs/design/objectstore.md
states the rules."""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localstate.engine import ChangeRecord
from localstate.errors import ChangelogError, CorruptionError, FencedError
from localstate.faults import fault_point

from ..base import ChangelogPartition, CurrentFn
from ..format import BatchEncoder, BatchHeader, check_crc, decode_payload, encode_batch, walk
from ..snapshots import RemoteSnapshots
from .chain import ObjectName, chain_of, foreign_objects, offsets_of, slice_batches
from .client import MISSING

if TYPE_CHECKING:
    from .system import ObjectStoreChangelogSystem

__all__ = ["ObjectStoreChangelogPartition"]

log = logging.getLogger("localstate.changelog.objectstore")

_HORIZON_NAME = re.compile(r"^horizon-(\d{20})$")
_PREFETCH = 8  # objects fetched ahead during restore ...
_PREFETCH_BYTES = 64 * 1024 * 1024  # ... and at most this many bytes of them (beyond the first)


class _ObjectGone(CorruptionError):
    """A listed object of the chain is no longer in the store."""


@dataclass
class _Written:
    """An object of the chain this writer uploaded (level 0 = one flush)."""

    name: ObjectName
    size: int
    level: int
    data: bytes | None  # kept for level 0 until rolled up (saves the GET)


class ObjectStoreChangelogPartition(ChangelogPartition):
    """One changelog partition as a chain of immutable objects. ``readonly=True`` claims no
    writer epoch and never writes (for inspection beside a live task)."""

    def __init__(self, system: ObjectStoreChangelogSystem, stream: str, partition: int, *,
                 readonly: bool = False) -> None:
        self.system = system
        self.store = system.store
        self.generation = system.generation()
        self.logical_stream = stream
        self.stream = stream = self.generation.stream(stream)
        self.partition = partition
        self.readonly = readonly
        self._horizon = 0  # the largest horizon-<offset> marker a reset left
        self.prefix = f"{stream}/{partition}"
        self.log_prefix = f"{self.prefix}/log"
        self._closed = False
        self._buffer = bytearray()
        self._encoder = BatchEncoder()  # the append path's reused batch buffer
        self._buffer_start = 0
        self.epoch = 0
        self._chain: list[ObjectName] = []
        self._others: list[ObjectName] = []  # listed objects not on the chain
        self._sizes: dict[ObjectName, int] = {}
        self._written: list[_Written] = []
        self._snapshots = RemoteSnapshots(self.store, self.prefix, self.describe(), system.settings.snapshot_every)
        self._load()
        if not readonly:
            # The writer epoch is the task instance's claim in its checkpoint sequence: one
            # order for both, so the instance whose objects win the chain is the one whose
            # claim fenced the other's commits.
            self.epoch = system.checkpoints().claim(system.job, partition)
            newest = max((o for o in (*self._chain, *self._others)), key=lambda o: o.epoch, default=None)
            if newest is not None and newest.epoch >= self.epoch:
                # Objects of a writer not older than this instance's claim: a newer instance
                # took over (then this one is fenced), or the checkpoint sequence was deleted
                # or another job writes this stream (then claim above them; opening the task
                # then refuses a log that no checkpoint explains).
                self.epoch = system.checkpoints().claim_above(system.job, partition, newest.epoch + 1,
                                                              why=self.store.where(self._key(newest)))
        self._end = self._chain[-1].end if self._chain else 0
        self._buffer_start = self._end

    # -- the chain -----------------------------------------------------------------------
    def _load(self) -> None:
        objects: list[ObjectName] = []
        for name, size in self.store.list(self.log_prefix):
            horizon = _HORIZON_NAME.match(name)
            if horizon is not None:
                self._horizon = max(self._horizon, int(horizon.group(1)))
                continue
            parsed = ObjectName.parse(name)
            if parsed is None:
                raise CorruptionError(
                    f"unexpected object {self.store.where(self.log_prefix + '/' + name)} in the changelog of "
                    f"{self.describe()}; nothing was changed. Move it away"
                )
            objects.append(parsed)
            self._sizes[parsed] = size
        self._chain, self._others = chain_of(objects)
        for o in self._chain:
            self._sizes[o] = self._sizes[o.whole]
        self._foreign = foreign_objects(self._chain, objects)

    def _key(self, o: ObjectName) -> str:
        return f"{self.log_prefix}/{o.name}"

    def describe(self) -> str:
        return f"objectstore changelog {self.store.where(self.prefix)}"

    def _check_writable(self) -> None:
        if self._closed:
            raise ChangelogError(f"{self.describe()} is closed")
        if self.readonly:
            raise ChangelogError(f"{self.describe()} was opened read-only")

    # -- writing -------------------------------------------------------------------------
    def append(self, records: list[ChangeRecord]) -> None:
        if not records:
            return
        self._check_writable()
        fault_point("changelog.append")
        try:
            self._encoder.write_plain(self._end, records, self._buffer.extend)
        except (TypeError, ValueError) as e:
            raise ChangelogError(f"{self.describe()}: records must be (bytes, bytes | None) pairs: {e}") from e
        self._end += len(records)

    def flush(self) -> int:
        """Upload the records appended since the last flush as one object; returns the end
        offset once the PUT succeeded (raises :class:`ChangelogError` otherwise, and the
        records stay buffered: nothing of them counts as written)."""
        self._check_writable()
        if not self._buffer:
            return self._end
        name = ObjectName(self._buffer_start, self._end, self.epoch)
        data = bytes(self._buffer)
        self.store.put(self._key(name), data)
        fault_point("objectstore.after_put")
        self._buffer.clear()
        self._buffer_start = self._end
        self._chain.append(name)
        self._sizes[name] = len(data)
        self._written.append(_Written(name, len(data), 0, data))
        return self._end

    def _newer_instance(self) -> str | None:
        """The claim or checkpoint a newer instance of the task made after this one's (one
        LIST), None if there is none. Checked before every change a newer owner could see
        (a roll-up, a delete): a fenced instance changes nothing. An instance can still be
        fenced right after the check; what it then lands is harmless by construction (a
        roll-up holds committed records only, a late object never enters a newer chain)."""
        return self.system.checkpoints().newer_claim(self.system.job, self.partition)

    def _refuse_if_fenced(self, what: str) -> None:
        newer = self._newer_instance()
        if newer is not None:
            raise FencedError(
                f"{self.describe()}: not {what}: a newer instance of the task took over (claim {newer}), so "
                "this one must stop without changing anything. Nothing was changed"
            )

    def after_commit(self, offset: int) -> None:
        """The task committed this partition up to ``offset`` (its checkpoint is written):
        roll up the objects this writer uploaded below it. Roll-ups run only here, so an
        object a writer rewrites never holds a record past its last commit: an instance
        fenced before its checkpoint rolls up nothing, and a roll-up of a zombie that
        lands late holds only records its own commits made. Best effort (a failure leaves
        the parts as they are)."""
        if self.readonly or self._closed:
            return
        try:
            self._roll_up(offset)
        except (ChangelogError, CorruptionError) as e:
            log.warning("%s: roll-up not done (%s); the objects stay as they are", self.describe(), e)

    def _roll_up(self, committed: int) -> None:
        """Merge the last ``rollup.objects`` written objects of one level (all below
        ``committed``) into one of the next level, as long as that keeps it under
        ``rollup.bytes`` (tiered, so a record is rewritten once per level)."""
        s = self.system.settings
        n = s.rollup_objects
        checked = False
        while len(self._written) >= n:
            group = self._written[-n:]
            level = group[0].level
            if any(w.level != level for w in group) or group[-1].name.end > committed:
                return
            size = sum(w.size for w in group)
            if size > s.rollup_bytes:
                self._written = self._written[-1:] if self._written[-1].level == 0 else []
                return
            if not checked:
                if self._newer_instance() is not None:
                    log.warning("%s: no roll-up: a newer instance of the task took over", self.describe())
                    return
                checked = True
            data = b"".join(w.data if w.data is not None else self._get(w.name) for w in group)
            merged = ObjectName(group[0].name.start, group[-1].name.end, self.epoch)
            self.store.put(self._key(merged), data)
            fault_point("objectstore.rollup.after_put")
            # the merged object wins the chain at its start (same epoch, larger end); the
            # parts are garbage from here on, so a failed delete only leaves garbage
            try:
                i = self._chain.index(group[0].name)
            except ValueError:
                return
            self._chain[i:i + n] = [merged]
            self._sizes[merged] = len(data)
            self._written[-n:] = [_Written(merged, len(data), level + 1, None)]
            newer = self._newer_instance()
            if newer is not None:
                log.warning("%s: rolled-up objects not deleted: a newer instance of the task took over (%s); "
                            "they are garbage", self.describe(), newer)
                return
            try:
                self.store.delete([self._key(w.name) for w in group])
            except ChangelogError as e:
                log.warning("%s: rolled-up objects not deleted (%s); they are garbage", self.describe(), e)

    def end_offset(self) -> int:
        return self._end

    # -- reading -------------------------------------------------------------------------
    def _get(self, o: ObjectName) -> bytes:
        key = self._key(o)
        try:
            return self.store.get(key)
        except MISSING as e:
            raise _ObjectGone(
                f"{self.describe()}: object {self.store.where(key)} (offsets {o.start}..{o.end - 1}) is missing "
                "(deleted while listed?). Nothing was changed. Restore it from a backup or a bucket version; "
                "or give up the store's state with `localstate restore --reset STORE`"
            ) from e

    def _decode(self, o: ObjectName, data: bytes) -> Iterator[tuple[BatchHeader, list[ChangeRecord], list[int] | None]]:
        """``(header, records, offsets)`` per batch, every CRC and offset checked; offsets is
        None for a plain batch (dense from the header's base offset)."""
        where = f"object {self.store.where(self._key(o))}"
        expect = o.start
        for h, pos in walk(data):
            if h is None or not check_crc(data, h) or h.base_offset != expect:
                raise CorruptionError(
                    f"{self.describe()}: {where} is corrupt at byte {pos} of {len(data)} (offset {expect}: "
                    f"{'torn or truncated' if h is None else 'CRC mismatch' if not check_crc(data, h) else 'wrong offset'}). "
                    "Nothing was changed. Restore the object from a backup or a bucket version; or give up "
                    "the store's state with `localstate restore --reset STORE`"
                )
            records, offsets = decode_payload(data, h, where)
            yield h, records, offsets
            expect = h.next_offset
        if expect != o.full_end:
            raise CorruptionError(
                f"{self.describe()}: {where} ends at offset {expect} but its name says {o.full_end} (truncated "
                "upload?). Nothing was changed. Restore the object from a backup or a bucket version; or give "
                "up the store's state with `localstate restore --reset STORE`"
            )

    def read_batches(self, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        """The records of ``[start, stop)``. A chain object that is gone when fetched (the
        previous instance of the task rolled it into a larger object after this one listed
        the log) makes the chain be listed again once, and the read goes on from there."""
        stop = min(stop, self._end)
        if start >= stop:
            return
        uploaded_end = min(stop, self._buffer_start)
        pos = start
        relisted = False
        while pos < uploaded_end:
            try:
                for o, data in self._fetch_ahead(self._covering(pos, uploaded_end)):
                    yield from slice_batches(self._decode(o, data), pos, min(stop, o.end))
                    pos = min(o.end, uploaded_end)
            except _ObjectGone:
                if relisted or self._written:
                    raise
                relisted = True
                self._load()
        if stop > self._buffer_start and self._buffer:
            tail = ObjectName(self._buffer_start, self._end, self.epoch)
            yield from slice_batches(self._decode(tail, bytes(self._buffer)), start, stop)

    def _covering(self, start: int, stop: int) -> list[ObjectName]:
        """The chain objects that hold ``[start, stop)``; an error naming the first missing
        offset if they do not (the chain was listed again and has a gap)."""
        wanted = [o for o in self._chain if o.end > start and o.start < stop]
        at = start
        for o in wanted:
            if o.start > at:
                break
            at = o.end
        if at < stop:
            raise CorruptionError(
                f"{self.describe()}: no object under {self.store.where(self.log_prefix)}/ holds offset {at} "
                f"({at:020d}-*.lsb is missing). Nothing was changed. Restore the objects from a backup or a "
                "bucket version; or give up the store's state with `localstate restore --reset STORE`"
            )
        return wanted

    def _fetch_ahead(self, objects: list[ObjectName]) -> Iterator[tuple[ObjectName, bytes]]:
        """``(object, bytes)`` in order, fetched ahead (a GET's latency dominates small
        objects), at most ``_PREFETCH`` objects and ``_PREFETCH_BYTES`` beyond the first."""
        with ThreadPoolExecutor(max_workers=_PREFETCH) as pool:
            pending: deque[tuple[ObjectName, Future[bytes]]] = deque()
            inflight = 0
            todo = iter(objects)
            upcoming = next(todo, None)
            while pending or upcoming is not None:
                while upcoming is not None and len(pending) < _PREFETCH and (
                    not pending or inflight + self._sizes.get(upcoming, 0) <= _PREFETCH_BYTES
                ):
                    pending.append((upcoming, pool.submit(self._get, upcoming)))
                    inflight += self._sizes.get(upcoming, 0)
                    upcoming = next(todo, None)
                o, future = pending.popleft()
                data = future.result()
                inflight -= self._sizes.get(o, 0)
                yield o, data

    def read_with_offsets(self, start: int, stop: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """``(offset, key, value)`` for inspection tools."""
        for o in self._chain:
            if o.end <= start or o.start >= min(stop, self._end):
                continue
            for h, records, offsets in self._decode(o, self._get(o)):
                for off, (k, v) in zip(offsets_of(h, offsets), records):
                    if start <= off < min(stop, o.end):
                        yield off, k, v

    # -- tail, reset, compaction ---------------------------------------------------------
    def missing_committed(self, committed: int) -> CorruptionError:
        later = sorted(o for o in self._others if o.start >= self._end)
        after = f"; objects exist from offset {later[0].start} on, so the object starting at {self._end} is missing" if later else ""
        return CorruptionError(
            f"{self.describe()}: the task checkpoint says offset {committed} was committed, but the chain of "
            f"objects under {self.store.where(self.log_prefix)}/ ends at offset {self._end} (no object "
            f"{self.store.where(self.log_prefix)}/{self._end:020d}-*.lsb){after}. Nothing was changed. Restore "
            "the objects from a backup or a bucket version; or keep what is readable with `localstate restore "
            "--accept-log-end STORE`, or give up the store's state with `localstate restore --reset STORE`."
        )

    def discard_tail(self, committed_offset: int, current: CurrentFn) -> None:
        """Delete every object at or past ``committed_offset`` (any epoch: uncommitted tails
        of earlier instances); an object that straddles it is first rewritten, by this
        writer's newer epoch, as its committed prefix."""
        self._check_writable()
        c = committed_offset
        if c > self._end:
            raise self.missing_committed(c)
        self._buffer.clear()
        # a newer instance may have taken over while this one restored: then its tail,
        # snapshots and horizon are not this instance's to change
        self._refuse_if_fenced("discarding the uncommitted tail")
        # manifests first: a snapshot of records about to be discarded must never be used
        self._snapshots.delete_past(c)
        doomed = [o for o in (*self._chain, *self._others) if o.start >= c]
        tail_end = max((o.full_end for o in (*self._chain, *self._others)), default=0)
        if tail_end > c:
            # The offsets [c, tail_end) are written again by this task; a *local* snapshot
            # of the discarded tail on a machine this one cannot reach is tagged with one of
            # them and would pass for committed state once the log grows past it.
            self._set_horizon(tail_end + 1)
        if self._foreign:
            # recorded before the objects go: the horizon must outlive them
            self._set_horizon(self.min_valid_snapshot_offset())
            on_chain = {o.whole for o in self._chain}
            doomed += [o for o in self._foreign if o not in on_chain and o.start < c]
            self._foreign = []
        keep = [o for o in self._chain if o.start < c]
        if keep and keep[-1].end > c:
            cut = keep[-1]
            prefix = bytearray()
            for h, records, offsets in self._decode(cut, self._get(cut)):
                if h.base_offset >= c:
                    break
                if offsets is None:
                    prefix += encode_batch(h.base_offset, records[: c - h.base_offset], timestamp_ms=h.timestamp_ms)
                else:
                    kept = [(r, o) for r, o in zip(records, offsets) if o < c]
                    prefix += encode_batch(h.base_offset, [r for r, _ in kept], offsets=[o for _, o in kept],
                                           span=min(h.span, c - h.base_offset), timestamp_ms=h.timestamp_ms)
            replaced = ObjectName(cut.start, c, self.epoch)
            self.store.put(self._key(replaced), bytes(prefix))
            self._sizes[replaced] = len(prefix)
            keep[-1] = replaced
            doomed.append(cut)
        fault_point("objectstore.discard_tail.before_delete")
        self.store.delete([self._key(o) for o in doomed])
        if c < self._end:
            log.info("%s: discarded uncommitted tail [%d, %d)", self.describe(), c, self._end)
        self._chain = keep
        self._others = [o for o in self._others if o.start < c]
        self._written = []
        self._end = self._buffer_start = c

    def reset(self) -> int:
        """Replace the log by one object holding no records for ``[0, end)``: a restore
        then yields an empty state, and offsets never go back. A ``horizon-<end + 1>``
        marker, written first, keeps every local copy of the state before the reset from
        being loaded (one on another machine, tagged with an offset at or below ``end``,
        would otherwise come back whole: replaying the empty log changes nothing)."""
        self._check_writable()
        self._refuse_if_fenced("resetting the log")
        self._buffer.clear()
        end = self._end = self._buffer_start = max(self._end, self._chain[-1].end if self._chain else 0)
        self._set_horizon(end + 1)
        if end:
            empty = ObjectName(0, end, self.epoch)
            self.store.put(self._key(empty), encode_batch(0, [], offsets=[], span=end))
            old = [o for o in (*self._chain, *self._others) if o.whole != empty]
            self._snapshots.delete_past(-1)
            self.store.delete([self._key(o) for o in old])
            self._chain, self._others, self._written = [empty], [], []
        return end

    def _set_horizon(self, horizon: int) -> None:
        """Record (create, immutable) that no local snapshot below ``horizon`` may be loaded."""
        if horizon > self._horizon:
            self.store.put(f"{self.log_prefix}/horizon-{horizon:020d}", b"")
            self._horizon = horizon

    def min_valid_snapshot_offset(self) -> int:
        """0 (compaction keeps tombstones), unless a reset or a rescale set a horizon, or
        the log holds objects of an older writer where a newer one wrote (a fenced
        instance's uploads, an old uncommitted tail): the old writer's machine may hold a
        local snapshot tagged with such an object's end, built from records that were never
        committed, so no local snapshot at or below their end may be loaded."""
        foreign = max((o.full_end + 1 for o in self._foreign), default=0)
        return max(self._horizon, foreign, self.generation.horizon(self.logical_stream, self.partition))

    def log_id(self) -> str:
        """The identity of the stream this partition belongs to (``stream.json``'s ``id``):
        a local copy built from a deleted and re-created stream is not this log's."""
        return self.system.stream_id(self.stream)

    def verify(self) -> dict[str, Any]:
        """Read every object of the chain back (CRC32 of every batch, dense offsets)."""
        problems: list[str] = []
        batches = records = nbytes = 0
        for o in self._chain:
            try:
                data = self._get(o)
                nbytes += len(data)
                for _, recs, _ in self._decode(o, data):
                    batches += 1
                    records += len(recs)
            except CorruptionError as e:
                problems.append(str(e))
        return {"objects": len(self._chain), "garbage_objects": len(self._others), "batches": batches,
                "records": records, "bytes": nbytes, "end_offset": self._end, "problems": problems}

    def compact(self, up_to: int, *, relisted: bool = False) -> dict[str, int]:
        """Rewrite the chain's objects that end at or below ``up_to`` as one object holding the
        latest record per key (tombstones kept: no local snapshot is invalidated), offsets
        unchanged; then delete the old objects."""
        self._check_writable()
        head = []
        for o in self._chain:
            if o.end > up_to:
                break
            head.append(o)
        stats = {"objects": len(head), "records_before": 0, "records_after": 0}
        if len(head) < 2:
            return stats
        self._refuse_if_fenced("compacting")
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        try:
            for o in head:
                for h, recs, offsets in self._decode(o, self._get(o)):
                    for off, (k, v) in zip(offsets_of(h, offsets), recs):
                        if off >= o.end:
                            break  # past where the chain uses the object
                        latest[k] = (off, v)
                        stats["records_before"] += 1
        except _ObjectGone:
            # Deleted since this writer listed the log: by a newer owner (then this one is
            # fenced), or by the late delete of a fenced predecessor that passed its check
            # just before this writer took over (its objects were rewritten, whole, into one
            # that is listed now): list again and compact what is there.
            self._refuse_if_fenced("compacting")
            if relisted:
                raise
            self._load()
            return self.compact(up_to, relisted=True)
        survivors = sorted((off, k, v) for k, (off, v) in latest.items())
        stats["records_after"] = len(survivors)
        end = head[-1].end
        data = encode_batch(0, [(k, v) for _, k, v in survivors], offsets=[o for o, _, _ in survivors], span=end)
        merged = ObjectName(0, end, self.epoch)
        self.store.put(self._key(merged), data)
        self._sizes[merged] = len(data)
        fault_point("compaction.before_rename")
        # the upload above may land after a takeover: it holds committed records only
        self._refuse_if_fenced("deleting the compacted objects")
        self.store.delete([self._key(o) for o in head if o.whole != merged])
        self._chain[: len(head)] = [merged]
        self._written = [w for w in self._written if w.name.start >= end]
        return stats

    # -- snapshots (kept remotely by RemoteSnapshots) ----------------------------------------
    def upload_snapshot(self, engine: Any, offset: int) -> bool:
        """After a commit at ``offset`` (the task calls it once its checkpoint is written):
        :meth:`after_commit`, then ship the engine's snapshot at ``offset`` when it took
        one there or ``snapshot.every`` commits passed (:meth:`RemoteSnapshots.ship`),
        unless a newer instance took over. True if uploaded."""
        self.after_commit(offset)
        if self.readonly:
            return False
        return self._snapshots.ship(engine, offset, self.epoch, self._newer_instance)

    def shipped_snapshots(self) -> list[int]:
        return self._snapshots.offsets()

    def fetch_snapshot(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: put the newest usable remote snapshot among the engine's local
        ones (see :meth:`RemoteSnapshots.fetch`)."""
        return self._snapshots.fetch(engine, committed, min_valid)

    def close(self) -> None:
        """Release the partition (idempotent). Does not flush: buffered records were never
        uploaded, so they are uncommitted by definition."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        self.system._release(self.logical_stream, self.partition)
