"""Serdes: how keys and values become bytes.

Built-ins: ``bytes``, ``string`` (UTF-8), ``json``, ``msgpack``, ``int`` (4-byte),
``long`` (8-byte), ``tuple`` (composite keys) and ``pickle`` (only by name).
``int``, ``long``, ``string``, ``bytes`` and ``tuple`` are **order-preserving**:
byte order equals value order, so ``range()`` over them means what it says.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from itertools import repeat
from operator import add, itemgetter, sub
from typing import Any

import msgpack

from .errors import ConfigError, SerializationError, UnknownSerdeError
from .registry import Registry

__all__ = [
    "Serde",
    "register_serde",
    "get_serde",
    "describe_encode_error",
    "encode_for",
    "encoder_of_many",
    "decoder_of_many",
    "prefixed_encoder_of_many",
    "checked_serde",
    "SERDES",
]


@dataclass(frozen=True)
class Serde:
    """A named pair of ``encode(obj) -> bytes`` / ``decode(bytes) -> obj``.

    ``encode_many`` / ``decode_many`` are optional fast paths over lists: they must
    return exactly ``[encode(x) for x in items]`` / ``[decode(b) for b in items]``
    (raising where those would), but may loop in C. Use :func:`encoder_of_many` /
    :func:`decoder_of_many` to get one whether or not a serde defines it.
    """

    name: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    order_preserving: bool = False
    encode_many: Callable[[list[Any]], list[bytes]] | None = None
    decode_many: Callable[[list[bytes]], list[Any]] | None = None
    python_type: type | None = None
    """The Python type ``decode`` returns, when there is exactly one (``string``: ``str``);
    ``None`` for serdes of many types (``json``, ``msgpack``, ``pickle``). Typed store
    accessors (``storage.store(name, str, int)``) check against it."""


def all_of_type(items: Iterable[Any], cls: type) -> bool:
    """True when every item's type is exactly ``cls`` (one C-level pass, no per-item Python call)."""
    return set(map(type, items)) <= {cls}


def encoder_of_many(serde: Serde) -> Callable[[list[Any]], list[bytes]]:
    """``serde.encode_many``, or a ``map`` of ``serde.encode`` when it has none."""
    if serde.encode_many is not None:
        return serde.encode_many
    encode = serde.encode
    return lambda items: list(map(encode, items))


def decoder_of_many(serde: Serde) -> Callable[[list[bytes]], list[Any]]:
    """``serde.decode_many``, or a ``map`` of ``serde.decode`` when it has none."""
    if serde.decode_many is not None:
        return serde.decode_many
    decode = serde.decode
    return lambda items: list(map(decode, items))


def prefixed_encoder_of_many(serde: Serde) -> Callable[[Iterable[bytes], list[Any]], list[bytes]]:
    """``(prefixes, items) -> [prefix + encoded item, ...]``: what a serde that stores a
    fixed header before the value's own bytes (the TTL serde's expiry) needs at a flush.
    For the built-in json serde it is one copy per item (each orjson result goes straight
    after its prefix) instead of two; ~160 ns less per value on 1,000 small dicts."""
    if serde is _BUILT_IN_JSON:
        return _json_encode_many_prefixed
    encode_many = encoder_of_many(serde)
    return lambda prefixes, items: list(map(bytes.__add__, prefixes, encode_many(items)))


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


def _json_encoder() -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    try:
        import orjson

        return orjson.dumps, orjson.loads
    except ImportError:
        enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

        def dumps(o: Any) -> bytes:
            return enc(o).encode()

        return dumps, json.loads


_json_dumps, _json_loads = _json_encoder()


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


def _json_encode_many_prefixed(prefixes: Iterable[bytes], items: list[Any]) -> list[bytes]:
    # the prefix + result concatenation is the right-sized copy that frees each orjson block
    outs = list(map(bytes.__add__, prefixes, map(_json_dumps, items)))
    if b"null" in b"\x00".join(outs) and any(map(_has_non_finite, items)):
        raise ValueError(_NON_FINITE)
    return outs


