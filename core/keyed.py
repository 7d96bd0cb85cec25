"""Keyed state: value, list, map, reducing and aggregating handles scoped to the current key.

The model is Flink's keyed state (``ValueState``, ``ListState``, ``MapState``,
``ReducingState``, ``AggregatingState``) and Spark's ``transformWithState`` handles: a
task declares a handle once, in ``init``, and every call on it reads or writes the entry
of the key being processed, without repeating ``store[user]``::

    last_seen = context.keyed.value("last_seen", int)   # in init
    ...
    last_seen.update(ts)                                 # in process: this record's key

**One store per handle.** A handle is a key-value store of the task, declared in the config
under the handle's name (``stores.last_seen.factory = rocksdb``, its serdes, changelog and
``ttl.*``) and opened, logged, committed and restored like every other store — the handle
adds no state of its own, so a restore, a crash and ``localstate get`` treat it exactly as
any store. One store per handle rather than all handles in one store, because a store's
TTL, serdes, engine and changelog are per store: each handle gets its own TTL and types
from the layers that already give them, and no handle's scan walks another's entries.

**Layout per kind** (the store's encoded keys, so ``localstate get``/``dump`` show them):

* value, reducing, aggregating: store key = the key; value = the value / the accumulator;
* list: store key = the key; value = the whole list, one value (``msg.serde`` json or msgpack);
* map: store key = ``(key, map_key)`` (``key.serde = tuple``); value = the entry's value.

A map handle reads one key's entries with a prefix scan over ``(key,)``: the ``tuple``
serde is order-preserving and ``(key,)``'s encoding is a byte prefix of every
``(key, map_key)``'s and of no other key's, so the scan never touches another key. That
needs an ordered key-value engine (``memory``, ``rocksdb``, ``leveldb``; a non-key-value
engine such as ``topn`` or ``search`` is refused naming it). A list is kept as one value
under its key (as Flink's RocksDB backend keeps a list in one merged value): reading it is
one ``get`` on any key-value engine, an ``add`` rewrites it (O(length); keep lists short or
use a map handle), and its TTL covers the whole list.

**The current key.** Where the runner knows the key — a :class:`StatefulJob` with its
``key=`` column running the per-record :meth:`StreamTask.process`, and
:meth:`StreamTask.on_timer` (the timer's key) — it sets it before each call. Anywhere else
(a vectorised ``process_batch``, ``window``) set it yourself: ``context.keyed.key = user``,
one attribute store. A handle used with no current key is an error, never a read of some
earlier key.

**TTL** is the store's (``stores.<name>.ttl.ms``; :mod:`localstate.layers.ttl`): per map
entry for a map handle, per key for the other kinds; expired entries are never returned,
by the handle or by a reader of the committed state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .errors import ConfigError, InvalidValueError, LocalStateError
from .kv import KeyValueStore
from .registry import did_you_mean
from .serdes import get_serde
from .typed import check_store_types

if TYPE_CHECKING:
    from .storage import TaskStorage

__all__ = [
    "Aggregate", "AggregatingState", "KeyedState", "ListState", "MapState", "NO_KEY", "NoCurrentKeyError",
    "ReducingState", "ValueState",
]

T = TypeVar("T")
V = TypeVar("V")
MK = TypeVar("MK")
A = TypeVar("A")
R = TypeVar("R")


class _NoKey:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_KEY"


NO_KEY: Any = _NoKey()
"""The current key when there is none (before the first record, in ``window``)."""


_TUPLE_ELEMENT_TYPES = (object, str, int, float, bytes, bool, tuple)
"""What the ``tuple`` serde encodes (``object``: unchecked)."""


class NoCurrentKeyError(LocalStateError):
    """A keyed state handle was used while no key was being processed."""


class KeyedState:
    """``context.keyed``: declares keyed state handles and holds the current key.

    ``key`` is the key every handle reads and writes; the runner sets it where it knows
    it (see the module docs), a task sets it itself elsewhere. ``NO_KEY`` when there is
    none."""

    __slots__ = ("key", "_storage", "_handles", "_reserved")

    def __init__(self, storage: TaskStorage, reserved: Mapping[str, str]) -> None:
        """``reserved``: store names the task already uses otherwise (name → what for); a
        handle over one of them is refused."""
        self.key: Any = NO_KEY
        self._storage = storage
        self._handles: dict[str, _Handle] = {}
        self._reserved = reserved

    @property
    def handles(self) -> list[str]:
        """The names of the declared handles (= their stores)."""
        return list(self._handles)

    # (a default of ``object`` means "unchecked": a type checker then sees ``object``)
    def value(self, name: str, value_type: type[V] = object, *,  # type: ignore[assignment]
              key_type: type = object) -> ValueState[V]:
        """A value per key (Flink's ``ValueState``, Spark's ``ValueState``)."""
        return ValueState(self, self._open(name, "value", key_type, value_type), name, value_type)

    def list(self, name: str, element_type: type[T] = object, *,  # type: ignore[assignment]
             key_type: type = object) -> ListState[T]:
        """A list per key, kept as one value (``msg.serde`` json or msgpack)."""
        return ListState(self, self._open(name, "list", key_type, list), name, element_type)

    def map(self, name: str, map_key_type: type[MK] = object,  # type: ignore[assignment]
            value_type: type[V] = object) -> MapState[MK, V]:  # type: ignore[assignment]
        """A map per key (Flink's ``MapState``), one store entry per map entry under
        ``(key, map_key)`` (``key.serde = tuple``)."""
        if map_key_type not in _TUPLE_ELEMENT_TYPES:
            raise ConfigError(f"keyed map state {name!r}: map keys are elements of the store's tuple keys, so their "
                              f"type must be one of {', '.join(t.__name__ for t in _TUPLE_ELEMENT_TYPES)}; got "
                              f"{getattr(map_key_type, '__name__', map_key_type)!r}")
        store = self._open(name, "map", object, value_type)
        spec = self._storage.config.stores[name]
        if spec.key_serde != "tuple":
            raise ConfigError(
                f"keyed map state {name!r}: its entries are stored under (key, map_key), so the store needs "
                f"stores.{name}.key.serde = tuple (order-preserving, so one key's entries are one prefix scan); "
                f"it has {spec.key_serde!r}"
            )
        return MapState(self, store, name, map_key_type, value_type)

    def reducing(self, name: str, reduce: Callable[[V, V], V],
                 value_type: type[V] = object, *, key_type: type = object) -> ReducingState[V]:  # type: ignore[assignment]
        """A value per key that ``add`` folds new values into with ``reduce(old, new)``
        (Flink's ``ReducingState``)."""
        if not callable(reduce):
            raise TypeError(f"keyed reducing state {name!r}: reduce must be a function (old, new) -> value")
        return ReducingState(self, self._open(name, "reducing", key_type, value_type), name, value_type, reduce)

    def aggregating(self, name: str, aggregate: Aggregate[T, A, R], accumulator_type: type = object, *,
                    key_type: type = object) -> AggregatingState[T, R]:
        """An accumulator per key that ``add`` folds inputs into and ``get`` turns into a
        result (Flink's ``AggregatingState`` with an ``AggregateFunction``)."""
        if not isinstance(aggregate, Aggregate):
            raise TypeError(f"keyed aggregating state {name!r}: give an Aggregate(create, add, result), "
                            f"got {type(aggregate).__name__}")
        store = self._open(name, "aggregating", key_type, accumulator_type)
        return AggregatingState(self, store, name, aggregate)

    def _open(self, name: str, kind: str, key_type: type, value_type: type) -> KeyValueStore[Any, Any]:
        """The store behind a new handle, after every declaration check (nothing is written)."""
        if name in self._handles:
            raise ConfigError(f"keyed state {name!r} is declared twice (first as a {self._handles[name].kind} "
                              "handle): give each handle its own name and store")
        used = self._reserved.get(name)
        if used is not None:
            raise ConfigError(f"keyed {kind} state {name!r}: the store {name!r} is already the task's {used}; "
                              "a handle needs a store of its own: declare stores.<handle>.* under another name")
        stores = self._storage.config.stores
        spec = stores.get(name)
        if spec is None:
            raise ConfigError(
                f"keyed {kind} state {name!r} needs a store of the same name, which the config does not declare: "
                f"add stores.{name}.factory = rocksdb (or memory, leveldb) with its serdes.{did_you_mean(name, stores)}"
            )
        store = self._storage.store(name)
        if not isinstance(store, KeyValueStore):
            raise ConfigError(
                f"keyed {kind} state {name!r}: stores.{name}.factory = {spec.factory!r} is not an ordered key-value "
                "engine, which keyed state is kept in: use memory, rocksdb or leveldb"
            )
        try:
            check_store_types(name, store, get_serde(spec.key_serde), get_serde(spec.msg_serde), key_type, value_type)
        except ConfigError as e:
            raise ConfigError(f"keyed {kind} state {name!r}: {e}") from None
        return store


class _Handle:
    """What every handle shares: its store, its name and the scope holding the current key."""

    kind = "?"
    __slots__ = ("_scope", "_store", "name")

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str) -> None:
        self._scope = scope
        self._store = store
        self.name = name
        scope._handles[name] = self

    def _key(self) -> Any:
        key = self._scope.key
        if key is NO_KEY:
            raise self._no_key()
        return key

    def _no_key(self) -> NoCurrentKeyError:
        return NoCurrentKeyError(
            f"keyed {self.kind} state {self.name!r} used with no current key: the runner sets it only around "
            "StreamTask.process (a StatefulJob with key=) and on_timer; in process_batch or window set "
            "context.keyed.key = <key> first"
        )

    def _checked(self, value: Any, wanted: type, what: str) -> Any:
        if value is None:
            raise InvalidValueError(f"keyed {self.kind} state {self.name!r}: {what} None; use clear() to remove "
                                    "state (nothing was written)")
        if not isinstance(value, wanted):
            raise InvalidValueError(
                f"keyed {self.kind} state {self.name!r}: {what} {wanted.__name__}, got {type(value).__name__} "
                f"{value!r} (nothing was written)"
            )
        return value

    def exists(self) -> bool:
        """Whether the current key has state in this handle."""
        return self._store.get(self._key()) is not None

    def clear(self) -> None:
        """Remove the current key's state (not an error if it has none)."""
        self._store.delete(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, key={self._scope.key!r})"


class ValueState(_Handle, Generic[V]):
    """One value per key. ``get(default)``, ``update(value)``, ``exists()``, ``clear()``."""

    kind = "value"
    __slots__ = ("_get", "_put", "_type")

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str, value_type: type[V]) -> None:
        super().__init__(scope, store, name)
        self._get, self._put, self._type = store.get, store.put, value_type

    @overload
    def get(self) -> V | None: ...
    @overload
    def get(self, default: V) -> V: ...

    def get(self, default: V | None = None) -> V | None:
        """The current key's value, or ``default`` when it has none (or it expired)."""
        key = self._scope.key
        if key is NO_KEY:
            raise self._no_key()
        return self._get(key, default)

    def update(self, value: V) -> None:
        """Set the current key's value; a value not of the declared type is refused first."""
        key = self._scope.key
        if key is NO_KEY:
            raise self._no_key()
        if not isinstance(value, self._type) or value is None:
            self._checked(value, self._type, "values are")
        self._put(key, value)


