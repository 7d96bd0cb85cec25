"""What a file changelog open reads: the active segment is skipped after a clean close
(the claim, changelog/file/clean.py) and verified in full after anything else, so torn
tails are still found; older segments are walked from their headers and CRC-checked
when read."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
from localstate.changelog.file import FileChangelogPartition
from localstate.changelog.file.clean import CLAIM_NAME
from localstate.errors import CorruptionError
from localstate.testing.changelog_conformance import records as recs

USED = "as the clean close left it"


@pytest.fixture
def pdir(tmp_path):
    return tmp_path / "stream" / "0"


def closed_cleanly(pdir, count: int = 50, **kw) -> None:
    p = FileChangelogPartition(pdir, **kw)
    for lo in range(0, count, 10):
        p.append(recs(lo, lo + 10))
    p.flush()
    p.close()


def reopen(pdir, caplog, **kw) -> tuple[FileChangelogPartition, bool]:
    """The partition opened again, and whether the claim was used."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="localstate.changelog.file"):
        p = FileChangelogPartition(pdir, **kw)
    return p, USED in caplog.text


def test_a_clean_close_is_claimed_and_the_next_open_uses_and_removes_the_claim(pdir, caplog):
    closed_cleanly(pdir)
    assert (pdir / CLAIM_NAME).is_file()
    p, used = reopen(pdir, caplog)
    assert used and not (pdir / CLAIM_NAME).exists()  # consumed before anything can write
    assert p.end_offset() == 50 and list(p.read(0, 50)) == recs(0, 50)
    p.append(recs(50, 60))
    p.flush()
    p.close()
    q, used = reopen(pdir, caplog)
    assert used and q.end_offset() == 60 and list(q.read(0, 60)) == recs(0, 60)
    q.close()


def test_a_crash_after_an_open_leaves_no_claim_and_a_torn_tail_is_found(pdir, tmp_path, caplog):
    closed_cleanly(pdir)
    p = FileChangelogPartition(pdir)  # consumes the claim
    p.append(recs(50, 60))
    p.flush()
    # the disk as a crash mid-append leaves it: the claim is gone, a batch half written
    crashed = tmp_path / "crashed" / "0"
    shutil.copytree(pdir, crashed, ignore=shutil.ignore_patterns(".lock"))
    p.close()
    segment = sorted(crashed.glob("*.log"))[-1]
    with open(segment, "ab") as f:
        f.write(b"LS\x01\x00torn")
    assert not (crashed / CLAIM_NAME).exists()
    q, used = reopen(crashed, caplog)
    assert not used and q.end_offset() == 60
    q.discard_tail(60, lambda key: None)  # the torn tail is cut as before
    assert list(q.read(0, 60)) == recs(0, 60)
    q.close()


def test_bytes_appended_after_the_close_void_the_claim(pdir, caplog):
    closed_cleanly(pdir)
    segment = sorted(pdir.glob("*.log"))[-1]
    with open(segment, "ab") as f:
        f.write(b"garbage after the clean close")
    p, used = reopen(pdir, caplog)
    assert not used and p.end_offset() == 50
    p.append(recs(50, 55))  # the bad tail is noted and cut before the first write
    p.flush()
    assert list(p.read(0, 55)) == recs(0, 55)
    p.close()


def test_a_last_batch_damaged_in_place_voids_the_claim_even_with_size_and_mtime_kept(pdir, caplog):
    closed_cleanly(pdir)
    segment = sorted(pdir.glob("*.log"))[-1]
    st = segment.stat()
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF  # inside the last batch's payload
    with open(segment, "r+b") as f:
        f.write(data)
    os.utime(segment, ns=(st.st_atime_ns, st.st_mtime_ns))
    p, used = reopen(pdir, caplog)
    assert not used  # the claim checks the last batch's CRC
    assert p.end_offset() == 40  # the full scan notes the damaged last batch as a torn tail
    p.close()


@pytest.mark.parametrize("claim", [b"", b"{not json", b'{"segment": 1}', b'{"segment": "x", "size": -1, "mtime_ns": 0, '
                                   b'"inode": 0, "next_offset": 0, "last_batch": null, "compacted_to": 0}'])