def _fixed_int(width: int) -> Serde:
    """The order-preserving ``int`` (4-byte) or ``long`` (8-byte) serde: big-endian, sign bit flipped."""
    fmt = ">I" if width == 4 else ">Q"
    bias = 1 << (width * 8 - 1)
    pack, unpack = struct.Struct(fmt).pack, struct.Struct(fmt).unpack

    def encode(n: Any) -> bytes:
        if type(n) is not int:
            raise TypeError(f"expected int, got {type(n).__name__}")
        try:
            return pack(n + bias)
        except struct.error:
            raise TypeError(f"{n} does not fit in a signed {width * 8}-bit integer") from None

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

    return Serde("int" if width == 4 else "long", encode, decode, True, encode_many, decode_many, int)


# -- tuple: an order-preserving composite encoding -----------------------------------
# Each element is a type tag followed by its body; tags order None < bool < int <
# float < bytes < str < nested tuple. Strings/bytes are terminated by 0x00 with 0x00
# escaped as 0x00 0xff, so a shorter string sorts before its extensions.
_T_NONE, _T_FALSE, _T_TRUE, _T_INT, _T_FLOAT, _T_BYTES, _T_STR, _T_TUPLE, _T_END = (
    0x01, 0x02, 0x03, 0x10, 0x20, 0x30, 0x40, 0x50, 0x00,
)
_Q = struct.Struct(">Q")
_D = struct.Struct(">d")
_TAGGED_Q = struct.Struct(">BQ")  # a tag byte and an 8-byte body in one pack
_BIAS = 1 << 63


def _tuple_encode_into(out: bytearray, t: Any) -> None:
    for x in t:
        cls = type(x)  # exact types: bool is not taken for int, nor a str subclass for str
        if cls is int:  # the common element types first
            if not -_BIAS <= x < _BIAS:
                raise TypeError(f"tuple element {x} does not fit in 64 bits")
            out += _TAGGED_Q.pack(_T_INT, x + _BIAS)
        elif cls is str:
            out.append(_T_STR)
            out += x.encode().replace(b"\x00", b"\x00\xff")
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
            out += x.replace(b"\x00", b"\x00\xff")
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


_ESCAPED_TAGS = {str: _T_STR, bytes: _T_BYTES}
_TAGGED_Q_TAG = struct.Struct(">BQB")  # an int element and the tag of the str/bytes element after it


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
    if b"\x00" in b"".join(raw):
        raw = [x.replace(b"\x00", b"\x00\xff") for x in raw]
    body = [raw, repeat(b"\x00")]
    return body if tagged else [repeat(bytes((_ESCAPED_TAGS[kind],))), *body]


def _tuple_encode_many(items: list[Any]) -> list[bytes]:
    """``[_tuple_encode(t) for t in items]``, column by column when the tuples share one
    shape of int/str/bytes elements (e.g. ``(window_start, user_id)`` keys): a C-level
    pass per column and one join per tuple instead of a Python loop per element."""
    if len(items) >= 16 and all_of_type(items, tuple):
        widths = set(map(len, items))
        if len(widths) == 1 and (width := widths.pop()) > 0:
            columns = [list(map(itemgetter(i), items)) for i in range(width)]
            kinds = list(map(_column_kind, columns))
            if None not in kinds:
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
    j = b.index(0, i)
    if j + 1 == len(b) or b[j + 1] != 0xFF:
        return b[i:j], j + 1  # no escaped zero byte inside: the common case, one slice
    out = bytearray()
    while True:
        out += b[i:j]
        if j + 1 < len(b) and b[j + 1] == 0xFF:
            out.append(0)
            i = j + 2
            j = b.index(0, i)
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
    if len(b) > 10 and b[0] == _T_INT and b[9] == _T_STR and b.find(0, 10) == len(b) - 1:
        return (_Q.unpack_from(b, 1)[0] - _BIAS, b[10:-1].decode())
    return _tuple_decode_from(b, 0, False)[0]


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


SERDES = Registry("serde", "localstate.serdes", UnknownSerdeError)
_BUILT_INS: set[int] = set()
"""The ids of the built-in serde objects (alive for the process): trusted to return bytes."""

