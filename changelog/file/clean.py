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

Written, taken and removed by the one claim mechanism of :mod:`localstate.claims`
(durably, as rocksdb's ``db.clean``). A claim that survived a crash which undid its
removal would still describe a file that was appended to (or cut) since, so size, mtime
and the last batch would not match. Read-only opens (``inspect``) neither use nor remove it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from localstate import claims

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


_FIELDS: dict[str, tuple[type, ...]] = {f: (int,) for f in ("size", "mtime_ns", "inode", "next_offset", "compacted_to")}
_FIELDS.update(segment=(str,), last_batch=(int, type(None)))


def take_claim(directory: Path) -> TailClaim | None:
    """The claim a clean close left in ``directory``, removed now; None when there is none
    or it cannot be read, removed or parsed (then the open verifies the segment as before)."""
    try:
        data = claims.take_claim(directory / CLAIM_NAME, _FIELDS)
    except claims.ClaimDamaged as e:
        log.warning("changelog %s: %s; verifying the active segment", directory, e)
        return None
    except OSError as e:  # kept on disk, it could outlive this open: do not rely on it
        log.warning("changelog %s: clean-close claim unusable (%s); verifying the active segment", directory, e)
        return None
    return None if data is None else TailClaim(**data)


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
        claims.leave_claim(directory / CLAIM_NAME, asdict(claim))
    except FileNotFoundError as e:
        # the partition's files were deleted under it (its state dir removed): nothing to
        # claim, and the next open reports a changelog missing its committed records
        log.debug("changelog %s: clean-close claim not written (%s)", directory, e)
    except OSError as e:
        log.warning("changelog %s: clean-close claim not written (%s); the next open verifies the "
                    "active segment", directory, e)