class ReducingState(ValueState[V]):
    """A value per key folded with ``reduce``: ``add(v)`` stores ``reduce(old, v)`` (``v``
    when there is none), ``get()`` returns it."""

    kind = "reducing"
    __slots__ = ("_reduce",)

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str, value_type: type[V],
                 reduce: Callable[[V, V], V]) -> None:
        super().__init__(scope, store, name, value_type)
        self._reduce = reduce

    def add(self, value: V) -> None:
        key, wanted = self._scope.key, self._type
        if key is NO_KEY:
            raise self._no_key()
        if value is None or not isinstance(value, wanted):  # the checks inline: add runs per record
            self._checked(value, wanted, "values are")
        old = self._get(key)
        if old is not None:
            value = self._reduce(old, value)
            if value is None or not isinstance(value, wanted):
                self._checked(value, wanted, "reduce results are")
        self._put(key, value)


@dataclass(frozen=True)
class Aggregate(Generic[T, A, R]):
    """How an aggregating handle folds inputs: ``create()`` a new accumulator, ``add(acc,
    value)`` a new accumulator with ``value`` in, ``result(acc)`` what ``get()`` returns
    (Flink's ``AggregateFunction`` without ``merge``: a key's state never splits). The
    accumulator is what is stored: the store's ``msg.serde`` must encode it."""

    create: Callable[[], A]
    add: Callable[[A, T], A]
    result: Callable[[A], R] = lambda acc: acc  # type: ignore[assignment,return-value]


