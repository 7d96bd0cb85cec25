"""Arrow columns ↔ encoded bytes, byte-identical to the row serdes of :mod:`localstate.serdes`.

A task that already holds its keys and values as Arrow columns (a grouped record batch)
would otherwise turn every row into Python objects only for the serde to turn them into
bytes again. :func:`column_encoder` and :func:`column_decoder` do the same work a column
at a time, in Arrow and numpy:

* ``tuple`` keys whose positions are int64 / string / binary columns (``(window_start,
  user_id)``): each position becomes its tagged piece and the pieces are joined per row
  in one Arrow kernel; decoding ``(int, str)`` keys slices the bytes back into two columns;
* ``long`` / ``int``: big-endian with the sign bit flipped, in numpy;
* ``string`` / ``bytes``: Arrow's own binary data.

Anything else (another serde, a column type or a row the fast path does not cover: a
null, a zero byte inside a string of a ``tuple`` key to decode) goes through the serde's
row codec (``encode_many`` / ``decode_many``), so the bytes — and the errors for what
cannot be encoded or decoded — are the row serde's own. ``tests/test_serdes_columns.py``
checks the byte identity.

Columns are lists of ``pa.Array``: one per ``tuple`` position, one for any other serde.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .serdes import _BIAS as _TUPLE_INT_BIAS
from .serdes import (
    _T_BYTES,
    _T_END,
    _T_INT,
    _T_STR,
    Serde,
    decoder_of_many,
    encoder_of_many,
    get_serde,
)

__all__ = ["column_encoder", "column_decoder", "Columns"]

Columns = list[pa.Array]
"""Arrow arrays of equal length: one per ``tuple`` position, or a single one."""

# the tuple serde's wire format, from its one home: element tags and the int bias
_BIAS = np.uint64(_TUPLE_INT_BIAS)
_SIGNED_WIDTH = {"int": (np.dtype(np.int32), np.dtype(np.uint32)), "long": (np.dtype(np.int64), np.dtype(np.uint64))}
"""The order-preserving integer serdes: their values' dtype and the unsigned dtype of their bytes."""


def column_encoder(serde: Serde) -> Callable[[Sequence[pa.Array]], list[bytes]]:
    """``columns -> [serde.encode(row), ...]`` (rows: tuples of the columns' values for
    ``tuple``, the single column's values otherwise), vectorised where it can be."""
    if serde is _builtin("tuple"):
        return _encode_tuple_columns
    if serde.name in _SIGNED_WIDTH and serde is _builtin(serde.name):
        return lambda columns: _encode_signed(serde, _single(columns))
    if serde is _builtin("string") or serde is _builtin("bytes"):
        return lambda columns: _encode_binary(serde, _single(columns))
    return lambda columns: _rows_encoded(serde, columns)


def column_decoder(serde: Serde) -> Callable[[list[bytes | None]], Columns]:
    """``encoded -> columns`` (``None`` entries — keys that were not found — become nulls
    in every column), vectorised where it can be; the inverse of :func:`column_encoder`."""
    if serde is _builtin("tuple"):
        return _decode_tuple
    if serde.name in _SIGNED_WIDTH and serde is _builtin(serde.name):
        return lambda data: _decode_signed(serde, data)
    if serde is _builtin("string"):
        return lambda data: _decode_binary(serde, data, pa.string())
    if serde is _builtin("bytes"):
        return lambda data: _decode_binary(serde, data, pa.binary())
    return lambda data: _rows_decoded(serde, data)


def _builtin(name: str) -> Serde:
    return get_serde(name)


def _single(columns: Sequence[pa.Array]) -> pa.Array:
    if len(columns) != 1:
        raise TypeError(f"expected one column, got {len(columns)}")
    return _array(columns[0])


def _array(column: Any) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    if isinstance(column, pa.Array):
        return column
    return pa.array(column)


# -- the row codec: what every fast path must equal -----------------------------------------
def _rows_encoded(serde: Serde, columns: Sequence[pa.Array]) -> list[bytes]:
    if serde.name == "tuple":
        rows: list[Any] = list(zip(*(_array(c).to_pylist() for c in columns)))
    else:
        rows = _single(columns).to_pylist()
    return encoder_of_many(serde)(rows)


def _rows_decoded(serde: Serde, data: list[bytes | None]) -> Columns:
    present = [b for b in data if b is not None]
    decoded = iter(decoder_of_many(serde)(present))
    values = [None if b is None else next(decoded) for b in data]
    if serde.name != "tuple":
        return [pa.array(values)]
    widths = {len(v) for v in values if v is not None}
    if len(widths) > 1:
        raise ValueError(f"tuple keys of different lengths {sorted(widths)} do not fit in columns")
    width = widths.pop() if widths else 0
    return [pa.array([None if v is None else v[i] for v in values]) for i in range(width)]


# -- fixed-width integers ------------------------------------------------------------------
def _encode_signed(serde: Serde, column: pa.Array) -> list[bytes]:
    signed, unsigned = _SIGNED_WIDTH[serde.name]
    if column.null_count or not pa.types.is_integer(column.type) or column.type == pa.uint64():
        return _rows_encoded(serde, [column])
    values = column.to_numpy()
    info = np.iinfo(signed)
    if len(values) and (int(values.min()) < info.min or int(values.max()) > info.max):
        return _rows_encoded(serde, [column])  # the row encoder names the value that does not fit
    # the row serde adds 2**(bits-1): on the two's complement that flips the sign bit
    flipped = values.astype(signed).view(unsigned) ^ _sign_bit(unsigned)
    return _fixed_width_pieces(flipped.astype(unsigned.newbyteorder(">")).tobytes(), unsigned.itemsize)


