"""A store that forwards every call to the store it wraps.

Each layer subclasses it and overrides only its own concern.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..kv import CloseableIterator, KeyValueIterator, KeyValueStore

__all__ = ["ForwardingStore"]


class ForwardingStore(KeyValueStore[Any, Any]):
    """Forwards everything to ``inner``; ``close()`` closes the whole stack."""

    def __init__(self, inner: KeyValueStore[Any, Any], name: str | None = None) -> None:
        self.inner = inner
        self.name = name or getattr(inner, "name", "store")

    def get(self, key: Any, default: Any = None) -> Any:
        v = self.inner.get(key)
        return default if v is None else v

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.inner.get_all(keys)

    def put(self, key: Any, value: Any) -> None:
        self.inner.put(key, value)

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        self.inner.put_all(entries)

    def delete(self, key: Any) -> None:
        self.inner.delete(key)

    def delete_all(self, keys: Iterable[Any]) -> None:
        self.inner.delete_all(keys)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        return self.inner.range(start, stop)

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        return self.inner.prefix(prefix)

    def all(self) -> KeyValueIterator[Any, Any]:
        return self.inner.all()

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        return self.inner.range_keys(start, stop)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.inner)

    def approximate_len(self) -> int:
        return self.inner.approximate_len()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