class AggregatingState(_Handle, Generic[T, R]):
    """An accumulator per key: ``add(v)``, ``get()`` (the result; ``None`` without state)."""

    kind = "aggregating"
    __slots__ = ("_agg",)

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str,
                 aggregate: Aggregate[T, Any, R]) -> None:
        super().__init__(scope, store, name)
        self._agg = aggregate

    def add(self, value: T) -> None:
        key = self._key()
        store, agg = self._store, self._agg
        acc = store.get(key)
        acc = agg.add(agg.create() if acc is None else acc, value)
        if acc is None:
            raise InvalidValueError(f"keyed aggregating state {self.name!r}: add returned None "
                                    "(return the new accumulator; nothing was written)")
        store.put(key, acc)

    def get(self) -> R | None:
        acc = self._store.get(self._key())
        return None if acc is None else self._agg.result(acc)


class ListState(_Handle, Generic[T]):
    """A list per key: ``get()`` (a new list, ``[]`` without state), ``add(v)``,
    ``add_all(vs)``, ``update(vs)`` (replace; empty clears), ``exists()``, ``clear()``."""

    kind = "list"
    __slots__ = ("_type",)

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str, element_type: type[T]) -> None:
        super().__init__(scope, store, name)
        self._type = element_type

    def get(self) -> list[T]:
        stored = self._store.get(self._key())
        return [] if stored is None else list(stored)  # a copy: the object cache keeps the stored one

    def add(self, value: T) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[T]) -> None:
        key = self._key()
        new = [self._checked(v, self._type, "elements are") for v in values]
        if new:
            stored = self._store.get(key)
            self._store.put(key, new if stored is None else [*stored, *new])

    def update(self, values: Iterable[T]) -> None:
        key = self._key()
        new = [self._checked(v, self._type, "elements are") for v in values]
        if new:
            self._store.put(key, new)
        else:
            self._store.delete(key)


