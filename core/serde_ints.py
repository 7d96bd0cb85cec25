"""``int`` (4 bytes) and ``long`` (8 bytes): order-preserving signed integers.

The wire format: the value plus ``2**(bits - 1)`` as an unsigned big-endian integer of
``width`` bytes. Modulo ``2**bits`` that addition flips the sign bit of the two's
complement, so byte order is value order. Rows are packed with :mod:`struct`, Arrow columns
with numpy views of the same layout; both derive from :func:`signed_int_serde`'s width.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat
from operator import add, itemgetter, sub
from typing import Any

from .serde_base import Serde, all_of_type

__all__ = ["INT", "LONG", "signed_int_serde"]

_BYTE_ORDER = ">"  # big-endian: the most significant byte first, so byte order is value order
_STRUCT_CODES = {4: "I", 8: "Q"}  # struct's unsigned integer of each width


def signed_int_serde(name: str, width: int) -> Serde:
    """The order-preserving signed integer serde of ``width`` bytes (4 or 8)."""
    bits = width * 8
    bias = 1 << (bits - 1)  # the sign bit
    wire = struct.Struct(_BYTE_ORDER + _STRUCT_CODES[width])
    pack, unpack = wire.pack, wire.unpack

    # -- rows --
    def encode(n: Any) -> bytes:
        if type(n) is not int:
            raise TypeError(f"expected int, got {type(n).__name__}")
        try:
            return pack(n + bias)
        except struct.error:
            raise TypeError(f"{n} does not fit in a signed {bits}-bit integer") from None

    def decode(b: bytes) -> int:
        return unpack(b)[0] - bias

    def encode_many(items: list[Any]) -> list[bytes]:
        if all_of_type(items, int):
            try:
                return list(map(pack, map(add, items, repeat(bias))))
            except struct.error:
                pass  # out of range: the per-item encoder names the value
        return list(map(encode, items))

    def decode_many(items: list[bytes]) -> list[int]:
        return list(map(sub, map(itemgetter(0), map(unpack, items)), repeat(bias)))

    # -- Arrow columns: numpy over the same layout --
    signed, unsigned, wire_dtype = f"i{width}", f"u{width}", f"{_BYTE_ORDER}u{width}"

    def encode_columns(columns: Sequence[Any]) -> list[bytes]:
        import numpy as np
        import pyarrow as pa

        from .serdes_columns import single

        column = single(columns)
        if column.null_count or not pa.types.is_integer(column.type) or column.type == pa.uint64():
            return encode_many(column.to_pylist())
        values = column.to_numpy()
        if len(values) and (int(values.min()) < -bias or int(values.max()) >= bias):
            return encode_many(column.to_pylist())  # the row encoder names the value that does not fit
        flipped = values.astype(signed).view(unsigned) ^ np.dtype(unsigned).type(bias)
        # numpy's void items of the wire width convert to bytes in C
        return np.frombuffer(flipped.astype(wire_dtype).tobytes(), f"V{width}").tolist()

    def decode_columns(data: list[bytes | None]) -> list[Any]:
        import numpy as np
        import pyarrow as pa

        from .serdes_columns import rows_decoded

        binary = pa.array(data, pa.binary())  # None -> null, present values back to back
        offsets = np.frombuffer(binary.buffers()[1], np.int32, len(binary) + 1)
        present = len(binary) - binary.null_count
        if int(offsets[-1] - offsets[0]) != width * present or (np.diff(offsets) > width).any():
            return rows_decoded(serde, data)  # a value of another width: the row decoder's error
        raw = (np.frombuffer(binary.buffers()[2], wire_dtype, present, int(offsets[0])) if present
               else np.empty(0, unsigned))
        decoded = (raw.astype(unsigned) ^ np.dtype(unsigned).type(bias)).view(signed)
        value_type = pa.from_numpy_dtype(np.dtype(signed))
        if not binary.null_count:
            return [pa.array(decoded, value_type)]
        missing = binary.is_null().to_numpy(zero_copy_only=False)
        values = np.zeros(len(binary), signed)
        values[~missing] = decoded
        return [pa.array(values, value_type, mask=missing)]

    serde = Serde(name, encode, decode, True, encode_many, decode_many, int, encode_columns, decode_columns)
    return serde


INT = signed_int_serde("int", 4)
LONG = signed_int_serde("long", 8)
