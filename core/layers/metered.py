"""The ``metered`` layer: counts operations into the store's :class:`StoreMetrics`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..kv import KeyValueIterator, KeyValueStore
from ..metrics import StoreMetrics
from .forwarding import ForwardingStore

__all__ = ["MeteredStore"]


class MeteredStore(ForwardingStore):
    """Counts gets (with hits/misses when no cache below counts them), puts, deletes, scans."""

    def __init__(self, inner: KeyValueStore[Any, Any], metrics: StoreMetrics, count_hits: bool) -> None:
        super().__init__(inner)
        self.metrics = metrics
        self._count_hits = count_hits

    def get(self, key: Any, default: Any = None) -> Any:
        """The value under ``key``, else ``default`` (like ``dict.get``)."""
        v = self.inner.get(key)
        m = self.metrics
        m.gets += 1
        if self._count_hits:
            if v is None:
                m.misses += 1
            else:
                m.hits += 1
        return default if v is None else v

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        keys = keys if isinstance(keys, list) else list(keys)
        out = self.inner.get_all(keys)
        m = self.metrics
        m.gets += len(keys)
        if self._count_hits:
            m.hits += len(out)
            m.misses += len(keys) - len(out)
        return out

    def put(self, key: Any, value: Any) -> None:
        self.inner.put(key, value)
        self.metrics.puts += 1

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        if isinstance(entries, Mapping):
            entries = list(entries.items())
        elif not isinstance(entries, list):
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