class MapState(_Handle, Generic[MK, V]):
    """A map per key, one store entry per map entry: ``get(mk, default)``, ``put(mk, v)``,
    ``put_all(mapping)``, ``remove(mk)``, ``contains(mk)``, ``items()``/``keys()``/
    ``values()`` (this key's entries in map-key order), ``is_empty()``, ``clear()``."""

    kind = "map"
    __slots__ = ("_mk_type", "_type", "_get", "_put")

    def __init__(self, scope: KeyedState, store: KeyValueStore[Any, Any], name: str, map_key_type: type[MK],
                 value_type: type[V]) -> None:
        super().__init__(scope, store, name)
        self._mk_type, self._type = map_key_type, value_type
        self._get, self._put = store.get, store.put

    def _entry(self, map_key: Any) -> tuple[Any, Any]:
        # (get and put inline this: they run per record)
        key = self._scope.key
        if key is NO_KEY:
            raise self._no_key()
        if map_key is None or not isinstance(map_key, self._mk_type):
            self._checked(map_key, self._mk_type, "map keys are")
        return key, map_key

    @overload
    def get(self, map_key: MK) -> V | None: ...
    @overload
    def get(self, map_key: MK, default: V) -> V: ...

    def get(self, map_key: MK, default: V | None = None) -> V | None:
        """The current key's entry ``map_key``, or ``default``."""
        key = self._scope.key
        if key is NO_KEY or map_key is None or not isinstance(map_key, self._mk_type):
            return self._get(self._entry(map_key), default)  # raises the error
        return self._get((key, map_key), default)

    def contains(self, map_key: MK) -> bool:
        return self._store.get(self._entry(map_key)) is not None

    def put(self, map_key: MK, value: V) -> None:
        key = self._scope.key
        if key is NO_KEY or map_key is None or not isinstance(map_key, self._mk_type):
            key = self._entry(map_key)[0]  # raises the error
        if value is None or not isinstance(value, self._type):
            self._checked(value, self._type, "values are")
        self._put((key, map_key), value)

    def put_all(self, entries: Mapping[MK, V]) -> None:
        key = self._key()
        items = [((key, self._checked(mk, self._mk_type, "map keys are")), self._checked(v, self._type, "values are"))
                 for mk, v in entries.items()]
        self._store.put_all(items)

    def remove(self, map_key: MK) -> None:
        """Remove one entry (not an error if it is absent)."""
        self._store.delete(self._entry(map_key))

    def items(self) -> Iterator[tuple[MK, V]]:
        """This key's entries, in map-key order (the tuple serde's order)."""
        with self._store.prefix((self._key(),)) as it:
            entries = [(k[1], v) for k, v in it]
        return iter(entries)

    def keys(self) -> Iterator[MK]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        with self._store.prefix((self._key(),)) as it:
            return next(iter(it), None) is None

    def exists(self) -> bool:
        return not self.is_empty()

    def clear(self) -> None:
        key = self._key()
        with self._store.prefix((key,)) as it:
            doomed = [k for k, _ in it]
        if doomed:
            self._store.delete_all(doomed)
