"""The change logger's column hand-over (``append_columns``) and the file changelog's
reused batch buffer (``BatchEncoder``): the same bytes on disk as before, the same
records in every backend, and bad input that changes nothing.

The expected bytes are built here from the format's description (changelog/format.py's
docstring) with struct + msgpack, independently of the code under test.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack
import pytest
from localstate.changelog.base import ChangelogPartition
from localstate.changelog.file import FileChangelogPartition
from localstate.changelog.format import HEADER_SIZE, BatchEncoder, encode_batch, walk
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelogger import ChangeLogger
from localstate.errors import ChangelogError
from localstate.metrics import StoreMetrics

from .test_bulk_paths import RecordingPartition


def expected_batch(base: int, records: list[tuple[bytes, bytes | None]], ts: int) -> bytes:
    payload = msgpack.packb([list(r) for r in records], use_bin_type=True)
    tail = struct.pack(">QIIQ", base, len(records), len(payload), ts)
    crc = zlib.crc32(tail + payload)
    return b"LS" + bytes([1, 0]) + crc.to_bytes(4, "big") + tail + payload


def pairs(lo: int, hi: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"key-%06d" % i, None if i % 7 == 3 else b"v" * (i % 300)) for i in range(lo, hi)]


def segment_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def timestamps(data: bytes) -> list[tuple[int, int]]:
    """``(base_offset, timestamp_ms)`` of every batch in ``data``."""
    out = []
    for h, _ in walk(data):
        assert h is not None
        out.append((h.base_offset, h.timestamp_ms))
    return out


def test_the_encoder_writes_the_bytes_encode_batch_and_the_format_describe():
    encoder = BatchEncoder()
    for base, recs in ((0, pairs(0, 500)), (500, pairs(500, 501)), (501, pairs(0, 10_000)), (7, [])):
        parts: list[bytes] = []
        size = encoder.write_plain(base, recs, lambda b, parts=parts: parts.append(bytes(b)))
        data = b"".join(parts)
        assert size == len(data) and len(parts) == 2 and len(parts[0]) == HEADER_SIZE
        ts = struct.unpack_from(">Q", data, 24)[0]
        assert data == expected_batch(base, recs, ts) == encode_batch(base, recs, timestamp_ms=ts)


def test_a_record_that_does_not_encode_writes_nothing_and_the_next_batch_is_clean():
    encoder = BatchEncoder()
    written: list[bytes] = []
    with pytest.raises(TypeError):
        encoder.write_plain(0, [(b"a", b"1"), (b"b", object())], written.append)  # type: ignore[list-item]
    assert written == []
    encoder.write_plain(0, [(b"c", b"3")], lambda b: written.append(bytes(b)))
    ts = struct.unpack_from(">Q", b"".join(written), 24)[0]
    assert b"".join(written) == expected_batch(0, [(b"c", b"3")], ts)  # nothing of the failed batch


def test_file_partition_append_and_append_columns_store_the_same_bytes(tmp_path):
    by_pairs = FileChangelogPartition(tmp_path / "pairs")
    by_columns = FileChangelogPartition(tmp_path / "columns")
    for lo, hi in ((0, 500), (500, 520), (520, 3000)):
        recs = pairs(lo, hi)
        by_pairs.append(recs)
        by_columns.append_columns([k for k, _ in recs], [v for _, v in recs])
    assert by_pairs.flush() == by_columns.flush() == 3000
    by_pairs.close()
    by_columns.close()
    got = segment_bytes(tmp_path / "columns")
    expected = b"".join(expected_batch(base, pairs(base, hi), ts)
                        for (base, ts), hi in zip(timestamps(got), (500, 520, 3000)))
    assert got == expected
    assert len(segment_bytes(tmp_path / "pairs")) == len(got)
    reopened = FileChangelogPartition(tmp_path / "columns")
    assert list(reopened.read(0, 3000)) == pairs(0, 3000)
    reopened.close()


def test_file_partition_a_bad_record_is_refused_with_nothing_on_disk(tmp_path):
    p = FileChangelogPartition(tmp_path / "p")
    p.append(pairs(0, 10))
    p.flush()
    before = segment_bytes(tmp_path / "p")
    with pytest.raises(ChangelogError, match=r"records must be \(bytes, bytes \| None\) pairs"):
        p.append_columns([b"x", b"y"], [b"1", object()])  # type: ignore[list-item]
    with pytest.raises(ChangelogError, match="2 keys but 1 values"):
        p.append_columns([b"x", b"y"], [b"1"])
    assert p.flush() == 10 and p.end_offset() == 10
    assert segment_bytes(tmp_path / "p") == before
    p.append_columns([b"z"], [b"ok"])
    assert p.flush() == 11
    p.close()
    q = FileChangelogPartition(tmp_path / "p")
    assert list(q.read(0, 11)) == pairs(0, 10) + [(b"z", b"ok")]
    q.close()


def test_objectstore_buffers_the_same_bytes_as_before(tmp_path):
    system = ObjectStoreChangelogSystem("s3", {"path": f"file://{tmp_path}/objects"}, "job")
    p = system.open_partition("st", 0, 1)
    p.append_columns([k for k, _ in pairs(0, 400)], [v for _, v in pairs(0, 400)])
    p.append(pairs(400, 450))
    data = bytes(p._buffer)  # what the next flush uploads
    expected = b"".join(expected_batch(base, pairs(base, hi), ts) for (base, ts), hi in zip(timestamps(data), (400, 450)))
    assert data == expected
    with pytest.raises(ChangelogError, match="records must be"):
        p.append([(b"bad", object())])  # type: ignore[list-item]
    assert bytes(p._buffer) == expected
    assert p.flush() == 450
    p.close()
    q = system.open_partition("st", 0, 1)
    assert list(q.read(0, 450)) == pairs(0, 450)
    q.close()
    system.close()


def test_the_logger_hands_a_partition_without_its_own_append_columns_the_pairs_in_batches():
    part = RecordingPartition()  # implements append only: the declared default of append_columns hands it pairs
    metrics = StoreMetrics()
    logger = ChangeLogger("kv", part, 4, metrics)
    logger.log_all({b"a": b"1", b"b": None, b"c": b"333"})
    assert part.batches == []
    logger.log_all([(b"a", b"2"), (b"d", b"4"), (b"e", b"5"), (b"f", None), (b"g", b"7")])
    assert part.batches == [[(b"a", b"2"), (b"b", None), (b"c", b"333"), (b"d", b"4")],
                            [(b"e", b"5"), (b"f", None), (b"g", b"7")]]
    assert all(type(r) is tuple for batch in part.batches for r in batch)
    assert metrics.records_logged == 7 and metrics.bytes_logged == 7 + 1 + 3 + 1 + 1 + 1
    assert logger.flush() == 7


class ColumnsRecordingPartition(ChangelogPartition):
    """Records what the logger hands over; every other method is out of this test's scope."""

    stream, partition = "st", 0

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def append(self, records):
        self.calls.append(("append", records))

    def append_columns(self, keys, values):
        self.calls.append(("columns", [list(keys), list(values)]))

    def flush(self) -> int:
        return 0

    end_offset = flush

    def read_batches(self, start, stop):
        return iter(())

    def discard_tail(self, committed_offset, current) -> None:
        return None

    def close(self) -> None:
        return None


