"""The embedded file changelog: segments, CRCs, torn tails, compaction, truncation, locks."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
from localstate.changelog.file import FileChangelogPartition, FileChangelogSystem
from localstate.errors import ChangelogError, CorruptionError, StoreLockedError
from localstate.testing.changelog_conformance import (
    ChangelogSystemConformance,
    damage_files,
    unique,
)
from localstate.testing.changelog_conformance import records as recs


class TestFileChangelogConformance(ChangelogSystemConformance):
    fenced_match = None  # the partition lock admits one writer; a second is refused at open

    @pytest.fixture
    def make_system(self, tmp_path):
        job = unique("job")
        return lambda: FileChangelogSystem("file", {"path": str(tmp_path / "log")}, job)

    @pytest.fixture
    def job_values(self, tmp_path):
        return {"systems.file.path": str(tmp_path / "log")}

    def lose_newest_checkpoint(self, values):
        (Path(values["systems.file.path"]) / "_checkpoints" / values["job.name"] / "partition-0.ckpt").unlink()

    def storage_snapshot(self, values):
        root = Path(values["systems.file.path"])
        return sorted((str(f.relative_to(root)), f.read_bytes()) for f in root.rglob("*") if f.is_file())

    def lose_stream(self, values, stream):
        shutil.rmtree(Path(values["systems.file.path"]) / stream)

    def lose_everything(self, values):
        shutil.rmtree(values["systems.file.path"])

    def damage_shipped_snapshots(self, values):
        return damage_files(sorted(Path(values["systems.file.path"]).glob("*/*/shipped/sst/*")))


@pytest.fixture
def pdir(tmp_path):
    return tmp_path / "stream" / "0"


def segmented(pdir, count: int) -> FileChangelogPartition:
    """A partition of small (4 KiB) segments holding ``recs(0, count)``, flushed, open."""
    p = FileChangelogPartition(pdir, segment_bytes=4096)
    for lo in range(0, count, 20):
        p.append(recs(lo, min(lo + 20, count)))
    p.flush()
    return p


def test_append_flush_read_ranges(pdir):
    p = FileChangelogPartition(pdir)
    p.append(recs(0, 10))
    p.append(recs(10, 15))
    assert p.flush() == 15 == p.end_offset()
    assert list(p.read(0, 15)) == recs(0, 15)
    assert list(p.read(3, 12)) == recs(3, 12)
    assert list(p.read(14, 100)) == recs(14, 15)
    assert list(p.read(15, 20)) == []
    p.close()
    q = FileChangelogPartition(pdir)
    assert q.end_offset() == 15 and list(q.read(0, 15)) == recs(0, 15)
    q.close()


def test_segments_roll_by_size(pdir):
    p = segmented(pdir, 1000)
    assert len(p.segments()) > 3
    assert list(p.read(0, 1000)) == recs(0, 1000)
    assert list(p.read(333, 777)) == recs(333, 777)
    p.close()
    q = FileChangelogPartition(pdir, segment_bytes=4096)
    assert q.end_offset() == 1000
    q.close()


def test_second_writer_is_refused(pdir):
    p = FileChangelogPartition(pdir)
    with pytest.raises(StoreLockedError, match="locked by pid"):
        FileChangelogPartition(pdir)
    p.close()
    FileChangelogPartition(pdir).close()


def test_torn_tail_is_cut_back_with_a_warning(pdir, caplog):
    p = FileChangelogPartition(pdir)
    p.append(recs(0, 10))
    p.append(recs(10, 20))
    p.flush()
    seg = p.segments()[-1][2]
    p.close()
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])  # a torn final write
    torn = seg.read_bytes()
    with caplog.at_level(logging.WARNING):
        q = FileChangelogPartition(pdir)
        assert q.end_offset() == 10
        assert seg.read_bytes() == torn  # noted on open, cut only once the commit is known
        assert list(q.read(0, 10)) == recs(0, 10)
        q.append(recs(10, 12))
    assert "torn" in caplog.text
    q.flush()
    assert list(q.read(0, 12)) == recs(0, 12)
    q.close()


def test_flipped_byte_mid_log_raises_naming_file_and_offset(pdir):
    p = FileChangelogPartition(pdir)
    for i in range(5):
        p.append(recs(i * 10, i * 10 + 10))
    p.flush()
    seg = p.segments()[-1][2]
    p.close()
    data = bytearray(seg.read_bytes())
    data[len(data) // 3] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as info:
        FileChangelogPartition(pdir)
    assert str(seg) in str(info.value) and "byte" in str(info.value)


def test_corrupt_closed_segment_is_detected_on_read(pdir):
    p = segmented(pdir, 600)
    first = p.segments()[0][2]
    p.close()
    data = bytearray(first.read_bytes())
    data[200] ^= 0x01
    first.write_bytes(bytes(data))
    q = FileChangelogPartition(pdir, segment_bytes=4096)
    with pytest.raises(CorruptionError, match="CRC32|decode|corrupt"):
        list(q.read(0, q.end_offset()))
    q.close()


def test_deleted_middle_segment_is_detected(pdir):
    p = segmented(pdir, 600)
    segs = p.segments()
    p.close()
    segs[1][2].unlink()
    with pytest.raises(CorruptionError, match="missing"):
        FileChangelogPartition(pdir, segment_bytes=4096)


def test_deleted_first_segment_is_detected_but_a_reset_log_opens(pdir):
    p = segmented(pdir, 600)
    segs = p.segments()
    p.close()
    first_base, second_base, first_path = segs[0][0], segs[1][0], segs[0][2]
    data = first_path.read_bytes()
    first_path.unlink()
    for readonly in (False, True):  # the writer and `localstate inspect`/`verify` alike
        with pytest.raises(CorruptionError, match=f"offsets 0..{second_base - 1} are missing"):
            FileChangelogPartition(pdir, segment_bytes=4096, readonly=readonly)
    assert first_base == 0
    first_path.write_bytes(data)
    p = FileChangelogPartition(pdir, segment_bytes=4096)  # not "locked": the failed opens released the lock
    end = p.reset()  # a reset log legitimately starts at the old end: it records that start
    p.append(recs(0, 5))
    p.flush()
    p.close()
    q = FileChangelogPartition(pdir, segment_bytes=4096)
    assert q.segments()[0][0] == end == 600 and q.min_valid_snapshot_offset() == end + 1  # no copy of the old state
    assert list(q.read(0, q.end_offset())) == recs(0, 5)
    q.close()


def test_discard_tail_truncates_uncommitted_records(pdir):
    p = segmented(pdir, 600)
    p.discard_tail(333, lambda keys: [])  # mid-batch, mid-log
    assert p.end_offset() == 333
    p.append(recs(1000, 1005))
    p.flush()
    p.close()
    q = FileChangelogPartition(pdir, segment_bytes=4096)
    assert list(q.read(0, q.end_offset())) == recs(0, 333) + recs(1000, 1005)
    with pytest.raises(CorruptionError, match="committed records are missing"):
        q.discard_tail(10_000, lambda keys: [])
    q.close()


def test_compaction_keeps_offsets_and_latest_values(pdir):
    p = FileChangelogPartition(pdir, segment_bytes=4096, retention_ms=3_600_000)
    offsets = {}
    for i in range(400):
        key = b"k%d" % (i % 25)
        p.append([(key, b"v%d" % i)])
        offsets[key] = i
    p.append([(b"k3", None)])
    offsets[b"k3"] = 400
    for i in range(401, 600):
        p.append([(b"tail%d" % i, b"x")])
    end = p.flush()
    before = dict()
    for o, k, v in p.read_with_offsets(0, end):
        before[k] = (o, v)
    stats = p.compact(up_to=end)
    assert stats["records_after"] < stats["records_before"]
    after = {}
    for o, k, v in p.read_with_offsets(0, end):
        assert k not in after, "compaction left two records for one key"
        after[k] = (o, v)
    assert after == before  # latest value per key at its original offset; tombstone kept
    assert p.end_offset() == end
    p.close()


def test_tombstones_dropped_after_retention_and_horizon_advances(pdir):
    p = FileChangelogPartition(pdir, segment_bytes=4096, retention_ms=0)
    p.append([(b"gone", b"1")])
    p.append([(b"gone", None)])
    for i in range(300):
        p.append(recs(i, i + 1, b"filler"))
    end = p.flush()
    time.sleep(0.01)
    stats = p.compact(up_to=end)
    assert stats["tombstones_dropped"] >= 1
    assert p.min_valid_snapshot_offset() == 2
    keys = [k for k, _ in p.read(0, end)]
    assert b"gone" not in keys
    p.close()
    q = FileChangelogPartition(pdir, segment_bytes=4096)
    assert q.min_valid_snapshot_offset() == 2
    q.close()


def test_readonly_open_does_not_lock_or_truncate(pdir):
    p = FileChangelogPartition(pdir)
    p.append(recs(0, 5))
    p.flush()
    r = FileChangelogPartition(pdir, readonly=True)
    assert list(r.read(0, 5)) == recs(0, 5)
    with pytest.raises(ChangelogError, match="read-only"):
        r.append(recs(5, 6))
    r.close()
    p.close()
