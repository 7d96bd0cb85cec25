"""Key identity of the object cache: which Python keys are one key.

Two keys are one key exactly when their encodings are equal, with the cache on or off.
A Python dict would merge ``1``, ``1.0`` and ``True`` (and ``(1, "u")``, ``(1.0,
"u")``...), which the serdes keep apart, so only keys of exact type ``str``, ``bytes``
or ``int`` — and tuples of those — are cached as they are. Any other key is cached
under its encoding (:class:`Encoded`), or under the plain key its encoding decodes
back to (a ``str`` subclass such as a ``StrEnum`` member is the same key as the plain
string). ``get_all`` returns a dict, so keys that are equal in Python but encode
differently cannot both appear in one result: use ``get``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain, repeat
from operator import is_, itemgetter
from typing import Any

from ..errors import InvalidValueError

__all__ = ["Encoded", "KeyIdentity", "all_simple", "is_simple", "plain"]

_SIMPLE = frozenset((str, bytes, int))
_UNDECODABLE = object()


class Encoded:
    """The cache key of a key whose Python equality is looser than its encoding."""

    __slots__ = ("enc", "key", "_hash")

    def __init__(self, enc: bytes, key: Any) -> None:
        self.enc = enc
        self.key = key
        self._hash = hash(enc)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is Encoded and other.enc == self.enc  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return repr(self.key)


def is_simple(key: Any) -> bool:
    """Whether ``key`` is its own cache key (Python equality is its encoding's)."""
    t = type(key)
    if t in _SIMPLE:
        return True
    return t is tuple and set(map(type, key)) <= _SIMPLE


def all_simple(keys: list[Any]) -> bool:
    """Whether every key of ``keys`` is its own cache key (one pass over the types)."""
    types = set(map(type, keys))
    if types <= _SIMPLE:
        return True
    if types == {tuple}:
        return set(map(type, chain.from_iterable(keys))) <= _SIMPLE
    return False


def plain(k: Any) -> Any:
    """The key a cache key stands for."""
    return k.key if type(k) is Encoded else k


class KeyIdentity:
    """The cache keys of one store's keys, by its key serde.

    ``codec`` (the serialized layer: ``encode_key``, ``encode_keys``, ``decode_key``)
    validates each key (an unencodable one raises, naming the store); without one (no
    serdes: bytes keys) a key is its own cache key and only ``None`` is refused.
    """

    def __init__(self, codec: Any, name: str) -> None:
        self._codec = codec
        self._check: Callable[[Any], bytes] | None = codec.encode_key if codec is not None else None
        self.name = name

    def of(self, key: Any) -> Any:
        """The cache key of ``key`` (validated: an unencodable key raises here)."""
        return self.of_enc(key)[0]

    def of_enc(self, key: Any) -> tuple[Any, bytes | None]:
        """The cache key of ``key`` and its encoding (``None`` without a codec)."""
        check = self._check
        if check is None:
            if key is None:
                raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
            return key, None
        enc = check(key)
        if is_simple(key):
            return key, enc
        try:
            decoded = self._codec.decode_key(enc)
        except Exception:
            decoded = _UNDECODABLE
        if type(decoded) is list:
            decoded = tuple(decoded)  # json/msgpack arrays: a tuple of simple items is cached as itself
        if is_simple(decoded) and check(decoded) == enc:
            return decoded, enc  # e.g. a StrEnum member: the same key as its plain string
        return Encoded(enc, key), enc

    def of_all_enc(self, keys: list[Any]) -> tuple[list[Any], list[bytes]]:
        """The cache keys of ``keys`` and their encodings (a codec is given)."""
        if all_simple(keys):
            return keys, self._codec.encode_keys(keys)
        pairs = list(map(self.of_enc, keys))
        return list(map(itemgetter(0), pairs)), list(map(itemgetter(1), pairs))

    def of_all(self, keys: list[Any]) -> list[Any]:
        """The cache keys of ``keys``, each validated (in one pass when all are simple)."""
        if self._check is None or all_simple(keys):
            if self._check is not None:
                self._codec.encode_keys(keys)
            elif any(map(is_, keys, repeat(None))):
                raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
            return keys
        return list(map(self.of, keys))
