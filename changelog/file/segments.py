"""A file changelog partition's segment files (``<base:020d>.log``, batches as
:mod:`localstate.changelog.format` writes them): what an open finds in them, reading
and verifying their batches, and cutting the last one back to an offset.

On open the active (last) segment is verified batch by batch, unless the previous close
left a clean-close claim that still matches it (:mod:`.clean`: then it is taken as
claimed). A torn or corrupt tail is only noted (:class:`Recovered`); a bad batch
followed by a good one is corruption before the tail: :class:`CorruptionError` naming
the file and byte offset. Older segments are walked header by header and CRC-checked
when read."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localstate.errors import CorruptionError
from localstate.locking import io_error
from localstate.records import ChangeRecord

from ..format import (
    FLAG_COMPACTED,
    HEADER_SIZE,
    check_crc,
    decode_payload,
    encode_batch,
    find_valid_batch_after,
    parse_header,
    walk,
)
from .clean import TailClaim, claim_holds

__all__ = ["Segment", "Recovered", "UNKNOWN", "segment_path", "recover_segments", "read_segment",
           "read_with_offsets", "verify_segments", "cut_segment"]

log = logging.getLogger("localstate.changelog.file")

UNKNOWN: Any = object()
"""The last batch's position after a rewrite of the segment (no clean-close claim then)."""


@dataclass
class Segment:
    """One segment file: its base offset, the end offset and byte size of its good batches."""

    base: int
    path: Path
    next_offset: int
    size: int


@dataclass
class Recovered:
    """What an open found in a partition directory: the segments (dense offsets), the
    uncut bad tail ``(segment, byte, offset)`` if any, the byte position of the last
    segment's last batch (None: no batch) and the end offset of the last segment that
    holds a compacted batch."""

    segments: list[Segment] = field(default_factory=list)
    torn: tuple[Path, int, int] | None = None
    last_batch: int | None = UNKNOWN
    compacted_to: int = 0


def segment_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def recover_segments(directory: Path, claim: TailClaim | None, *, readonly: bool) -> Recovered:
    """The segments of ``directory`` as an open finds them (``claim``: the clean-close
    claim taken by a writable open); leftovers of an interrupted compaction are removed
    unless ``readonly``."""
    found = Recovered()
    if not directory.exists():
        return found
    if not readonly:
        for leftover in directory.glob("*.compacting"):
            leftover.unlink()
    paths = sorted(directory.glob("*.log"))
    for i, path in enumerate(paths):
        try:
            base = int(path.stem)
        except ValueError:
            raise CorruptionError(f"unexpected file {path} in changelog directory; move it away") from None
        last = i == len(paths) - 1
        if last and claim is not None and claim_holds(path, base, claim):
            seg = Segment(base, path, claim.next_offset, claim.size)
            found.last_batch = claim.last_batch
            found.compacted_to = max(found.compacted_to, claim.compacted_to)
            log.debug("changelog %s: active segment as the clean close left it (not re-read)", directory)
        elif last:
            seg = _scan_active_segment(path, base, found, readonly=readonly)
        else:
            seg = _walk_older_segment(path, base, found)
        if found.segments and found.segments[-1].next_offset != base:
            raise CorruptionError(
                f"changelog {directory}: offsets {found.segments[-1].next_offset}..{base - 1} are missing "
                f"(a segment before {path.name} was deleted or truncated); nothing was changed. Restore "
                "the file from a backup, or give up the store's state explicitly with "
                "`localstate restore --reset STORE` (docs: RELIABILITY.md, operator damage)."
            )
        found.segments.append(seg)
    return found


def _scan_active_segment(path: Path, base: int, found: Recovered, *, readonly: bool) -> Segment:
    """The active segment batch by batch with CRCs, noting a torn tail in ``found``."""
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
            found.torn = (path, pos, next_offset)
            if readonly:
                log.warning("changelog %s: torn tail at byte %d ignored (read-only)", path, pos)
            break
        next_offset = h.next_offset
        good_end = h.end_position
        last_batch = pos
        if h.flags & FLAG_COMPACTED:
            found.compacted_to = max(found.compacted_to, h.next_offset)
    found.last_batch = last_batch
    return Segment(base, path, next_offset, good_end)


def _walk_older_segment(path: Path, base: int, found: Recovered) -> Segment:
    """An older segment on open, from its batch headers alone (offsets dense, sizes
    within the file, compaction flags); payload CRCs are checked when batches are
    read, so an open does not read the whole log."""
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
                    found.compacted_to = max(found.compacted_to, next_offset)
                pos = end
    except OSError as e:
        raise io_error(e, "read", path) from e
    return Segment(base, path, next_offset, pos)


def read_segment(seg: Segment, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
    """The records of ``seg`` in ``[start, stop)``, batch by batch with each batch's bytes;
    every batch read is CRC-checked."""
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


def read_with_offsets(segments: list[Segment], start: int, stop: int) -> Iterator[tuple[int, bytes, bytes | None]]:
    """``(offset, key, value)`` of the records in ``[start, stop)``, for inspection tools."""
    for seg in segments:
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


def verify_segments(segments: list[Segment], torn: Path | None) -> dict[str, Any]:
    """Every batch of every segment checked (CRC32, dense offsets), nothing changed;
    ``torn``: the segment whose bad tail the open noted (named a torn tail, not corrupt)."""
    problems: list[str] = []
    batches = records = nbytes = 0
    expect: int | None = None
    for seg in segments:
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
                what = "torn tail" if torn == seg.path else "corrupt batch"
                problems.append(f"{seg.path}: {what} at byte {pos} (offset {nxt})")
                break
            batches += 1
            records += h.span
            nxt = h.next_offset
        expect = nxt
    return {"segments": len(segments), "batches": batches, "records": records, "bytes": nbytes,
            "problems": problems}


def cut_segment(seg: Segment, offset: int) -> None:
    """Cut ``seg`` back to end at ``offset`` (inside it or at its end), durably: the batch
    holding ``offset`` is written again with only its records before it."""
    data = seg.path.read_bytes()[: seg.size]
    cut, redo = seg.size, []
    for h, pos in walk(data):
        if h is None or h.next_offset <= offset:
            continue
        cut = pos
        if h.base_offset < offset:
            records, offsets = decode_payload(data, h, str(seg.path))
            offs = offsets if offsets is not None else range(h.base_offset, h.next_offset)
            kept = [r for r, o in zip(records, offs) if o < offset]
            if offsets is not None:
                kept_offs = [o for o in offs if o < offset]
                redo = [encode_batch(h.base_offset, kept, offsets=kept_offs, span=offset - h.base_offset,
                                     timestamp_ms=h.timestamp_ms)]
            else:
                redo = [encode_batch(h.base_offset, kept, timestamp_ms=h.timestamp_ms)]
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
    seg.next_offset = offset
