"""The :class:`Serde` type and the list helpers every serde family builds on.

The built-in serdes are defined one format family per module, each module holding its
family's row codec and Arrow column codec side by side over the same constants:
:mod:`localstate.serde_ints` (``int``, ``long``), :mod:`localstate.serde_tuple`
(``tuple``) and :mod:`localstate.serde_text` (``bytes``, ``string``, ``json``,
``msgpack``, ``pickle``). :mod:`localstate.serdes` registers them and is the module
users import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Serde", "all_of_type", "encoder_of_many", "decoder_of_many", "mapped"]


@dataclass(frozen=True)
class Serde:
    """A named pair of ``encode(obj) -> bytes`` / ``decode(bytes) -> obj``.

    ``encode_many`` / ``decode_many`` are optional fast paths over lists: they must
    return exactly ``[encode(x) for x in items]`` / ``[decode(b) for b in items]``
    (raising where those would), but may loop in C. Use :func:`encoder_of_many` /
    :func:`decoder_of_many` to get one whether or not a serde defines it.

    ``encode_columns`` / ``decode_columns`` are optional fast paths over Arrow columns
    (``TaskStorage.columns``): ``encode_columns(columns)`` must return exactly the bytes
    ``encode`` gives for each row (a row: the tuple of the columns' values for ``tuple``,
    the single column's value otherwise), ``decode_columns(encoded)`` the columns of the
    decoded values (``None`` entries: nulls). Without them each value goes through
    ``encode`` / ``decode``.
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
    encode_columns: Callable[[Sequence[Any]], list[bytes]] | None = None
    decode_columns: Callable[[list[bytes | None]], list[Any]] | None = None


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


def mapped(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """``fn`` over a list, looping in C (``map``) when ``fn`` itself is C."""
    return lambda items: list(map(fn, items))
