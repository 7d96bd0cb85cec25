"""Forwarding layers over a key-value engine, built in one function.

    engine (bytes) → logged (changelog) → serialized (serdes) → cached (objects) → metered → task
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
from .ttl import TtlPolicy, TtlSerializedStore, TtlStore, wall_clock_ns

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
) -> KeyValueStore[Any, Any]:
    if cache_size <= 0:
        return store
    return CachedStore(store, cache_size, batch_size, name, metrics, codec)


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
    """The store a task sees: ``metered(ttl(cached(serialized(logged(engine)))))``.

    Each layer is present only when asked for: no logger → no logging layer, no serdes
    → bytes in and out, ``cache_size == 0`` → no cache, ``metered=False`` → no counters,
    no ``ttl`` → no expiry (with one, the serialized layer is a :class:`TtlSerializedStore`
    storing :func:`~.ttl.ttl_serde` pairs, so the expiry is stored and logged with the
    value, and ``clock`` gives "now" in ns).
    """
    metrics = metrics or StoreMetrics()
    engine.name = name
    key_serde = checked_serde(key_serde) if key_serde is not None else None
    msg_serde = value_serde = checked_serde(msg_serde) if msg_serde is not None else None
    serialized: KeyValueStore[Any, Any]
    if ttl is not None:
        from ..serdes import get_serde

        value_serde = msg_serde or get_serde("bytes")
        serialized = TtlSerializedStore(maybe_logging(engine, logger), key_serde or get_serde("bytes"),
                                        value_serde, name)
    else:
        serialized = maybe_serializing(maybe_logging(engine, logger), key_serde, msg_serde, name)
    codec = serialized if isinstance(serialized, SerializedStore) else None
    store = maybe_caching(serialized, cache_size, batch_size, name, metrics, codec)
    if ttl is not None:
        # over an object cache, the ttl layer fuses its per-record paths into the cache's,
        # which checks each value with the value's own serde (not the (expiry, value) pair)
        store = TtlStore(store, ttl, clock, name, value_serde if cache_size > 0 else None)
    return MeteredStore(store, metrics, count_hits=cache_size <= 0) if metered else store
