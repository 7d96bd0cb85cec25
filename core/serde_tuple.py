"""``tuple``: an order-preserving composite encoding (composite keys such as
``(window_start, user_id)``), for rows and for Arrow columns.

Each element is a type tag followed by its body; tags order None < bool < int < float <
bytes < str < nested tuple. An int is 8 big-endian bytes of the value plus 2**63 (the sign
bit flipped); a float its IEEE bits made order-preserving (all bits flipped when negative,
the sign bit set otherwise). Strings/bytes are terminated by 0x00 with 0x00 escaped as
0x00 0xff, so a shorter string sorts before its extensions. A nested tuple is its
elements, then 0x00.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

from .serde_base import Serde, all_of_type, mapped

__all__ = ["TUPLE"]

_T_NONE, _T_FALSE, _T_TRUE, _T_INT, _T_FLOAT, _T_BYTES, _T_STR, _T_TUPLE, _T_END = (
    0x01, 0x02, 0x03, 0x10, 0x20, 0x30, 0x40, 0x50, 0x00,
)
_ZERO = b"\x00"
_ESCAPE_MARK = 0xFF
_ESCAPED_ZERO = bytes((0, _ESCAPE_MARK))  # a zero byte inside a string or bytes element
_BYTE_ORDER = ">"  # big-endian: byte order is value order
_Q = struct.Struct(_BYTE_ORDER + "Q")
_D = struct.Struct(_BYTE_ORDER + "d")
_TAGGED_Q = struct.Struct(_BYTE_ORDER + "BQ")  # a tag byte and an 8-byte body in one pack
_INT_ELEMENT = _TAGGED_Q.size  # the bytes of one int element, tag included
_INT_BODY_DTYPE = f"{_BYTE_ORDER}u{_Q.size}"  # an int body as a numpy dtype (the Arrow columns)
_BIAS = 1 << 63


# -- rows ---------------------------------------------------------------------------------
def _tuple_encode_into(out: bytearray, t: Any) -> None:
    for x in t:
        cls = type(x)  # exact types: bool is not taken for int, nor a str subclass for str
        if cls is int:  # the common element types first
            if not -_BIAS <= x < _BIAS:
                raise TypeError(f"tuple element {x} does not fit in 64 bits")
            out += _TAGGED_Q.pack(_T_INT, x + _BIAS)
        elif cls is str:
            out.append(_T_STR)
            out += x.encode().replace(_ZERO, _ESCAPED_ZERO)
            out.append(_T_END)
        elif x is None:
            out.append(_T_NONE)
        elif cls is bool:
            out.append(_T_TRUE if x else _T_FALSE)
        elif cls is float:
            bits = _Q.unpack(_D.pack(x))[0]
            out += _TAGGED_Q.pack(_T_FLOAT, bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | _BIAS)
        elif cls is bytes:
            out.append(_T_BYTES)
            out += x.replace(_ZERO, _ESCAPED_ZERO)
            out.append(_T_END)
        elif cls is tuple:
            out.append(_T_TUPLE)
            _tuple_encode_into(out, x)
            out.append(_T_END)
        else:
            raise TypeError(
                f"tuple elements must be None, bool, int, float, bytes, str or tuple; got {cls.__name__}"
            )


def _tuple_encode(t: Any) -> bytes:
    if type(t) is not tuple:
        raise TypeError(f"expected tuple, got {type(t).__name__}")
    out = bytearray()
    _tuple_encode_into(out, t)
    return bytes(out)


_ESCAPED_TAGS: dict[type, int] = {str: _T_STR, bytes: _T_BYTES}
_TAGGED_Q_TAG = struct.Struct(_TAGGED_Q.format + "B")  # an int element and the tag of the str/bytes element after it


def _column_kind(column: list[Any]) -> type | None:
    """The one exact type of a tuple position across many tuples, when it is int, str or bytes."""
    kinds = set(map(type, column))
    kind = kinds.pop() if len(kinds) == 1 else None
    return kind if kind is int or kind in _ESCAPED_TAGS else None


def _column_pieces(column: list[Any], kind: type, next_kind: type | None, tagged: bool) -> list[Any] | None:
    """The encoding of one tuple position across many tuples, as row pieces (lists or
    ``repeat`` objects); None when an int does not fit in 64 bits.

    An int column packs the tag of a str/bytes column after it into its own piece, and
    that column (``tagged``) then adds no tag piece: one piece fewer to join per row."""
    if kind is int:
        if min(column) < -_BIAS or max(column) >= _BIAS:
            return None  # the per-item encoder names the element that does not fit
        biased = map(_BIAS.__add__, column)
        if next_kind in _ESCAPED_TAGS:
            return [list(map(_TAGGED_Q_TAG.pack, repeat(_T_INT), biased, repeat(_ESCAPED_TAGS[next_kind])))]
        return [list(map(_TAGGED_Q.pack, repeat(_T_INT), biased))]
    raw = list(map(str.encode, column)) if kind is str else column
    if _ZERO in b"".join(raw):
        raw = [x.replace(_ZERO, _ESCAPED_ZERO) for x in raw]
    body = [raw, repeat(bytes((_T_END,)))]
    return body if tagged else [repeat(bytes((_ESCAPED_TAGS[kind],))), *body]


def _tuple_encode_many(items: list[Any]) -> list[bytes]:
    """``[_tuple_encode(t) for t in items]``, column by column when the tuples share one
    shape of int/str/bytes elements (e.g. ``(window_start, user_id)`` keys): a C-level
    pass per column and one join per tuple instead of a Python loop per element."""
    if len(items) >= 16 and all_of_type(items, tuple):
        widths = set(map(len, items))
        if len(widths) == 1 and (width := widths.pop()) > 0:
            columns = [list(map(itemgetter(i), items)) for i in range(width)]
            kinds = [kind for kind in map(_column_kind, columns) if kind is not None]
            if len(kinds) == width:
                pieces: list[Any] = []
                for i, column in enumerate(columns):
                    encoded = _column_pieces(column, kinds[i], kinds[i + 1] if i + 1 < width else None,
                                             tagged=i > 0 and kinds[i - 1] is int)
                    if encoded is None:
                        break
                    pieces += encoded
                else:
                    return list(map(b"".join, zip(*pieces)))
    return list(map(_tuple_encode, items))


def _read_escaped(b: bytes, i: int) -> tuple[bytes, int]:
    """The unescaped string or bytes body starting at ``i``, and the index after its terminator."""
    j = b.index(_T_END, i)
    if j + 1 == len(b) or b[j + 1] != _ESCAPE_MARK:
        return b[i:j], j + 1  # no escaped zero byte inside: the common case, one slice
    out = bytearray()
    while True:
        out += b[i:j]
        if j + 1 < len(b) and b[j + 1] == _ESCAPE_MARK:
            out.append(0)
            i = j + 2
            j = b.index(_T_END, i)
        else:
            return bytes(out), j + 1


def _tuple_decode_from(b: bytes, i: int, nested: bool) -> tuple[tuple[Any, ...], int]:
    items: list[Any] = []
    n = len(b)
    while i < n:
        tag = b[i]
        i += 1
        if tag == _T_INT:  # the common element types first
            items.append(_Q.unpack_from(b, i)[0] - _BIAS)
            i += 8
        elif tag == _T_STR:
            raw, i = _read_escaped(b, i)
            items.append(raw.decode())
        elif tag == _T_END and nested:
            return tuple(items), i
        elif tag == _T_NONE:
            items.append(None)
        elif tag == _T_TRUE:
            items.append(True)
        elif tag == _T_FALSE:
            items.append(False)
        elif tag == _T_FLOAT:
            bits = _Q.unpack_from(b, i)[0]
            bits = bits & ~_BIAS if bits >> 63 else bits ^ 0xFFFFFFFFFFFFFFFF
            items.append(_D.unpack(_Q.pack(bits))[0])
            i += 8
        elif tag == _T_BYTES:
            raw, i = _read_escaped(b, i)
            items.append(raw)
        elif tag == _T_TUPLE:
            inner, i = _tuple_decode_from(b, i, True)
            items.append(inner)
        else:
            raise ValueError(f"bad tuple tag 0x{tag:02x} at byte {i - 1}")
    if nested:
        raise ValueError("unterminated nested tuple")
    return tuple(items), i


def _tuple_decode(b: bytes) -> tuple[Any, ...]:
    # (int, str) with no escaped zero byte in the string — windowed keys such as
    # (window_start, user_id) — in a few C calls; anything else takes the general loop
    if (len(b) > _INT_ELEMENT + 1 and b[0] == _T_INT and b[_INT_ELEMENT] == _T_STR
            and b.find(_T_END, _INT_ELEMENT + 1) == len(b) - 1):
        return (_Q.unpack_from(b, 1)[0] - _BIAS, b[_INT_ELEMENT + 1:-1].decode())
    return _tuple_decode_from(b, 0, False)[0]


# -- Arrow columns: one position per column, the same elements built in Arrow and numpy --------
def _encode_columns(columns: Sequence[Any]) -> list[bytes]:
    """Each position becomes its tagged pieces, joined per row in one Arrow kernel; a
    column the fast path does not cover sends every row through the row encoder."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .serdes_columns import array_of, rows_encoded

    arrays = [array_of(c) for c in columns]
    if not arrays or len({len(a) for a in arrays}) != 1:
        raise ValueError(f"tuple key columns must be one or more of equal length, got lengths "
                         f"{[len(a) for a in arrays]}")
    pieces = [_position_pieces(a) for a in arrays]
    if any(p is None for p in pieces) or not len(arrays[0]):
        return rows_encoded(TUPLE, arrays)
    flat: list[Any] = [x for p in pieces for x in p]  # type: ignore[union-attr]
    return pc.binary_join_element_wise(*flat, pa.scalar(b"", pa.large_binary())).to_pylist()


