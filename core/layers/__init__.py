"""Forwarding layers over a key-value engine, built in one function (:func:`build_store`).

The path of a put or a get, top to bottom; each layer calls only the one below it, and
no layer changes another's methods:

    without an object cache:   task → metered → ttl → serialized → logged → engine
    with an object cache:      task → cached → serialized → logged → engine
                                        ├─ counts into the store's metrics (metered)
                                        └─ stamps and checks expiries (ttl: Expiry)

Each layer is there only when asked for (no logger: no logged layer; ...). With an object
cache, the cache is the task-facing layer and is built with its collaborators: the
store's :class:`~localstate.metrics.StoreMetrics` (it counts what the metered layer
would) and, for a ttl store, the store's :class:`~.ttl.Expiry` (it is then an
:class:`~.ttl.ExpiringCachedStore`): so a put or a cache hit is one Python call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..changelogger import ChangeLogger
from ..kv import KeyValueStore
from ..metrics import StoreMetrics
from ..serdes import Serde, checked_serde
from .cached import CachedStore
from .forwarding import ForwardingStore
from .logged import LoggedStore
from .metered import MeteredStore
from .readonly import ReadOnlyStore
from .serialized import SerializedStore
from .ttl import ExpiringCachedStore, Expiry, TtlPolicy, TtlSerializedStore, TtlStore, wall_clock_ns

__all__ = [
    "build_store",
    "maybe_logging",
    "maybe_serializing",
    "maybe_caching",
    "ForwardingStore",
    "LoggedStore",
    "SerializedStore",
    "CachedStore",
    "MeteredStore",
    "ReadOnlyStore",
    "TtlStore",
    "ExpiringCachedStore",
    "Expiry",
    "TtlPolicy",
]


def maybe_logging(store: KeyValueStore[Any, Any], logger: ChangeLogger | None) -> KeyValueStore[Any, Any]:
    return LoggedStore(store, logger) if logger is not None and logger.enabled else store


def maybe_serializing(
    store: KeyValueStore[Any, Any], key_serde: Serde | None, msg_serde: Serde | None, name: str
) -> KeyValueStore[Any, Any]:
    if key_serde is None and msg_serde is None:
        return store
    from ..serdes import get_serde

    bytes_serde = get_serde("bytes")
    return SerializedStore(store, key_serde or bytes_serde, msg_serde or bytes_serde, name)


def maybe_caching(
    store: KeyValueStore[Any, Any],
    cache_size: int,
    batch_size: int,
    name: str,
    metrics: StoreMetrics,
    codec: Any = None,
    *,
    metered: bool = False,
    expiry: Expiry | None = None,
) -> KeyValueStore[Any, Any]:
    """The object cache over ``store`` (none when ``cache_size <= 0``): with ``expiry`` the
    cache of a ttl store; with ``metered`` it counts into ``metrics`` as the metered layer would."""
    if cache_size <= 0:
        return store
    if expiry is not None:
        return ExpiringCachedStore(store, cache_size, batch_size, name, metrics, codec, metered=metered,
                                   expiry=expiry)
    return CachedStore(store, cache_size, batch_size, name, metrics, codec, metered=metered)


def build_store(
    engine: KeyValueStore[bytes, bytes],
    *,
    name: str,
    logger: ChangeLogger | None = None,
    key_serde: Serde | None = None,
    msg_serde: Serde | None = None,
    cache_size: int = 0,
    batch_size: int = 500,
    metrics: StoreMetrics | None = None,
    metered: bool = True,
    ttl: TtlPolicy | None = None,
    clock: Callable[[], int | None] = wall_clock_ns,
) -> KeyValueStore[Any, Any]:
    """The store a task sees, as drawn in this module's docstring: ``metered(ttl(serialized(logged(engine))))``
    without an object cache, ``cached(serialized(logged(engine)))`` with one.

    Each layer is present only when asked for: no logger → no logging layer, no serdes
    → bytes in and out, ``cache_size == 0`` → no cache, ``metered=False`` → no counters,
    no ``ttl`` → no expiry (with one, the serialized layer is a :class:`TtlSerializedStore`
    storing :func:`~.ttl.ttl_serde` pairs, so the expiry is stored and logged with the
    value, and ``clock`` gives "now" in ns).
    """
    metrics = metrics or StoreMetrics()
    engine.name = name
    key_serde = checked_serde(key_serde) if key_serde is not None else None
    msg_serde = checked_serde(msg_serde) if msg_serde is not None else None
    logged = maybe_logging(engine, logger)
    serialized: KeyValueStore[Any, Any]
    expiry: Expiry | None = None
    if ttl is not None:
        from ..serdes import get_serde

        value_serde = msg_serde or get_serde("bytes")
        expiry = Expiry(ttl, clock, name, value_serde)
        serialized = TtlSerializedStore(logged, key_serde or get_serde("bytes"), value_serde, name)
    else:
        serialized = maybe_serializing(logged, key_serde, msg_serde, name)
    if cache_size > 0:
        codec = serialized if isinstance(serialized, SerializedStore) else None
        return maybe_caching(serialized, cache_size, batch_size, name, metrics, codec, metered=metered,
                             expiry=expiry)
    store = serialized if expiry is None else TtlStore(serialized, expiry)
    return MeteredStore(store, metrics) if metered else store
