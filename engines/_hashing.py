"""The fixed item hash of the sketch engines (``hyperloglog``, ``bloom``).

Sketch state is only meaningful together with the hash that built it, and that state
outlives processes (it is restored from the changelog), so the hash is fixed and
documented here rather than configurable:

* an item is encoded to bytes: ``bytes``/``bytearray``/``memoryview`` as they are,
  ``str`` as UTF-8, ``int`` (not ``bool``) as its decimal digits in ASCII — so ``42``
  and ``"42"`` are the same item, on purpose (the same id arriving as text or number
  counts once). Anything else raises :class:`~localstate.errors.SerializationError`;
* the hash is ``xxhash.xxh3_64_intdigest(encoded, seed=0)``, a 64-bit unsigned integer.

Batches are hashed with one C-level ``map`` (no per-item Python frame) when every item
is ``str`` or every item is bytes; mixed batches fall back to a per-item loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import xxhash
from localstate.errors import SerializationError

__all__ = ["encode_item", "hash_item", "hash_items", "HASH_NAME"]

HASH_NAME = "xxh3_64(seed=0) of the item's bytes (str: UTF-8, int: decimal ASCII)"
_xxh = xxhash.xxh3_64_intdigest
_encode_str = str.encode


def encode_item(store: str, item: Any) -> bytes | bytearray | memoryview:
    """The documented byte encoding of one item; ``SerializationError`` for other types."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, int) and not isinstance(item, bool):
        return b"%d" % item
    t = type(item)
    raise SerializationError(
        f"store {store!r}: cannot hash an item of type {t.__name__} ({item!r:.60}); sketch items "
        "must be bytes, str or int. Convert it first, e.g. str(item) or a stable id."
    )


def hash_item(store: str, item: Any) -> int:
    """The 64-bit hash of one item (see the module doc)."""
    t = type(item)
    if t is bytes:
        return _xxh(item)
    if t is str:
        return _xxh(item.encode())
    return _xxh(encode_item(store, item))


def hash_items(store: str, items: Iterable[Any]) -> np.ndarray:
    """``uint64`` hashes of ``items``, in order (see the module doc)."""
    if not isinstance(items, (list, tuple)):
        items = list(items)
    n = len(items)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    first = type(items[0])
    try:
        if first is str:
            return np.fromiter(map(_xxh, map(_encode_str, items)), dtype=np.uint64, count=n)
        if first is bytes:
            return np.fromiter(map(_xxh, items), dtype=np.uint64, count=n)
    except TypeError:
        pass  # a mixed batch: the loop below encodes each item or names the bad one
    return np.fromiter((_xxh(encode_item(store, x)) for x in items), dtype=np.uint64, count=n)
