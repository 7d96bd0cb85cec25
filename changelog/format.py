"""The on-disk record-batch format of the file changelog.

A batch is a 32-byte header followed by a msgpack payload::

    magic "LS" | version u8 | flags u8 | crc32 u32 | base_offset u64 | span u32 |
    payload_len u32 | timestamp_ms u64

``crc32`` covers the header bytes after it and the payload. ``span`` is the number of
offsets the batch covers (``base_offset .. base_offset + span - 1``). A plain batch's
payload is the list of ``[key, value]`` pairs, one per offset; a compacted batch
(flag 1) keeps its base and span but only surviving records, with their offset deltas:
``[[delta, ...], [[key, value], ...]]``. ``value`` nil is a tombstone.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgpack
from localstate.errors import CorruptionError
from localstate.records import ChangeRecord

__all__ = ["HEADER", "MAGIC", "BatchEncoder", "BatchHeader", "encode_batch", "decode_payload", "walk", "FLAG_COMPACTED"]

MAGIC = b"LS\x01"
HEADER = struct.Struct(">2sBBIQIIQ")
HEADER_SIZE = HEADER.size
_HEADER_HEAD = struct.Struct(">2sBBI")  # magic, version, flags, crc32
_HEADER_TAIL = struct.Struct(">QIIQ")  # base_offset, span, payload_len, timestamp_ms: what the CRC covers
FLAG_COMPACTED = 1
_CRC_FROM = 8  # header bytes after the crc field
_MAX_PAYLOAD = 1 << 30


@dataclass(frozen=True)
class BatchHeader:
    position: int
    flags: int
    crc: int
    base_offset: int
    span: int
    payload_len: int
    timestamp_ms: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.span

    @property
    def end_position(self) -> int:
        return self.position + HEADER_SIZE + self.payload_len


def encode_batch(
    base_offset: int,
    records: list[ChangeRecord],
    *,
    offsets: list[int] | None = None,
    span: int | None = None,
    timestamp_ms: int | None = None,
) -> bytes:
    """Encode a plain batch (``offsets is None``) or a compacted one."""
    if offsets is None:
        payload = msgpack.packb(records, use_bin_type=True)
        flags = 0
        span = len(records)
    else:
        payload = msgpack.packb([[o - base_offset for o in offsets], records], use_bin_type=True)
        flags = FLAG_COMPACTED
        assert span is not None
    return _header(flags, base_offset, span, payload, timestamp_ms) + payload


def _header(flags: int, base_offset: int, span: int, payload: bytes | memoryview, timestamp_ms: int | None) -> bytes:
    """The 32 header bytes of a batch with ``payload`` (its CRC computed here)."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    tail = _HEADER_TAIL.pack(base_offset, span, len(payload), ts)
    return _HEADER_HEAD.pack(b"LS", 1, flags, zlib.crc32(payload, zlib.crc32(tail))) + tail


class BatchEncoder:
    """Encodes the plain batches of one writer into one reused msgpack buffer.

    The same bytes as :func:`encode_batch`, without what it costs per batch on the write
    path: a fresh packer buffer (grown, and on this VM freshly page-faulted), the copy of
    the payload into a ``bytes`` and a second copy when the header is put in front of it.
    The header and a view of the payload go to ``write`` one after the other.
    """

    __slots__ = ("_packer",)

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)

    def write_plain(
        self, base_offset: int, records: list[ChangeRecord], write: Callable[[bytes | memoryview], object]
    ) -> int:
        """Encode ``records`` as a plain batch at ``base_offset``, hand it to ``write``
        (header, then payload) and return its size in bytes. A record that does not
        encode raises ``TypeError``/``ValueError`` before anything is written; an error
        of ``write`` propagates as it is."""
        packer = self._packer
        try:
            packer.pack(records)
            with packer.getbuffer() as payload:
                write(_header(0, base_offset, len(records), payload, None))
                write(payload)
                return HEADER_SIZE + len(payload)
        finally:
            packer.reset()  # also after a failed pack: no half-packed batch is kept


def parse_header(buf: bytes | memoryview, pos: int) -> BatchHeader | None:
    """The header at ``pos`` or ``None`` if it is not a plausible header."""
    if pos + HEADER_SIZE > len(buf):
        return None
    magic, version, flags, crc, base, span, plen, ts = HEADER.unpack_from(buf, pos)
    if magic != b"LS" or version != 1 or flags > FLAG_COMPACTED or plen > _MAX_PAYLOAD:
        return None
    return BatchHeader(pos, flags, crc, base, span, plen, ts)


def check_crc(buf: bytes | memoryview, h: BatchHeader) -> bool:
    end = h.end_position
    if end > len(buf):
        return False
    mv = memoryview(buf)
    return zlib.crc32(mv[h.position + HEADER_SIZE : end], zlib.crc32(mv[h.position + _CRC_FROM : h.position + HEADER_SIZE])) == h.crc


def decode_payload(
    buf: bytes | memoryview, h: BatchHeader, where: str
) -> tuple[list[ChangeRecord], list[int] | None]:
    """``(records, offsets)``; ``offsets`` is None for a plain batch (dense from base)."""
    start = h.position + HEADER_SIZE
    try:
        obj = msgpack.unpackb(buf[start : h.end_position], use_list=False, raw=True)
        if h.flags & FLAG_COMPACTED:
            if type(obj) is not tuple or len(obj) != 2 or type(obj[0]) is not tuple or type(obj[1]) is not tuple:
                raise ValueError("a compacted batch is not [[deltas], [records]]")
            deltas, records = obj
            base = h.base_offset
            offsets = [base + d for d in deltas]
            if len(offsets) != len(records):
                raise ValueError("offset and record counts differ")
            if offsets and not (base <= offsets[0] and offsets[-1] < base + h.span):
                raise ValueError(f"offsets outside the batch's span {base}..{base + h.span - 1}")
        else:
            records, offsets = obj, None
            if type(records) is not tuple or len(records) != h.span:
                raise ValueError(f"not {h.span} records")
        # The CRC already vouches for the bytes; checking the first and last record keeps
        # a malformed (writer-bug) payload from decoding without a per-record cost.
        for rec in (records[0], records[-1]) if records else ():
            if type(rec) is not tuple or len(rec) != 2 or type(rec[0]) is not bytes or (
                rec[1] is not None and type(rec[1]) is not bytes
            ):
                raise ValueError("records are not (key, value) pairs")
        return records, offsets  # type: ignore[return-value]
    except (ValueError, TypeError, KeyError, IndexError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as e:
        raise CorruptionError(
            f"{where}: record batch at byte {h.position} (offset {h.base_offset}) does not decode: {e}"
        ) from e


def find_valid_batch_after(buf: bytes | memoryview, pos: int) -> int | None:
    """Byte position of the first header with a valid CRC after ``pos``, if any."""
    data = bytes(buf) if isinstance(buf, memoryview) else buf
    i = data.find(MAGIC, pos + 1)
    while i != -1:
        h = parse_header(data, i)
        if h is not None and check_crc(data, h):
            return i
        i = data.find(MAGIC, i + 1)
    return None


def walk(buf: bytes | memoryview, start: int = 0) -> Iterator[tuple[BatchHeader | None, int]]:
    """Yield ``(header, pos)`` for consecutive batches; ``(None, pos)`` at the first bad one."""
    pos = start
    n = len(buf)
    while pos < n:
        h = parse_header(buf, pos)
        if h is None or h.end_position > n:
            yield None, pos
            return
        yield h, pos
        pos = h.end_position
