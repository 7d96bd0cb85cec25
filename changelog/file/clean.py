"""The file changelog's clean-close claim: what lets an open skip re-reading the active segment.

An open verifies the active (last) segment batch by batch to find a torn tail (a crash
mid-append). A task opened once per micro-batch re-read and CRC-checked its whole
active segment every time — up to ``segment.bytes`` (64 MiB) per open, growing as the
segment fills. A partition closed **cleanly** (every appended batch flushed, no torn
tail noted, nothing rewritten since the tail was last known) leaves ``clean.json``
naming the segment, its size, mtime and inode, its end offset and where its last
batch starts. The next writable open **removes the claim first** (it holds the
partition lock, so nothing has written since the close) and uses it only if all of
that still matches the file and the last batch parses, ends exactly at the claimed
size with the claimed end offset and passes its CRC; anything else (no claim, a
damaged one, a file changed since) takes the full verification as before.

The claim is written without fsync on purpose: a claim lost in a machine crash only
costs the next open a full scan, and a half-written one does not parse. A claim that
survived a crash which undid its removal describes a file that was appended to (or cut)
since, so size, mtime and the last batch no longer match. Read-only opens (``inspect``)
neither use nor remove it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..format import check_crc, parse_header

__all__ = ["CLAIM_NAME", "TailClaim", "take_claim", "leave_claim", "claim_holds"]

log = logging.getLogger("localstate.changelog.file")

CLAIM_NAME = "clean.json"


@dataclass(frozen=True)
class TailClaim:
    """The active segment as a clean close left it."""

    segment: str
    size: int
    mtime_ns: int
    inode: int
    next_offset: int
    last_batch: int | None
    """Byte position of the segment's last batch; None when the segment holds no batch."""
    compacted_to: int
    """The partition's end offset of the last segment holding a compacted batch."""


def take_claim(directory: Path) -> TailClaim | None:
    """The claim a clean close left in ``directory``, removed now; None when there is none
    or it cannot be read or removed (then the open verifies the segment as before)."""
    for leftover in directory.glob(f"{CLAIM_NAME}.*.tmp"):  # a close that died before its rename
        leftover.unlink(missing_ok=True)
    path = directory / CLAIM_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("changelog %s: clean-close claim unreadable (%s); verifying the active segment", directory, e)
        return None
    try:
        path.unlink()
    except OSError as e:  # kept on disk, it could outlive this open: do not rely on it
        log.warning("changelog %s: clean-close claim not removable (%s); verifying the active segment",
                    directory, e)
        return None
    try:
        data = json.loads(raw)
        claim = TailClaim(**{f.name: data[f.name] for f in fields(TailClaim)})
        ints = [claim.size, claim.mtime_ns, claim.inode, claim.next_offset, claim.compacted_to]
        if claim.last_batch is not None:
            ints.append(claim.last_batch)
        if type(claim.segment) is not str or any(type(n) is not int or n < 0 for n in ints):
            raise ValueError("wrong field types")
    except (ValueError, KeyError, TypeError) as e:
        log.warning("changelog %s: clean-close claim %s is damaged (%s); verifying the active segment",
                    directory, raw[:80], e)
        return None
    return claim


def claim_holds(path: Path, base: int, claim: TailClaim) -> bool:
    """Whether ``claim`` still describes segment ``path`` (base offset ``base``): same name,
    size, mtime and inode, and a last batch that ends the file at the claimed end offset
    with a good CRC (read: that batch only)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if (path.name, st.st_size, st.st_mtime_ns, st.st_ino) != (claim.segment, claim.size, claim.mtime_ns, claim.inode):
        return False
    if claim.last_batch is None:
        return claim.size == 0 and claim.next_offset == base
    try:
        with open(path, "rb") as f:
            f.seek(claim.last_batch)
            tail = f.read()
    except OSError:
        return False
    h = parse_header(tail, 0)
    return (
        h is not None
        and h.end_position == len(tail)
        and h.next_offset == claim.next_offset
        and base <= h.base_offset
        and check_crc(tail, h)
    )


def leave_claim(directory: Path, segment: Path, next_offset: int, last_batch: int | None,
                compacted_to: int, expected_size: int) -> None:
    """Write the claim for ``segment`` as closed now (size checked against ``expected_size``,
    what the partition believes it wrote); a failure only costs the next open a full scan."""
    try:
        st = segment.stat()
        if st.st_size != expected_size:
            log.warning("changelog %s: %s is %d bytes, %d expected; no clean-close claim",
                        directory, segment.name, st.st_size, expected_size)
            return
        claim = TailClaim(segment.name, st.st_size, st.st_mtime_ns, st.st_ino, next_offset, last_batch, compacted_to)
        tmp = directory / f"{CLAIM_NAME}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(asdict(claim)))
        os.replace(tmp, directory / CLAIM_NAME)
    except OSError as e:
        log.warning("changelog %s: clean-close claim not written (%s); the next open verifies the "
                    "active segment", directory, e)
