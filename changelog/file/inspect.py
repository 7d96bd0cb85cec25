"""``localstate inspect`` of file changelogs: what a directory holds, read-only.

Safe beside live tasks (no lock taken, nothing written): every task checkpoint under a
``_checkpoints/<job>/`` directory, and every partition of every stream (a directory with a
``stream.json``): segments, end offset, records (after compaction fewer than the
offsets), bytes, tombstone horizon, shipped snapshots and the pid of a live writer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from localstate.checkpoint import Checkpoint
from localstate.errors import LocalStateError

from ..base import NOTHING_WRITTEN, UNREADABLE
from ..format import FLAG_COMPACTED, decode_payload, walk

__all__ = ["count_records", "inspect_directory", "partition_row"]


def count_records(part: Any, start: int = 0, stop: int | None = None) -> int:
    """Records the file changelog partition ``part`` holds at offsets ``[start, stop)``.

    After compaction this is far fewer than ``stop - start`` (compacted batches keep
    their offset span but only the surviving records), which is why a progress bar
    sized by offsets stalls. Reads batch headers only, decoding just the compacted
    batches, whose offsets are sparse; stops at a torn tail, past which nothing is read.
    """
    stop = part.end_offset() if stop is None else stop
    total = 0
    for base, next_offset, seg in part.segments():
        if next_offset <= start or base >= stop:
            continue
        data = seg.read_bytes()
        for h, _pos in walk(data):
            if h is None:
                break
            if h.next_offset <= start or h.base_offset >= stop:
                continue
            if h.flags & FLAG_COMPACTED:
                _records, offsets = decode_payload(data, h, str(seg))
                total += sum(1 for o in offsets or () if start <= o < stop)
            else:
                total += min(h.next_offset, stop) - max(h.base_offset, start)
    return total


def partition_row(pdir: Path, root: str) -> dict[str, Any]:
    """One partition directory's row: segments, end offset, the records it holds, bytes,
    horizon, shipped snapshots, and the pid of a live writer."""
    from localstate.inspect import lock_holder

    from .partition import FileChangelogPartition

    row: dict[str, Any] = {"stream": pdir.parent.name, "partition": int(pdir.name), "path": str(pdir),
                           "root": root, "locked_by": lock_holder(pdir / ".lock")}
    if not pdir.is_dir():
        return {**row, **NOTHING_WRITTEN}
    try:
        part = FileChangelogPartition(pdir, readonly=True)
        try:
            row.update(segments=len(part.segments()), end_offset=part.end_offset(), records=count_records(part),
                       bytes=part.size_bytes(), tombstone_horizon=part.min_valid_snapshot_offset(),
                       shipped_snapshots=part.shipped_snapshots())
        finally:
            part.close()
    except LocalStateError as e:
        row.update(UNREADABLE, error=str(e))
    return row


def inspect_directory(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"checkpoints": [...], "partitions": [...]}`` of every file changelog under
    ``path``; each row's ``root`` is the changelog root holding it, relative to ``path``."""
    from localstate.inspect import relative_root

    report: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "partitions": []}
    for ck in sorted(path.glob("**/_checkpoints/*/partition-*.ckpt")):
        row: dict[str, Any] = {"job": ck.parent.name, "partition": int(ck.stem.split("-")[1]), "path": str(ck),
                               "root": relative_root(path, ck.parents[2])}
        try:
            c = Checkpoint.from_bytes(_read_live(ck), where=str(ck))
            row.update(version=c.version, input_position=c.input_position, offsets=dict(c.offsets),
                       epoch=c.epoch, written_at=c.written_at)
        except LocalStateError as e:
            row["error"] = str(e)
        except FileNotFoundError:
            continue  # removed since the glob (a store wiped by its task): nothing to report
        report["checkpoints"].append(row)
    for meta in sorted(path.glob("**/stream.json")):
        sdir = meta.parent
        for pdir in sorted((d for d in sdir.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)):
            report["partitions"].append(partition_row(pdir, relative_root(path, sdir.parent)))
    return report


def _read_live(path: Path, attempts: int = 20) -> bytes:
    """Read a file a live task replaces by rename: a checkpoint is absent for a moment
    between its two renames (``current -> prev``, ``tmp -> current``), so retry briefly."""
    for attempt in range(attempts):
        try:
            return path.read_bytes()
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.005)
    raise AssertionError("unreachable")
