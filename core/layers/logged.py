"""The ``logged`` layer: every put/delete reaching the engine goes to the ChangeLogger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..changelogger import ChangeLogger
from ..kv import KeyValueStore
from .forwarding import ForwardingStore

__all__ = ["LoggedStore"]


class LoggedStore(ForwardingStore):
    """Writes to the engine, then reports the same change records to the logger."""

    def __init__(self, inner: KeyValueStore[bytes, bytes], logger: ChangeLogger) -> None:
        super().__init__(inner)
        self.logger = logger

    def put(self, key: bytes, value: bytes) -> None:
        self.inner.put(key, value)
        self.logger.log(key, value)

    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        if not isinstance(entries, (list, Mapping)):
            entries = list(entries)  # read twice: by the engine, then by the logger
        self.inner.put_all(entries)
        self.logger.log_all(entries)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)
        self.logger.log(key, None)

    def delete_all(self, keys: Iterable[bytes]) -> None:
        keys = keys if isinstance(keys, list) else list(keys)  # read twice: by the engine, then by the logger
        self.inner.delete_all(keys)
        self.logger.log_deletes(keys)
