"""Compaction of a file changelog partition's closed segments, and the tombstone horizon
it records in ``compaction.json`` (snapshots tagged below it are never used)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from localstate.errors import CorruptionError
from localstate.faults import fault_point
from localstate.locking import atomic_write, fsync_dir

from ..format import BatchHeader, check_crc, decode_payload, encode_batch, walk
from .segments import Segment

__all__ = ["HORIZON_FILE", "read_horizon", "write_horizon", "compacted", "replace_segments"]

log = logging.getLogger("localstate.changelog.file")

HORIZON_FILE = "compaction.json"


def read_horizon(directory: Path, compacted_to: int) -> int:
    """The tombstone horizon recorded in ``directory`` (0: none). ``compacted_to``: the end
    offset of the last segment holding a compacted batch, the horizon assumed when the
    file is missing beside compacted batches."""
    p = directory / HORIZON_FILE
    if not p.exists():
        if compacted_to:
            # Compaction always writes this file: compacted batches without it mean it
            # was lost, and with it the tombstone horizon. Assume the worst (every
            # tombstone so far may be gone): no local snapshot below it is used.
            log.warning("changelog %s: compaction.json is missing but segments are compacted; "
                        "local snapshots below offset %d are not trusted (full rebuild)",
                        directory, compacted_to)
            return compacted_to
        return 0
    try:
        return int(json.loads(p.read_text())["tombstone_horizon"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{p} is corrupt ({e}); delete it to force full restores") from e


def write_horizon(directory: Path, horizon: int) -> None:
    atomic_write(directory / HORIZON_FILE, json.dumps({"tombstone_horizon": horizon}).encode())


def compacted(closed: list[Segment], horizon: int, retention_ms: int
              ) -> tuple[dict[str, int], int, list[tuple[Segment, bytes]]]:
    """The ``closed`` segments compacted in memory: the latest record per key kept; a
    tombstone that is the latest for its key is dropped once its batch is older than
    ``retention_ms``, and the horizon moves past it. Offsets of survivors never change.
    Returns the stats, the new horizon and each segment's new bytes."""
    stats = {"segments": len(closed), "records_before": 0, "records_after": 0, "tombstones_dropped": 0}
    latest: dict[bytes, int] = {}
    parsed: list[tuple[Segment, bytes, list[tuple[BatchHeader, Any, Any]]]] = []
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
    new_horizon = horizon
    rewritten: list[tuple[Segment, bytes]] = []
    for seg, _data, batches in parsed:
        out = bytearray()
        for h, records, offs in batches:
            keep_r, keep_o = [], []
            expired = h.timestamp_ms + retention_ms < now_ms
            for o, rec in zip(offs, records):
                stats["records_before"] += 1
                if latest[rec[0]] != o:
                    continue
                if rec[1] is None and expired:
                    stats["tombstones_dropped"] += 1
                    new_horizon = max(new_horizon, o + 1)
                    continue
                keep_r.append(rec)
                keep_o.append(o)
            stats["records_after"] += len(keep_r)
            out += encode_batch(h.base_offset, keep_r, offsets=keep_o, span=h.span, timestamp_ms=h.timestamp_ms)
        rewritten.append((seg, bytes(out)))
    return stats, new_horizon, rewritten


def replace_segments(directory: Path, rewritten: list[tuple[Segment, bytes]]) -> None:
    """Put each segment's compacted bytes in its place (a temporary file renamed over it)."""
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
    fsync_dir(directory)
