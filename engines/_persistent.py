"""Helpers shared by the on-disk key-value engines (``rocksdb``, ``leveldb``).

* :class:`IteratorRegistry` — hands out :class:`~localstate.kv.KeyValueIterator` objects
  and closes every one still open when the engine closes (a live native iterator can
  keep the database lock, so ``close()`` must drop them first);
* :func:`engine_lock` — an exclusive ``flock`` on ``<store dir>/engine.lock`` naming the
  holder's pid, taken before the native library opens the database, so a second
  process gets "locked by pid N" instead of a bare library error;
* :func:`explain_bad_pairs` / :func:`explain_bad_key` — turn the native library's
  terse type error into the standard :class:`~localstate.errors.SerializationError`
  (type checks happen only after the library refused, so the happy path pays nothing);
* the durable file steps (``fsync_dir``, ``remove_tree``) live in :mod:`localstate.locking`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from pathlib import Path

from localstate.kv import KeyValueIterator
from localstate.locking import FileLock

from ._util import require_bytes, require_bytes_pairs

__all__ = [
    "IteratorRegistry",
    "engine_lock",
    "explain_bad_pairs",
    "explain_bad_key",
]


class _TrackedIterator(KeyValueIterator):
    """A KeyValueIterator that can be weakly referenced (the base class has no slot)."""

    __slots__ = ("__weakref__",)


class IteratorRegistry:
    """The open iterators of one engine, weakly held.

    An iterator the caller drops without closing is collected as usual; one still
    referenced when the engine closes is closed by :meth:`close_all`, which releases
    the native iterator it wraps.
    """

    def __init__(self) -> None:
        self._open: weakref.WeakSet[_TrackedIterator] = weakref.WeakSet()

    def open(self, items: Iterable[tuple[bytes, bytes]], what: str) -> KeyValueIterator[bytes, bytes]:
        it = _TrackedIterator(items, what=what)
        registry = self._open
        ref = weakref.ref(it)

        def forget() -> None:
            # through a weak reference: a closure holding ``it`` would make a cycle, and an
            # abandoned iterator (with its native iterator and the DB lock) would then
            # wait for the cyclic GC instead of going away at once
            target = ref()
            if target is not None:
                registry.discard(target)

        it._on_close = forget
        registry.add(it)
        return it

    def close_all(self) -> None:
        for it in list(self._open):
            it.close()
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)


def engine_lock(directory: Path, store: str, engine: str) -> FileLock:
    """Lock ``directory`` for one engine instance (raises ``StoreLockedError``)."""
    return FileLock(directory / "engine.lock", f"store {store!r} ({engine} at {directory})")


def explain_bad_key(store: str, key: object) -> None:
    """Raise the standard error if ``key`` is not bytes; return if it is."""
    if type(key) is not bytes:
        require_bytes(store, "key", key)


def explain_bad_pairs(store: str, entries: Iterable[tuple[object, object]]) -> None:
    """Raise the standard error for the first non-bytes key/value (or ``None`` value)."""
    require_bytes_pairs(store, entries)
