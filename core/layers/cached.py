"""The ``cached`` layer: an LRU of deserialized values plus a dirty set.

Writes land in the cache and in ``_dirty`` (an insertion-ordered dict used as an
ordered set: rewriting a key is the dedup). Dirty entries go down in batches of
``write.batch.size``, so counting ``x=1, x=2, x=3`` between two commits writes only
``x=3`` to the engine and the changelog. A scan (``range``/``prefix``/``all``) first
pushes the dirty entries down and then reads the layer below — Samza's approach —
so scans always see the cache's writes, deletes included.

Values are cached as the objects you put: mutating a returned object without a
``put`` changes the cache but not the store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from ..errors import StoreClosedError
from ..kv import KeyValueIterator, KeyValueStore, reject_none
from ..metrics import StoreMetrics
from .forwarding import ForwardingStore

__all__ = ["CachedStore"]


class _Marker(Enum):
    ABSENT = "absent"  # known not to exist (deleted, or looked up and missing)


_ABSENT = _Marker.ABSENT
_MISSING = object()


class CachedStore(ForwardingStore):
    """LRU object cache of ``cache_size`` entries; dirty batches of ``batch_size``."""

    def __init__(
        self,
        inner: KeyValueStore[Any, Any],
        cache_size: int,
        batch_size: int,
        name: str,
        metrics: StoreMetrics | None = None,
        key_check: Callable[[Any], object] | None = None,
    ) -> None:
        """``key_check`` (the key serde's encoder) rejects an unencodable key at ``put``
        time rather than at the next flush, where the error would surface far from its cause."""
        super().__init__(inner, name)
        self._key_check = key_check
        self.cache_size = max(1, cache_size)
        self.batch_size = max(1, min(batch_size, self.cache_size))
        self.metrics = metrics or StoreMetrics()
        # OrderedDict: O(1) popitem(last=False); a plain dict degrades to O(holes) when
        # its front is popped repeatedly (next(iter(d)) skips deleted slots).
        self._cache: OrderedDict[Any, Any] = OrderedDict()
        self._dirty: dict[Any, None] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.name!r} is closed; open the task's TaskStorage again")

    # -- internals -------------------------------------------------------------------------
    def _evict(self) -> None:
        cache = self._cache
        while len(cache) > self.cache_size:
            oldest, value = cache.popitem(last=False)
            if oldest in self._dirty:
                cache[oldest] = value
                cache.move_to_end(oldest, last=False)
                self._flush_dirty()
                cache.popitem(last=False)

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        if not dirty:
            return
        cache = self._cache
        puts = []
        deletes = []
        for k in dirty:
            v = cache[k]
            if v is _ABSENT:
                deletes.append(k)
            else:
                puts.append((k, v))
        self._dirty = {}
        if puts:
            self.inner.put_all(puts)
        if deletes:
            self.inner.delete_all(deletes)

    def _write(self, key: Any, value: Any) -> None:
        if self._closed:
            self._check_open()
        if self._key_check is not None:
            self._key_check(key)
        cache = self._cache
        cache[key] = value
        cache.move_to_end(key)
        dirty = self._dirty
        dirty[key] = None
        if len(dirty) >= self.batch_size:
            self._flush_dirty()
        if len(cache) > self.cache_size:
            self._evict()

    # -- KeyValueStore -----------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        if self._closed:
            self._check_open()
        cache = self._cache
        v = cache.get(key, _MISSING)
        m = self.metrics
        if v is _MISSING:
            m.misses += 1
            v = self.inner.get(key)
            cache[key] = _ABSENT if v is None else v
            if len(cache) > self.cache_size:
                self._evict()
            return v
        m.hits += 1
        cache.move_to_end(key)
        return None if v is _ABSENT else v

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        self._check_open()
        cache = self._cache
        out: dict[Any, Any] = {}
        missing = []
        for k in keys:
            v = cache.get(k, _MISSING)
            if v is _MISSING:
                missing.append(k)
            elif v is not _ABSENT:
                out[k] = v
        self.metrics.hits += len(out)
        if missing:
            self.metrics.misses += len(missing)
            found = self.inner.get_all(missing)
            out.update(found)
            if len(missing) <= self.cache_size:
                for k in missing:
                    cache[k] = found.get(k, _ABSENT)
                if len(cache) > self.cache_size:
                    self._evict()
        return out

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            reject_none(self.name, key, value)
        self._write(key, value)

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        if isinstance(entries, Mapping):
            entries = entries.items()
        write = self._write
        for k, v in entries:
            if v is None:
                reject_none(self.name, k, v)
            write(k, v)

    def delete(self, key: Any) -> None:
        self._write(key, _ABSENT)

    def delete_all(self, keys: Iterable[Any]) -> None:
        write = self._write
        for k in keys:
            write(k, _ABSENT)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        self._check_open()
        self._flush_dirty()
        return self.inner.range(start, stop)

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        self._check_open()
        self._flush_dirty()
        return self.inner.prefix(prefix)

    def all(self) -> KeyValueIterator[Any, Any]:
        self._check_open()
        self._flush_dirty()
        return self.inner.all()

    def flush(self) -> None:
        self._check_open()
        self._flush_dirty()
        self.inner.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_dirty()
        finally:
            self._cache.clear()
            self.inner.close()

    def dirty_count(self) -> int:
        return len(self._dirty)
