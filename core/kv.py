"""The key-value store protocol every KV engine and every layer implements."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from itertools import islice
from operator import itemgetter
from typing import Any, Generic, TypeVar, overload

from .errors import InvalidValueError, StoreClosedError

__all__ = ["KeyValueStore", "KeyValueIterator", "CloseableIterator", "prefix_upper_bound", "keys_of"]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
U = TypeVar("U")
D = TypeVar("D")

_MISSING: Any = object()
_CLEAR_CHUNK = 10_000


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


class CloseableIterator(Generic[T]):
    """An iterator that holds engine resources and must be closed.

    Use it as a context manager (``with store.keys() as keys: ...``) or call
    :meth:`close`. Iterating a closed iterator raises :class:`StoreClosedError`;
    an iterator run to its end closes itself (and keeps raising ``StopIteration``).
    Closing is idempotent. ``on_close`` callbacks release engine resources (for
    example a RocksDB iterator that would otherwise keep the DB lock). An iterator
    that is dropped unclosed is closed when it is garbage-collected — a safety net,
    not a contract: close it.
    """

    __slots__ = ("_it", "_closed", "_exhausted", "_on_close", "_what")

    def __init__(
        self,
        items: Iterable[T],
        on_close: Callable[[], object] | None = None,
        what: str = "iterator",
    ) -> None:
        self._it: Iterator[T] = iter(items)
        self._closed = False
        self._exhausted = False
        self._on_close = on_close
        self._what = what

    def __iter__(self) -> CloseableIterator[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            if self._exhausted:
                raise StopIteration
            raise StoreClosedError(f"{self._what} is closed; open a new range()/all() iterator")
        try:
            return next(self._it)
        except StopIteration:
            # Run to its end (``dict(store)``, ``list(store.keys())``): release the engine
            # iterator now rather than at garbage collection; it stays exhausted.
            self._exhausted = True
            self.close()
            raise

    def take(self, n: int) -> list[T]:
        """The next ``n`` items (fewer at the end; ``[]`` once exhausted) in one call:
        a batch scan pays no Python call per item. Same closed/exhausted rules as ``next``."""
        if type(n) is not int or n < 0:
            raise InvalidValueError(f"{self._what}: take(n) needs an int n >= 0, got {n!r}")
        if self._closed:
            if self._exhausted:
                return []
            raise StoreClosedError(f"{self._what} is closed; open a new range()/all() iterator")
        items = list(islice(self._it, n))
        if len(items) < n:
            self._exhausted = True
            self.close()
        return items

    def map(self, fn: Callable[[T], U]) -> CloseableIterator[U]:
        """A new iterator applying ``fn`` to each item; closing it closes this one."""
        return CloseableIterator(map(fn, self), on_close=self.close, what=self._what)

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

    def __enter__(self) -> CloseableIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net only
        try:
            self.close()
        except Exception:
            pass


class KeyValueIterator(CloseableIterator[tuple[K, V]], Generic[K, V]):
    """A :class:`CloseableIterator` of ``(key, value)`` pairs (what ``range``,
    ``prefix``, ``all`` and ``items`` return)."""

    __slots__ = ()

    def __iter__(self) -> KeyValueIterator[K, V]:
        return self

    def __enter__(self) -> KeyValueIterator[K, V]:
        return self

    def map(self, fn: Callable[[tuple[K, V]], Any]) -> KeyValueIterator[Any, Any]:
        """A new iterator applying ``fn`` to each pair; closing it closes this one."""
        return KeyValueIterator(map(fn, self), on_close=self.close, what=self._what)


class KeyValueStore(MutableMapping[K, V], Generic[K, V]):
    """A mutable, ordered key-value store; a :class:`collections.abc.MutableMapping`.

    Contract (shared by engines, which speak ``bytes``, and by every layer):

    * ``get(key, default=None)`` returns the value, or ``default`` when the key is
      absent. Engines must accept ``default``; the layers never pass it down.
    * ``put(key, None)`` is an error (:class:`InvalidValueError`): use ``delete``.
      ``None`` is never a stored value, so ``get(key) is None`` means "absent".
    * ``delete(key)`` of an absent key is not an error.
    * ``range(start, stop)`` yields pairs with ``start <= key < stop`` compared on the
      **encoded key bytes**, in ascending encoded order; ``None`` bounds are open.
    * ``prefix(p)`` yields the pairs whose encoded key starts with the encoding of ``p``.
    * iterators are :class:`CloseableIterator` (pairs: :class:`KeyValueIterator`) and
      must be closed: ``range``/``prefix``/``all`` and the mapping views ``keys()``,
      ``values()``, ``items()`` and ``iter(store)`` alike.
    * after ``close()`` (idempotent) every operation raises :class:`StoreClosedError`.

    The mapping protocol (``store[k]``, ``len``, ``in``, ``setdefault``, ``pop``,
    ``popitem``, ``update``, ``clear``, ``keys``/``values``/``items``) is built on the
    methods above, so every engine and layer has it. Where a store differs from a
    ``dict`` (see docs/state-api.md): ``keys()``/``values()``/``items()`` return
    closeable iterators in ascending encoded-key order, not views; ``len()`` is exact
    but may scan (``approximate_len()`` is the cheap estimate); ``==`` is identity
    (compare ``dict(store)``); ``bool(store)`` looks at one key only.

    Bulk methods have looping defaults; engines override them with native batches
    and the layers with one pass per batch (one serde pass, one engine batch, one
    changelog hand-over), so ``get_all``/``put_all``/``delete_all`` are the fast path
    for many keys.
    """

    name: str = "store"

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: V) -> V: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...

    @abstractmethod
    def get(self, key: K, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default`` (``None``) when it is absent."""

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

    # -- the mapping protocol --------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        """Remove ``key``. Unlike ``dict``, an absent key is not a ``KeyError`` (one
        write, no read first: the same as :meth:`delete`)."""
        self.delete(key)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        """The exact number of keys. O(1) where the engine counts (memory), else one
        scan of the store (RocksDB, LevelDB): use :meth:`approximate_len` for a cheap
        estimate."""
        with self.all() as it:
            return sum(1 for _ in it)

    def approximate_len(self) -> int:
        """A cheap estimate of ``len(self)``; exact unless the engine says otherwise
        (RocksDB: ``rocksdb.estimate-num-keys``, which counts overwritten and deleted
        keys until compaction)."""
        return len(self)

    def __bool__(self) -> bool:
        """True when the store holds at least one key (reads one key, not all)."""
        with self.all() as it:
            return next(it, None) is not None

    def __iter__(self) -> CloseableIterator[K]:  # type: ignore[override]
        """The keys in ascending encoded order, as a closeable iterator: prefer
        ``with store.keys() as keys:`` so the engine iterator is released at once."""
        return self.keys()

    def keys(self) -> CloseableIterator[K]:  # type: ignore[override]
        """The keys in ascending encoded order; a closeable iterator, not a view."""
        return self.range_keys(None, None)

    def range_keys(self, start: K | None, stop: K | None) -> CloseableIterator[K]:
        """The keys of :meth:`range` (``start <= key < stop`` on encoded bytes, ascending;
        both ``None``: the keys of :meth:`all`), without their values. This default maps
        the pairs; engines and layers that can leave the values unread and undecoded
        (the memory engine, the serialized layer) override it."""
        if start is None and stop is None:
            return keys_of(self.all())
        return keys_of(self.range(start, stop))

    def values(self) -> CloseableIterator[V]:  # type: ignore[override]
        """The values in ascending encoded-key order; a closeable iterator, not a view."""
        return self.all().map(_second)

    def items(self) -> KeyValueIterator[K, V]:  # type: ignore[override]
        """The ``(key, value)`` pairs in ascending encoded-key order (same as :meth:`all`)."""
        return self.all()

    def setdefault(self, key: K, default: V) -> V:  # type: ignore[override]
        """The value under ``key``; if absent, store ``default`` and return it
        (``default`` is required: ``None`` cannot be stored)."""
        v = self.get(key)
        if v is None:
            self.put(key, default)
            return default
        return v

    @overload
    def pop(self, key: K) -> V: ...
    @overload
    def pop(self, key: K, default: V) -> V: ...
    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value; ``default`` if absent (``KeyError``
        when no default is given)."""
        v = self.get(key)
        if v is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self.delete(key)
        return v

    def popitem(self) -> tuple[K, V]:
        """Remove and return the pair with the **smallest** encoded key (a ``dict``
        pops the last inserted); ``KeyError`` when empty."""
        with self.all() as it:
            pair = next(it, None)
        if pair is None:
            raise KeyError(f"popitem(): store {self.name!r} is empty")
        self.delete(pair[0])
        return pair

    def update(self, other: Any = (), /, **kwargs: V) -> None:  # type: ignore[override]
        """Write every pair of ``other`` (a mapping, an object with ``keys()``, or an
        iterable of pairs) and of ``kwargs`` in one :meth:`put_all` each: a ``None``
        value rejects the whole batch before anything is written."""
        if isinstance(other, Mapping):
            entries: Any = other
        elif hasattr(other, "keys"):
            entries = [(k, other[k]) for k in other.keys()]
        else:
            entries = list(other)
        self.put_all(entries)
        if kwargs:
            self.put_all(kwargs)  # type: ignore[arg-type]

    def clear(self) -> None:
        """Delete every key (in batches of ``delete_all``; each delete is logged)."""
        with self.keys() as keys:
            while chunk := keys.take(_CLEAR_CHUNK):
                self.delete_all(chunk)

    # A store is a handle on a resource (like a file), compared by identity: comparing
    # contents would scan both stores; compare ``dict(store)`` for that.
    __eq__ = object.__eq__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __enter__(self) -> KeyValueStore[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_first = itemgetter(0)
_second = itemgetter(1)


def keys_of(pairs: KeyValueIterator[K, Any]) -> CloseableIterator[K]:
    """The keys of ``pairs`` as a closeable iterator that closes ``pairs`` when closed
    or exhausted. Unlike ``pairs.map``, each key is taken in C (no Python call per pair),
    so ``take(n)`` of it is one C-level pass."""
    if pairs._closed:  # closed or exhausted already: keep its rules (raise / end)
        return CloseableIterator.map(pairs, _first)
    return _KeysOf(pairs)


class _KeysOf(CloseableIterator[Any]):
    """:func:`keys_of`: reads the pair iterator's own source, but still obeys a close of
    the pair iterator by someone else (an engine closing its open iterators at close:
    the native iterator below must not be read after that)."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: KeyValueIterator[Any, Any]) -> None:
        super().__init__(map(_first, pairs._it), on_close=pairs.close, what=pairs._what)
        self._pairs = pairs

    def __next__(self) -> Any:
        if self._pairs._closed:
            self.close()
        return CloseableIterator.__next__(self)

    def take(self, n: int) -> list[Any]:
        if self._pairs._closed:
            self.close()
        return CloseableIterator.take(self, n)


def reject_none(store: str, key: object, value: object) -> None:
    """Raise the standard error for ``put(key, None)``."""
    if value is None:
        raise InvalidValueError(
            f"store {store!r}: put({key!r}, None) is not allowed; use delete({key!r}) to remove a key"
        )
