"""``bytes``, ``string`` (UTF-8), ``json``, ``msgpack`` and ``pickle``: values whose bytes
are their own (``bytes``), their UTF-8 text (``string``) or a library's encoding.

``bytes`` and ``string`` are order-preserving (byte order is value order) and take Arrow
columns as Arrow's own binary data; the others have no column codec.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import msgpack

from .serde_base import Serde, all_of_type, mapped

__all__ = ["BYTES", "STRING", "JSON", "MSGPACK", "PICKLE", "json_encode_many_prefixed"]


# -- bytes ----------------------------------------------------------------------------------
def _identity_bytes(b: Any) -> bytes:
    if type(b) is bytes:
        return b
    if isinstance(b, (bytearray, memoryview)):
        return bytes(b)
    raise TypeError(f"expected bytes, got {type(b).__name__}")


def _identity_bytes_many(items: list[Any]) -> list[bytes]:
    if all_of_type(items, bytes):
        return list(items)
    return list(map(_identity_bytes, items))


# -- string ---------------------------------------------------------------------------------
def _str_encode(s: Any) -> bytes:
    if type(s) is not str:
        raise TypeError(f"expected str, got {type(s).__name__}")
    return s.encode()


def _str_encode_many(items: list[Any]) -> list[bytes]:
    if all_of_type(items, str):
        return list(map(str.encode, items))
    return list(map(_str_encode, items))  # raises the per-item error for the first non-str


def _str_decode_many(items: list[bytes]) -> list[str]:
    return list(map(bytes.decode, items))


# -- bytes and string as Arrow columns: Arrow's binary data is the encoding ------------------
def _encode_binary_columns(serde: Serde, columns: Sequence[Any], text: bool) -> list[bytes]:
    """A binary (``bytes``) or string (``string``: UTF-8) column's values are their encoding;
    any other column, or one with nulls, goes through the row encoder."""
    import pyarrow as pa

    from .serdes_columns import rows_encoded, single

    column = single(columns)
    kind = column.type
    wanted = (pa.types.is_string(kind) or pa.types.is_large_string(kind)) if text else \
        (pa.types.is_binary(kind) or pa.types.is_large_binary(kind))
    if column.null_count or not wanted:
        return rows_encoded(serde, [column])
    return column.cast(pa.large_binary()).to_pylist()


def _encode_bytes_columns(columns: Sequence[Any]) -> list[bytes]:
    return _encode_binary_columns(BYTES, columns, text=False)


def _encode_string_columns(columns: Sequence[Any]) -> list[bytes]:
    return _encode_binary_columns(STRING, columns, text=True)


def _decode_bytes_columns(data: list[bytes | None]) -> list[Any]:
    import pyarrow as pa

    return [pa.array(data, pa.binary())]


def _decode_string_columns(data: list[bytes | None]) -> list[Any]:
    import pyarrow as pa

    from .serdes_columns import rows_decoded

    try:
        return [pa.array(data, pa.binary()).cast(pa.string())]
    except pa.ArrowInvalid:
        return rows_decoded(STRING, data)  # not UTF-8: the row decoder names the value


# -- json -----------------------------------------------------------------------------------
def _json_codec() -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    try:
        import orjson

        return orjson.dumps, orjson.loads
    except ImportError:
        enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

        def dumps(o: Any) -> bytes:
            return enc(o).encode()

        return dumps, json.loads


_json_dumps, _json_loads = _json_codec()


def _has_non_finite(o: Any) -> bool:
    t = type(o)
    if t is float:
        return not math.isfinite(o)
    if t is dict:
        return any(map(_has_non_finite, o.values()))
    if t is list or t is tuple:
        return any(map(_has_non_finite, o))
    return isinstance(o, float) and not math.isfinite(o)


_NON_FINITE = "NaN and infinities have no JSON form (orjson would write null, so the value would change)"


def _json_encode(o: Any) -> bytes:
    # a right-sized copy, as in _json_encode_many: the object cache keeps each put's bytes
    # until its flush, and orjson's own result holds a larger system-allocator block
    out = bytes(memoryview(_json_dumps(o)))
    if b"null" in out and _has_non_finite(o):  # null is rare: the walk runs only then
        raise ValueError(_NON_FINITE)
    return out


def _json_encode_many(items: list[Any]) -> list[bytes]:
    # Each orjson result is a fresh system-allocator block; a thousand kept alive at once
    # (a flush) cost 1-2 µs each in new memory, while copying each into a right-sized
    # bytes frees its block for the next call: ~5x faster on 1,000 small dicts.
    outs = [bytes(memoryview(o)) for o in map(_json_dumps, items)]
    if b"null" in b"\x00".join(outs) and any(map(_has_non_finite, items)):
        raise ValueError(_NON_FINITE)
    return outs


def json_encode_many_prefixed(prefixes: Iterable[bytes], items: list[Any]) -> list[bytes]:
    """``[prefix + JSON.encode(item), ...]`` with one copy per item: the prefix + result
    concatenation is the right-sized copy that frees each orjson block."""
    outs = list(map(bytes.__add__, prefixes, map(_json_dumps, items)))
    if b"null" in b"\x00".join(outs) and any(map(_has_non_finite, items)):
        raise ValueError(_NON_FINITE)
    return outs


# -- msgpack and pickle -----------------------------------------------------------------------
def _msgpack_encode(o: Any) -> bytes:
    return msgpack.packb(o, use_bin_type=True)


def _msgpack_decode(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False, strict_map_key=False)


def _msgpack_encode_many(items: list[Any]) -> list[bytes]:
    return list(map(msgpack.Packer(use_bin_type=True).pack, items))


_msgpack_unpackb = partial(msgpack.unpackb, raw=False, strict_map_key=False)


def _msgpack_decode_many(items: list[bytes]) -> list[Any]:
    return list(map(_msgpack_unpackb, items))


def _pickle_encode(o: Any) -> bytes:
    return pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)


BYTES = Serde("bytes", _identity_bytes, bytes, True, _identity_bytes_many, mapped(bytes), bytes,
              _encode_bytes_columns, _decode_bytes_columns)
STRING = Serde("string", _str_encode, bytes.decode, True, _str_encode_many, _str_decode_many, str,
               _encode_string_columns, _decode_string_columns)
JSON = Serde("json", _json_encode, _json_loads, False, _json_encode_many, mapped(_json_loads))
MSGPACK = Serde("msgpack", _msgpack_encode, _msgpack_decode, False, _msgpack_encode_many, _msgpack_decode_many)
PICKLE = Serde("pickle", _pickle_encode, pickle.loads, False, mapped(_pickle_encode), mapped(pickle.loads))
