"""The key-value store protocol every KV engine and every layer implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from .errors import InvalidValueError, StoreClosedError

__all__ = ["KeyValueStore", "KeyValueIterator", "prefix_upper_bound"]

K = TypeVar("K")
V = TypeVar("V")


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix``.

    ``None`` means "no upper bound" (the prefix is empty or all ``0xff``).

    >>> prefix_upper_bound(b"ab")
    b'ac'
    >>> prefix_upper_bound(b"a\\xff")
    b'b'
    """
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


class KeyValueIterator(Generic[K, V]):
    """An iterator of ``(key, value)`` pairs that must be closed.

    Use it as a context manager (``with store.range(a, b) as it: ...``) or call
    :meth:`close`. Iterating a closed iterator raises :class:`StoreClosedError`.
    Closing is idempotent. ``on_close`` callbacks release engine resources (for
    example a RocksDB iterator that would otherwise keep the DB lock).
    """

    __slots__ = ("_it", "_closed", "_on_close", "_what")

    def __init__(
        self,
        items: Iterable[tuple[K, V]],
        on_close: Any = None,
        what: str = "iterator",
    ) -> None:
        self._it: Iterator[tuple[K, V]] = iter(items)
        self._closed = False
        self._on_close = on_close
        self._what = what

    def __iter__(self) -> KeyValueIterator[K, V]:
        return self

    def __next__(self) -> tuple[K, V]:
        if self._closed:
            raise StoreClosedError(f"{self._what} is closed; open a new range()/all() iterator")
        return next(self._it)

    def map(self, fn: Any) -> KeyValueIterator[Any, Any]:
        """A new iterator applying ``fn`` to each pair; closing it closes this one."""
        return KeyValueIterator(map(fn, self), on_close=self.close, what=self._what)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._it = iter(())
        cb, self._on_close = self._on_close, None
        if cb is not None:
            cb()

    def __enter__(self) -> KeyValueIterator[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net only
        try:
            self.close()
        except Exception:
            pass


class KeyValueStore(ABC, Generic[K, V]):
    """A mutable, ordered key-value store.

    Contract (shared by engines, which speak ``bytes``, and by every layer):

    * ``get(key)`` returns the value or ``None`` when the key is absent.
    * ``put(key, None)`` is an error (:class:`InvalidValueError`): use ``delete``.
    * ``delete(key)`` of an absent key is not an error.
    * ``range(start, stop)`` yields pairs with ``start <= key < stop`` compared on the
      **encoded key bytes**, in ascending encoded order; ``None`` bounds are open.
    * ``prefix(p)`` yields the pairs whose encoded key starts with the encoding of ``p``.
    * iterators are :class:`KeyValueIterator` and must be closed.
    * after ``close()`` (idempotent) every operation raises :class:`StoreClosedError`.

    Bulk methods have looping defaults; engines override them with native batches
    and the layers with one pass per batch (one serde pass, one engine batch, one
    changelog hand-over), so ``get_all``/``put_all``/``delete_all`` are the fast path
    for many keys.
    """

    name: str = "store"

    @abstractmethod
    def get(self, key: K) -> V | None:
        """The value stored under ``key``, or ``None``."""

    @abstractmethod
    def put(self, key: K, value: V) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""

    @abstractmethod
    def delete(self, key: K) -> None:
        """Remove ``key``; absent keys are ignored."""

    @abstractmethod
    def range(self, start: K | None, stop: K | None) -> KeyValueIterator[K, V]:
        """Pairs with ``start <= key < stop`` on encoded bytes, ascending."""

    @abstractmethod
    def prefix(self, prefix: K) -> KeyValueIterator[K, V]:
        """Pairs whose encoded key starts with the encoded ``prefix``, ascending."""

    @abstractmethod
    def all(self) -> KeyValueIterator[K, V]:
        """Every pair, ascending by encoded key."""

    @abstractmethod
    def flush(self) -> None:
        """Push buffered writes down (does not commit)."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; idempotent; does not commit."""

    # -- bulk defaults -------------------------------------------------------------
    def get_all(self, keys: Iterable[K]) -> dict[K, V]:
        """Values of the keys that are present (absent keys are left out)."""
        get = self.get
        out: dict[K, V] = {}
        for k in keys:
            v = get(k)
            if v is not None:
                out[k] = v
        return out

    def put_all(self, entries: Iterable[tuple[K, V]] | Mapping[K, V]) -> None:
        """``put`` every pair, in order (later pairs for one key win).

        A ``None`` value anywhere in ``entries`` raises :class:`InvalidValueError`
        before anything is written.
        """
        entries = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
        for k, v in entries:
            if v is None:
                reject_none(self.name, k, v)
        put = self.put
        for k, v in entries:
            put(k, v)

    def delete_all(self, keys: Iterable[K]) -> None:
        """``delete`` every key."""
        delete = self.delete
        for k in keys:
            delete(k)

    # -- mapping dunders -----------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        self.delete(key)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def __enter__(self) -> KeyValueStore[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reject_none(store: str, key: object, value: object) -> None:
    """Raise the standard error for ``put(key, None)``."""
    if value is None:
        raise InvalidValueError(
            f"store {store!r}: put({key!r}, None) is not allowed; use delete({key!r}) to remove a key"
        )