def _position_pieces(column: Any) -> list[Any] | None:
    """The encoding of one tuple position as pieces to join (large_binary arrays and
    scalars), or None when the fast path does not cover the column (the row codec then
    encodes every row, naming what it cannot encode)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        return None
    kind = column.type
    if pa.types.is_integer(kind) and kind != pa.uint64():
        values = column.to_numpy().astype(np.int64)
        rows = len(values)
        tagged = np.empty((rows, _INT_ELEMENT), np.uint8)
        tagged[:, 0] = _T_INT
        tagged[:, 1:] = (values.view(np.uint64) ^ np.uint64(_BIAS)).astype(_INT_BODY_DTYPE).view(np.uint8).reshape(
            rows, _Q.size)
        fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(_INT_ELEMENT), rows,
                                                     [None, pa.py_buffer(tagged.tobytes())])
        return [fixed.cast(pa.large_binary())]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        tag = _T_STR
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        tag = _T_BYTES
    else:
        return None
    body = column.cast(pa.large_binary())
    if pc.any(pc.greater(pc.count_substring(body, _ZERO), 0)).as_py():
        body = pc.replace_substring(body, _ZERO, _ESCAPED_ZERO)
    return [pa.scalar(bytes((tag,)), pa.large_binary()), body, pa.scalar(bytes((_T_END,)), pa.large_binary())]


def _decode_columns(data: list[bytes | None]) -> list[Any]:
    """``(int, str)`` keys without a zero byte inside the string in a few Arrow/numpy
    passes; any other key shape through the row decoder."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from .serdes_columns import rows_decoded

    binary = pa.array(data, pa.binary())
    rows = len(binary)
    if not rows or binary.null_count:
        return rows_decoded(TUPLE, data)
    offsets = np.frombuffer(binary.buffers()[1], np.int32, rows + 1, binary.offset * 4)
    payload = np.frombuffer(binary.buffers()[2], np.uint8) if binary.buffers()[2] is not None else np.empty(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    if not (ends - starts >= _INT_ELEMENT + 2).all():
        return rows_decoded(TUPLE, data)
    if not ((payload[starts] == _T_INT).all() and (payload[starts + _INT_ELEMENT] == _T_STR).all()
            and (payload[ends - 1] == _T_END).all()):
        return rows_decoded(TUPLE, data)
    text = pc.binary_slice(binary, _INT_ELEMENT + 1, -1)
    if pc.any(pc.greater(pc.count_substring(text, _ZERO), 0)).as_py():
        return rows_decoded(TUPLE, data)  # an escaped zero byte, or more than two positions
    try:
        users = text.cast(pa.string())
    except pa.ArrowInvalid:
        return rows_decoded(TUPLE, data)  # not UTF-8: the row decoder names the key
    ints = payload[starts[:, None] + np.arange(1, _INT_ELEMENT)].copy().view(_INT_BODY_DTYPE).reshape(rows)
    return [pa.array((ints.astype(np.uint64) ^ np.uint64(_BIAS)).view(np.int64), pa.int64()), users]


TUPLE = Serde("tuple", _tuple_encode, _tuple_decode, True, _tuple_encode_many, mapped(_tuple_decode), tuple,
              _encode_columns, _decode_columns)
