"""The objectstore changelog's log objects: their names (``ObjectName``), the chain a
partition's log is read along (:func:`chain_of`) and slicing decoded batches to an
offset range. Pure functions of names and bytes; the partition in
:mod:`localstate.changelog.objectstore` does the I/O."""

from __future__ import annotations

import re
from bisect import bisect_right, insort
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from localstate.engine import ChangeRecord

from ..format import HEADER_SIZE, BatchHeader

__all__ = ["ObjectName", "chain_of", "foreign_objects", "offsets_of", "slice_batches"]

_LOG_NAME = re.compile(r"^(\d{20})-(\d{20})-(\d{10})\.lsb$")


@dataclass(frozen=True, order=True)
class ObjectName:
    """One log object: records of offsets ``[start, end)`` written by writer ``epoch``.

    On a chain, an object may be used only up to ``end`` while it holds records up to
    ``stored_end`` (0: up to ``end``): see :func:`chain_of`. Its key is always the
    stored object's."""

    start: int
    end: int
    epoch: int
    stored_end: int = 0

    @property
    def full_end(self) -> int:
        """Where the stored object's records end."""
        return self.stored_end or self.end

    @property
    def whole(self) -> ObjectName:
        """The stored object (itself unless cut on a chain)."""
        return ObjectName(self.start, self.full_end, self.epoch) if self.stored_end else self

    @property
    def name(self) -> str:
        return f"{self.start:020d}-{self.full_end:020d}-{self.epoch:010d}.lsb"

    @classmethod
    def parse(cls, name: str) -> ObjectName | None:
        m = _LOG_NAME.match(name)
        if m is None:
            return None
        start, end, epoch = (int(g) for g in m.groups())
        return cls(start, end, epoch) if end > start else None


def chain_of(objects: list[ObjectName]) -> tuple[list[ObjectName], list[ObjectName]]:
    """The chain from offset 0 (per start: highest epoch, then largest end) and the rest
    (stored objects not on it).

    An object is used only up to the first offset where an object of a newer writer
    epoch starts: a newer writer starts writing at the offset its predecessor committed
    (or rewrites committed records whole), so whatever an older writer holds from there
    on was never committed — an uncommitted tail, or the late upload of a fenced
    instance (a roll-up by a zombie reaching past its last commit). Such an object enters
    the chain cut at that offset (``stored_end`` keeps its key)."""
    pieces = []
    newer_starts: list[int] = []  # starts of the objects of every epoch above the current one
    by_epoch = sorted(objects, key=lambda o: -o.epoch)
    i = 0
    while i < len(by_epoch):
        epoch = by_epoch[i].epoch
        j = i
        while j < len(by_epoch) and by_epoch[j].epoch == epoch:
            o = by_epoch[j]
            k = bisect_right(newer_starts, o.start)
            cut = newer_starts[k] if k < len(newer_starts) else o.end
            pieces.append(o if cut >= o.end else replace(o, end=cut, stored_end=o.end))
            j += 1
        for o in by_epoch[i:j]:
            insort(newer_starts, o.start)
        i = j
    best: dict[int, ObjectName] = {}
    for o in pieces:
        b = best.get(o.start)
        if b is None or (o.epoch, o.end) > (b.epoch, b.end):
            best[o.start] = o
    chain: list[ObjectName] = []
    at = 0
    while at in best:
        chain.append(best[at])
        at = best[at].end
    on = {o.whole for o in chain}
    return chain, [o for o in objects if o not in on]


def foreign_objects(chain: list[ObjectName], objects: list[ObjectName]) -> list[ObjectName]:
    """The stored objects that hold offsets where the chain reads a newer writer's object:
    records an older writer uploaded but never committed (a fenced instance's late uploads,
    an earlier instance's uncommitted tail). Objects overlapped only by chain pieces of
    their own epoch or older (the chain's, roll-up parts left behind) are not; an older
    writer's object that a newer writer's compaction replaced but failed to delete counts
    (conservatively: it costs one rebuild from the log)."""
    starts = [o.start for o in chain]
    out = []
    for o in objects:
        i = max(0, bisect_right(starts, o.start) - 1)
        while i < len(chain) and chain[i].start < o.full_end:
            piece = chain[i]
            if piece.end > o.start and piece.epoch > o.epoch:
                out.append(o)
                break
            i += 1
    return out


def offsets_of(h: BatchHeader, offsets: list[int] | None) -> Any:
    return offsets if offsets is not None else range(h.base_offset, h.next_offset)


def slice_batches(batches: Iterator[tuple[BatchHeader, list[ChangeRecord], list[int] | None]],
           start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
    """The records of ``batches`` with offsets in ``[start, stop)``, with each batch's size."""
    for h, records, offsets in batches:
        if h.next_offset <= start:
            continue
        if h.base_offset >= stop:
            return
        nbytes = HEADER_SIZE + h.payload_len
        base = h.base_offset
        if offsets is None:
            lo, hi = max(0, start - base), min(len(records), stop - base)
            part = records if (lo == 0 and hi == len(records)) else records[lo:hi]
        elif offsets and offsets[0] >= start and offsets[-1] < stop:
            part = records
        else:
            part = tuple(r for r, o in zip(records, offsets) if start <= o < stop)  # type: ignore[assignment]
        if part:
            yield part, nbytes  # type: ignore[misc]