def test_a_damaged_claim_is_ignored_removed_and_the_segment_verified(pdir, caplog, claim):
    closed_cleanly(pdir)
    (pdir / CLAIM_NAME).write_bytes(claim)
    p, used = reopen(pdir, caplog)
    assert not used and not (pdir / CLAIM_NAME).exists()
    assert p.end_offset() == 50 and list(p.read(0, 50)) == recs(0, 50)
    p.close()


def test_a_stale_claim_from_an_earlier_close_does_not_match_a_grown_segment(pdir, caplog):
    closed_cleanly(pdir)
    stale = (pdir / CLAIM_NAME).read_bytes()
    p = FileChangelogPartition(pdir)
    p.append(recs(50, 70))
    p.flush()
    p.close()
    (pdir / CLAIM_NAME).write_bytes(stale)  # as if the claim's removal had been undone by a crash
    q, used = reopen(pdir, caplog)
    assert not used and q.end_offset() == 70
    q.close()


def test_a_claim_left_half_way_by_a_dead_close_is_removed_on_open(pdir, caplog):
    closed_cleanly(pdir)
    (pdir / f"{CLAIM_NAME}.4242.tmp").write_bytes(b'{"segment": "000')  # died before its rename
    p, used = reopen(pdir, caplog)
    assert used and not list(pdir.glob(f"{CLAIM_NAME}*"))
    p.close()


def test_unflushed_appends_at_close_leave_no_claim(pdir):
    closed_cleanly(pdir)
    p = FileChangelogPartition(pdir)
    p.append(recs(50, 60))  # never flushed: uncommitted
    p.close()
    assert not (pdir / CLAIM_NAME).exists()


def test_a_read_only_open_neither_uses_nor_removes_the_claim(pdir, caplog):
    closed_cleanly(pdir)
    r, used = reopen(pdir, caplog, readonly=True)
    assert not used and r.end_offset() == 50
    r.close()
    assert (pdir / CLAIM_NAME).is_file()


def test_rolled_segments_and_an_empty_active_segment_are_claimed_right(pdir, caplog):
    closed_cleanly(pdir, count=400, segment_bytes=1024)
    assert len(list(pdir.glob("*.log"))) > 2
    p, used = reopen(pdir, caplog, segment_bytes=1024)
    assert used and p.end_offset() == 400 and list(p.read(0, 400)) == recs(0, 400)
    p.reset()  # a new, empty segment
    p.close()
    q, used = reopen(pdir, caplog, segment_bytes=1024)
    assert used and q.end_offset() == 400 and list(q.read(0, 400)) == []
    q.close()


# -- older segments: walked from their headers on open, CRC-checked when read ---------------------

def _older_segment(pdir):
    closed_cleanly(pdir, count=400, segment_bytes=1024)
    return sorted(pdir.glob("*.log"))[1]  # neither the first nor the active one


def test_a_bad_header_in_an_older_segment_is_refused_on_open_naming_file_and_byte(pdir):
    segment = _older_segment(pdir)
    data = bytearray(segment.read_bytes())
    data[0:2] = b"XX"  # the first batch's magic
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=rf"{segment.name} is corrupt at byte 0"):
        FileChangelogPartition(pdir, segment_bytes=1024)


def test_an_older_segment_cut_short_is_refused_on_open(pdir):
    segment = _older_segment(pdir)
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 5)
    with pytest.raises(CorruptionError, match=f"{segment.name} is corrupt at byte"):
        FileChangelogPartition(pdir, segment_bytes=1024)


def test_a_flipped_payload_byte_in_an_older_segment_fails_its_crc_when_read(pdir):
    segment = _older_segment(pdir)
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))
    p = FileChangelogPartition(pdir, segment_bytes=1024)  # headers intact: the open does not read payloads
    assert p.end_offset() == 400
    with pytest.raises(CorruptionError, match="fails its CRC32 check"):
        list(p.read(0, 400))
    p.close()
