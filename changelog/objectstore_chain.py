"""The objectstore changelog's log objects: their names (``ObjectName``), the chain a
partition's log is read along (:func:`chain_of`) and slicing decoded batches to an
offset range. Pure functions of names and bytes; the partition in
:mod:`localstate.changelog.objectstore` does the I/O."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localstate.engine import ChangeRecord

from .format import HEADER_SIZE, BatchHeader

__all__ = ["ObjectName", "chain_of", "offsets_of", "slice_batches"]

_LOG_NAME = re.compile(r"^(\d{20})-(\d{20})-(\d{10})\.lsb$")


@dataclass(frozen=True, order=True)
class ObjectName:
    """One log object: records of offsets ``[start, end)`` written by writer ``epoch``."""

    start: int
    end: int
    epoch: int

    @property
    def name(self) -> str:
        return f"{self.start:020d}-{self.end:020d}-{self.epoch:010d}.lsb"

    @classmethod
    def parse(cls, name: str) -> ObjectName | None:
        m = _LOG_NAME.match(name)
        if m is None:
            return None
        start, end, epoch = (int(g) for g in m.groups())
        return cls(start, end, epoch) if end > start else None


def chain_of(objects: list[ObjectName]) -> tuple[list[ObjectName], list[ObjectName]]:
    """The chain from offset 0 (per start: highest epoch, then largest end) and the rest."""
    best: dict[int, ObjectName] = {}
    for o in objects:
        b = best.get(o.start)
        if b is None or (o.epoch, o.end) > (b.epoch, b.end):
            best[o.start] = o
    chain: list[ObjectName] = []
    at = 0
    while at in best:
        chain.append(best[at])
        at = best[at].end
    on = set(chain)
    return chain, [o for o in objects if o not in on]


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