def _mapped(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """``fn`` over a list, looping in C (``map``) when ``fn`` itself is C."""
    return lambda items: list(map(fn, items))


_BUILT_IN_JSON = Serde("json", _json_encode, _json_loads, False, _json_encode_many, _mapped(_json_loads))

for _serde in (
    Serde("bytes", _identity_bytes, bytes, True, _identity_bytes_many, _mapped(bytes), bytes),
    Serde("string", _str_encode, bytes.decode, True, _str_encode_many, _str_decode_many, str),
    _BUILT_IN_JSON,
    Serde("msgpack", _msgpack_encode, _msgpack_decode, False, _msgpack_encode_many, _msgpack_decode_many),
    _fixed_int(4),
    _fixed_int(8),
    Serde("tuple", _tuple_encode, _tuple_decode, True, _tuple_encode_many, _mapped(_tuple_decode), tuple),
    Serde("pickle", _pickle_encode, pickle.loads, False, _mapped(_pickle_encode), _mapped(pickle.loads)),
):
    SERDES.register(_serde.name, _serde, origin="built-in")
    _BUILT_INS.add(id(_serde))


_CHECKED: dict[int, Serde] = {}


def _bytes_result(result: Any, serde: Serde) -> bytes:
    """A user encoder's result as ``bytes``, or a TypeError saying what it returned."""
    if type(result) is bytes:
        return result
    if isinstance(result, (bytearray, memoryview)):
        return bytes(result)
    raise TypeError(f"serde {serde.name!r} returned {type(result).__name__} {result!r:.60}, not bytes")


def checked_serde(serde: Serde) -> Serde:
    """``serde`` with encoders that check their results are bytes (a bytearray or
    memoryview result becomes bytes). A user's encoder that returns ``None`` or a ``str``
    then fails at the ``put`` that passed the value, where the layers name the store and
    the key, not at a later flush, commit or close with a storage library's error.
    Built-in serdes return bytes by construction and are given back unchanged; a checked
    serde is checked once."""
    if id(serde) in _BUILT_INS or getattr(serde, "_checked", False):
        return serde
    done = _CHECKED.get(id(serde))
    if done is not None and done._original is serde:  # type: ignore[attr-defined]
        return done
    encode, encode_many = serde.encode, serde.encode_many

    def checked_encode(obj: Any) -> bytes:
        result = encode(obj)
        return result if type(result) is bytes else _bytes_result(result, serde)

    def checked_encode_many(items: list[Any]) -> list[bytes]:
        results = encode_many(items)  # type: ignore[misc]
        if not isinstance(results, list) or len(results) != len(items):
            raise TypeError(f"serde {serde.name!r}: encode_many returned {type(results).__name__}, "
                            f"not a list of {len(items)} bytes")
        return results if all_of_type(results, bytes) else [_bytes_result(r, serde) for r in results]

    done = replace(serde, encode=checked_encode,
                   encode_many=checked_encode_many if encode_many is not None else None)
    object.__setattr__(done, "_checked", True)
    object.__setattr__(done, "_original", serde)
    _CHECKED[id(serde)] = done
    return done


def register_serde(serde: Serde, clobber: bool = False) -> None:
    """Register a user :class:`Serde` under ``serde.name``."""
    SERDES.register(serde.name, serde, clobber=clobber, origin="register_serde()")


def get_serde(name: str, *, store: str | None = None) -> Serde:
    """The serde registered as ``name`` (or at ``"module:attr"``)."""
    obj = SERDES.get(name, store=store)
    if not isinstance(obj, Serde):
        raise ConfigError(
            f"store {store!r}: serde {name!r} resolves to {obj!r}, not a localstate.Serde"
        )
    return obj


def encode_for(store: str, what: str, serde: Serde, obj: Any) -> bytes:
    """``obj`` encoded by ``serde`` for store ``store`` (``what``: ``"key"`` or
    ``"value"``): bytes pass straight through the ``bytes`` serde; anything the serde
    refuses is the standard :class:`SerializationError` naming the store and the fix."""
    if type(obj) is bytes and serde.name == "bytes":
        return obj
    try:
        return serde.encode(obj)
    except Exception as e:
        raise describe_encode_error(store, what, serde, obj, e) from e


def describe_encode_error(store: str, what: str, serde: Serde, obj: Any, err: Exception) -> SerializationError:
    """The standard error for an object a serde cannot encode."""
    return SerializationError(
        f"store {store!r}: the {what} serde {serde.name!r} cannot encode {obj!r} "
        f"({type(obj).__name__}): {err}. Convert the {what} first or set "
        f"stores.{store}.{'key' if what == 'key' else 'msg'}.serde to a serde for this type."
    )