def _decode_signed(serde: Serde, data: list[bytes | None]) -> Columns:
    signed, unsigned = _SIGNED_WIDTH[serde.name]
    width = unsigned.itemsize
    binary = pa.array(data, pa.binary())  # None -> null, present values back to back
    offsets = np.frombuffer(binary.buffers()[1], np.int32, len(binary) + 1)
    present = len(binary) - binary.null_count
    if int(offsets[-1] - offsets[0]) != width * present or (np.diff(offsets) > width).any():
        return _rows_decoded(serde, data)  # a value of another width: the row decoder's error
    body = binary.buffers()[2]
    raw = np.frombuffer(body, unsigned.newbyteorder(">"), present, int(offsets[0])) if present else np.empty(0, unsigned)
    decoded = (raw.astype(unsigned) ^ _sign_bit(unsigned)).view(signed)
    if not binary.null_count:
        return [pa.array(decoded, pa.from_numpy_dtype(signed))]
    missing = binary.is_null().to_numpy(zero_copy_only=False)
    values = np.zeros(len(binary), signed)
    values[~missing] = decoded
    return [pa.array(values, pa.from_numpy_dtype(signed), mask=missing)]


def _sign_bit(unsigned: np.dtype) -> Any:
    return unsigned.type(1 << (unsigned.itemsize * 8 - 1))


def _fixed_width_pieces(buffer: bytes, width: int) -> list[bytes]:
    """``buffer`` cut into ``width``-byte values (numpy's void items convert to bytes in C)."""
    return np.frombuffer(buffer, f"V{width}").tolist()


# -- string / bytes -------------------------------------------------------------------------
def _encode_binary(serde: Serde, column: pa.Array) -> list[bytes]:
    wanted = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    if serde.name == "bytes":
        wanted = pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
    if column.null_count or not wanted:
        return _rows_encoded(serde, [column])
    return column.cast(pa.large_binary()).to_pylist()


def _decode_binary(serde: Serde, data: list[bytes | None], kind: pa.DataType) -> Columns:
    binary = pa.array(data, pa.binary())
    if kind == pa.binary():
        return [binary]
    try:
        return [binary.cast(kind)]
    except pa.ArrowInvalid:
        return _rows_decoded(serde, data)  # not UTF-8: the row decoder names the value


# -- tuple ------------------------------------------------------------------------------------
def _encode_tuple_columns(columns: Sequence[pa.Array]) -> list[bytes]:
    arrays = [_array(c) for c in columns]
    if not arrays or len({len(a) for a in arrays}) != 1:
        raise ValueError(f"tuple key columns must be one or more of equal length, got lengths "
                         f"{[len(a) for a in arrays]}")
    pieces = [_tuple_piece(a) for a in arrays]
    if any(p is None for p in pieces) or not len(arrays[0]):
        return _rows_encoded(_builtin("tuple"), arrays)
    flat: list[Any] = [x for p in pieces for x in p]  # type: ignore[union-attr]
    return pc.binary_join_element_wise(*flat, pa.scalar(b"", pa.large_binary())).to_pylist()


def _tuple_piece(column: pa.Array) -> list[Any] | None:
    """The encoding of one tuple position as pieces to join (large_binary arrays and
    scalars), or None when the fast path does not cover the column (the row codec then
    encodes every row, naming what it cannot encode)."""
    if column.null_count:
        return None
    kind = column.type
    if pa.types.is_integer(kind) and kind != pa.uint64():
        values = column.to_numpy().astype(np.int64)
        rows = len(values)
        tagged = np.empty((rows, 9), np.uint8)
        tagged[:, 0] = _T_INT
        tagged[:, 1:] = (values.view(np.uint64) ^ _BIAS).astype(">u8").view(np.uint8).reshape(rows, 8)
        fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(9), rows, [None, pa.py_buffer(tagged.tobytes())])
        return [fixed.cast(pa.large_binary())]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        tag = _T_STR
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        tag = _T_BYTES
    else:
        return None
    body = column.cast(pa.large_binary())
    if pc.any(pc.greater(pc.count_substring(body, b"\x00"), 0)).as_py():
        body = pc.replace_substring(body, b"\x00", b"\x00\xff")
    return [pa.scalar(bytes((tag,)), pa.large_binary()), body, pa.scalar(bytes((_T_END,)), pa.large_binary())]


def _decode_tuple(data: list[bytes | None]) -> Columns:
    """``(int, str)`` keys without a zero byte inside the string in a few Arrow/numpy
    passes; any other key shape through the row decoder."""
    serde = _builtin("tuple")
    binary = pa.array(data, pa.binary())
    rows = len(binary)
    if not rows or binary.null_count:
        return _rows_decoded(serde, data)
    offsets = np.frombuffer(binary.buffers()[1], np.int32, rows + 1, binary.offset * 4)
    payload = np.frombuffer(binary.buffers()[2], np.uint8) if binary.buffers()[2] is not None else np.empty(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    if not (ends - starts >= 11).all():
        return _rows_decoded(serde, data)
    if not ((payload[starts] == _T_INT).all() and (payload[starts + 9] == _T_STR).all()
            and (payload[ends - 1] == _T_END).all()):
        return _rows_decoded(serde, data)
    text = pc.binary_slice(binary, 10, -1)
    if pc.any(pc.greater(pc.count_substring(text, b"\x00"), 0)).as_py():
        return _rows_decoded(serde, data)  # an escaped zero byte, or more than two positions
    try:
        users = text.cast(pa.string())
    except pa.ArrowInvalid:
        return _rows_decoded(serde, data)  # not UTF-8: the row decoder names the key
    ints = payload[starts[:, None] + np.arange(1, 9)].copy().view(">u8").reshape(rows)
    return [pa.array((ints.astype(np.uint64) ^ _BIAS).view(np.int64), pa.int64()), users]
