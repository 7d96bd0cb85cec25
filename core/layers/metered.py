"""The ``metered`` layer: counts operations into the store's :class:`StoreMetrics`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..kv import CloseableIterator, KeyValueIterator, KeyValueStore
from ..metrics import StoreMetrics
from .forwarding import ForwardingStore

__all__ = ["MeteredStore"]


class MeteredStore(ForwardingStore):
    """Counts gets with their hits and misses, puts, deletes and scans. Built over a
    store without an object cache: with one, the cache is the task-facing layer and
    counts into the same :class:`StoreMetrics` itself (see ``build_store``)."""

    def __init__(self, inner: KeyValueStore[Any, Any], metrics: StoreMetrics) -> None:
        super().__init__(inner)
        self.metrics = metrics

    def get(self, key: Any, default: Any = None) -> Any:
        """The value under ``key``, else ``default`` (like ``dict.get``)."""
        v = self.inner.get(key)
        m = self.metrics
        m.gets_counted += 1
        if v is None:
            m.misses += 1
            return default
        m.hits += 1
        return v

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        keys = keys if isinstance(keys, list) else list(keys)
        out = self.inner.get_all(keys)
        m = self.metrics
        m.gets_counted += len(keys)
        m.hits += len(out)
        m.misses += len(keys) - len(out)
        return out

    def put(self, key: Any, value: Any) -> None:
        self.inner.put(key, value)
        self.metrics.puts += 1

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        # a Mapping goes down as it is: the serialized layer reads its keys and values
        # in two C-level passes, where pairs would need unzipping
        if not isinstance(entries, (list, Mapping)):
            entries = list(entries)
        self.inner.put_all(entries)
        self.metrics.puts += len(entries)

    def delete(self, key: Any) -> None:
        self.inner.delete(key)
        self.metrics.deletes += 1

    def delete_all(self, keys: Iterable[Any]) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        self.inner.delete_all(keys)
        self.metrics.deletes += len(keys)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        self.metrics.range_scans += 1
        return self.inner.range(start, stop)

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        self.metrics.range_scans += 1
        return self.inner.prefix(prefix)

    def all(self) -> KeyValueIterator[Any, Any]:
        self.metrics.range_scans += 1
        return self.inner.all()

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        self.metrics.range_scans += 1
        return self.inner.range_keys(start, stop)
