"""Fuzzing the changelog decoder and open path (hypothesis).

Arbitrary or mutated bytes in segment files, batch payloads with a *valid* CRC, and
checkpoint files must either raise :class:`CorruptionError` or recover — a torn tail
cut back, in which case every record read is one that was really written (a prefix of
the log): never another exception, never wrong records, never a hang.
"""

from __future__ import annotations

import struct
import tempfile
import zlib
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from localstate.changelog.file import FileChangelogPartition
from localstate.changelog.format import (
    HEADER,
    HEADER_SIZE,
    decode_payload,
    encode_batch,
    parse_header,
)
from localstate.checkpoint import Checkpoint
from localstate.errors import CorruptionError
from localstate.testing import FULL

EXAMPLES = 1000 if FULL else 150
FUZZ = settings(max_examples=EXAMPLES, deadline=5000, suppress_health_check=[HealthCheck.too_slow])

RECORDS = [(b"key%03d" % i, None if i % 7 == 3 else b"value-%d" % (i * i)) for i in range(60)]


def valid_segment() -> tuple[bytes, list[tuple[bytes, bytes | None]]]:
    out = b""
    for lo in range(0, 60, 10):
        out += encode_batch(lo, RECORDS[lo:lo + 10], timestamp_ms=1)
    return out, RECORDS


VALID, WRITTEN = valid_segment()


def open_and_read(files: dict[str, bytes]) -> list[tuple[bytes, bytes | None]]:
    """Write ``files`` into a partition directory, open it (writer mode: it may cut a torn
    tail) and read every record; then reopen to check the cut-back log is stable."""
    with tempfile.TemporaryDirectory() as d:
        pdir = Path(d) / "s" / "0"
        pdir.mkdir(parents=True)
        for name, data in files.items():
            (pdir / name).write_bytes(data)
        p = FileChangelogPartition(pdir)
        try:
            records = list(p.read(0, p.end_offset()))
            end = p.end_offset()
        finally:
            p.close()
        q = FileChangelogPartition(pdir)
        try:
            assert q.end_offset() == end and list(q.read(0, end)) == records
        finally:
            q.close()
        return records


def check_prefix(records: list) -> None:
    assert records == WRITTEN[: len(records)], "recovered records must be exactly a prefix of what was written"


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_as_the_active_segment(data):
    try:
        records = open_and_read({"00000000000000000000.log": data})
    except CorruptionError:
        return
    for k, v in records:
        assert type(k) is bytes and (v is None or type(v) is bytes)


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_as_a_closed_segment(data):
    try:
        open_and_read({"00000000000000000000.log": data, "00000000000000000060.log": VALID[:0]})
    except CorruptionError:
        pass


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_flipped_bytes_in_a_valid_log_never_yield_wrong_records(flips):
    data = bytearray(VALID)
    for at, mask in flips:
        data[at] ^= mask
    try:
        records = open_and_read({"00000000000000000000.log": bytes(data)})
    except CorruptionError:
        return
    check_prefix(records)


@FUZZ
@given(st.integers(0, len(VALID)), st.binary(max_size=64))
def test_truncated_or_extended_log_keeps_a_prefix(cut, tail):
    try:
        records = open_and_read({"00000000000000000000.log": VALID[:cut] + tail})
    except CorruptionError:
        return
    check_prefix(records)


def _batch_with_valid_crc(payload: bytes, flags: int, span: int) -> bytes:
    header = HEADER.pack(b"LS", 1, flags, 0, 0, span, len(payload), 1)
    crc = zlib.crc32(payload, zlib.crc32(header[8:]))
    return header[:4] + struct.pack(">I", crc) + header[8:] + payload


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.binary(max_size=4), children, max_size=3),
    max_leaves=12,
)


@FUZZ
@given(msgpack_values, st.integers(0, 1), st.integers(0, 6))
def test_crafted_payload_with_valid_crc_decodes_to_records_or_corruption(obj, flags, span):
    """Even a payload whose CRC matches (a writer bug, not bit rot) must raise
    CorruptionError or decode to a tuple of records whose first and last are well-formed
    (the decoder checks those two, not every record: a per-record check would cost the
    restore fast path ~25%; the CRC already covers bit rot)."""
    batch = _batch_with_valid_crc(msgpack.packb(obj, use_bin_type=True), flags, span)
    h = parse_header(batch, 0)
    assert h is not None
    try:
        records, offsets = decode_payload(batch, h, "fuzz")
    except CorruptionError:
        return
    assert type(records) is tuple
    for rec in (records[0], records[-1]) if records else ():
        assert len(rec) == 2 and type(rec[0]) is bytes and (rec[1] is None or type(rec[1]) is bytes)
    if offsets is not None:
        assert len(offsets) == len(records)
        assert all(h.base_offset <= o < h.next_offset for o in offsets[:1] + offsets[-1:])


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_payload_bytes_with_valid_crc(payload):
    batch = _batch_with_valid_crc(payload, 0, 1)
    h = parse_header(batch, 0)
    assert h is not None and h.end_position == HEADER_SIZE + len(payload)
    try:
        records, _ = decode_payload(batch, h, "fuzz")
    except CorruptionError:
        return
    assert len(records) == 1 and type(records[0][0]) is bytes


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_checkpoint_bytes(data):
    try:
        Checkpoint.from_bytes(data, where="fuzz")
    except CorruptionError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_checkpoint_body_with_valid_crc(body):
    data = b"%08x\n" % zlib.crc32(body) + body
    try:
        c = Checkpoint.from_bytes(data, where="fuzz")
    except CorruptionError:
        return
    assert isinstance(c.version, int) and all(isinstance(v, int) for v in c.offsets.values())


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1])
def test_tiny_segments(size):
    try:
        records = open_and_read({"00000000000000000000.log": VALID[:size]})
    except CorruptionError:
        return
    assert records == []