def test_the_logger_hands_columns_in_write_batch_size_slices_latest_value_per_key():
    part = ColumnsRecordingPartition()
    logger = ChangeLogger("kv", part, 3)
    for i in range(7):
        logger.log(b"k%d" % (i % 5), b"%d" % i)
    # the dict reached 3 keys twice before 7 writes: each drain is one call
    logger.flush()
    assert [kind for kind, _ in part.calls] == ["columns"] * len(part.calls)
    handed = [(k, v) for _, (keys, values) in part.calls for k, v in zip(keys, values)]
    assert handed == [(b"k0", b"0"), (b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3"), (b"k4", b"4"),
                      (b"k0", b"5"), (b"k1", b"6")]
    part.calls.clear()
    logger.log_all({b"x%d" % i: b"v" for i in range(8)})  # one bulk hand-over, sliced to 3
    assert [len(keys) for _, (keys, values) in part.calls] == [3, 3, 2]
    assert all(len(keys) == len(values) for _, (keys, values) in part.calls)


class PayloadWriteFails:
    """Declared test double: a disk that fills up between a batch's two writes (the header
    reaches the file, the payload gets ENOSPC) cannot be arranged at that exact byte, so
    the segment writer is wrapped to fail the second write of one batch that way."""

    def __init__(self, real) -> None:
        self.real, self.writes = real, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == 2:
            self.real.flush()  # the header is on disk, as after a short write
            raise OSError(28, "No space left on device")
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_payload_write_that_fails_after_the_header_loses_nothing_committed(tmp_path):
    directory = tmp_path / "p"
    p = FileChangelogPartition(directory)
    p.append(pairs(0, 50))
    assert p.flush() == 50
    flushed = len(segment_bytes(directory))
    p._writer = PayloadWriteFails(p._open_writer())
    with pytest.raises(ChangelogError, match=r"cannot append to .*No space left on device; the disk is full"):
        p.append_columns([b"x%d" % i for i in range(10)], [b"v"] * 10)
    assert p.end_offset() == 50  # the failed batch got no offsets
    p._writer = p._writer.real
    # a batch written behind the torn one would make the segment corrupt: this instance refuses
    for write in (lambda: p.append(pairs(60, 70)), p.flush, lambda: p.append_columns([b"y"], [None])):
        with pytest.raises(ChangelogError, match="an earlier append failed .*No space left.*; reopen it"):
            write()
    p.close()
    assert len(segment_bytes(directory)) == flushed + HEADER_SIZE  # a header without its payload
    q = FileChangelogPartition(directory)  # reopen: the torn tail is cut, the flushed records stay
    assert q.end_offset() == 50
    assert list(q.read(0, 50)) == pairs(0, 50)
    q.append(pairs(50, 60))
    assert q.flush() == 60
    q.close()
    r = FileChangelogPartition(directory)
    assert list(r.read(0, 60)) == pairs(0, 60)
    r.close()


@pytest.mark.parametrize("columns", [False, True])
def test_kafka_a_bad_record_mid_batch_commits_no_part_of_it(kafka_broker, columns):
    """The records before the bad one were already produced into the open transaction:
    the writer must not commit them later as if the batch had been appended."""
    from localstate.changelog.kafka import KafkaChangelogSystem
    from localstate.testing.changelog_conformance import unique

    job, stream = unique("job"), unique("bad")
    options = {"bootstrap.servers": kafka_broker, "timeout.ms": 1500, "retries": 1, "retry.backoff.ms": 100}
    system = KafkaChangelogSystem("kafka", options, job)
    p = system.open_partition(stream, 0, 1)
    p.append(pairs(0, 5))
    committed = p.flush()
    bad = [(b"a", b"1"), (b"b", b"2"), (b"c", 3.5)]
    with pytest.raises(ChangelogError, match=r"records must be \(bytes, bytes \| None\) pairs"):
        if columns:
            p.append_columns([k for k, _ in bad], [v for _, v in bad])  # type: ignore[misc]
        else:
            p.append(bad)  # type: ignore[arg-type]
    with pytest.raises(ChangelogError, match="failed earlier"):
        p.flush()
    p.close()
    system.close()
    again = KafkaChangelogSystem("kafka", options, job)
    q = again.open_partition(stream, 0, 1)
    assert [r for r in q.read(0, q.end_offset()) if r[0] in (b"a", b"b", b"c")] == []
    assert list(q.read(0, committed))[:5] == pairs(0, 5)
    q.close()
    again.close()
