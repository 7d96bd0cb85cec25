"""The ``serialized`` layer: objects above, bytes below (the only layer that changes types)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import SerializationError
from ..kv import KeyValueIterator, KeyValueStore, reject_none
from ..serdes import Serde, describe_encode_error
from .forwarding import ForwardingStore

__all__ = ["SerializedStore"]

log = logging.getLogger("localstate")


class SerializedStore(ForwardingStore):
    """Encodes keys with ``key_serde`` and values with ``msg_serde``."""

    def __init__(self, inner: KeyValueStore[bytes, bytes], key_serde: Serde, msg_serde: Serde, name: str) -> None:
        super().__init__(inner, name)
        self.key_serde = key_serde
        self.msg_serde = msg_serde
        self._warned_unordered = False

    # -- encoding helpers ----------------------------------------------------------------
    def encode_key(self, key: Any) -> bytes:
        """The encoded key, or a SerializationError naming the store and the fix."""
        return self._ek(key)

    def _ek(self, key: Any) -> bytes:
        try:
            return self.key_serde.encode(key)
        except SerializationError:
            raise
        except Exception as e:
            raise describe_encode_error(self.name, "key", self.key_serde, key, e) from e

    def _ev(self, value: Any) -> bytes:
        try:
            return self.msg_serde.encode(value)
        except Exception as e:
            raise describe_encode_error(self.name, "value", self.msg_serde, value, e) from e

    def _dv(self, data: bytes) -> Any:
        try:
            return self.msg_serde.decode(data)
        except Exception as e:
            raise SerializationError(
                f"store {self.name!r}: stored value {data[:40]!r} cannot be decoded by serde "
                f"{self.msg_serde.name!r}: {e}. Was the store written with another msg.serde?"
            ) from e

    def _dk(self, data: bytes) -> Any:
        try:
            return self.key_serde.decode(data)
        except Exception as e:
            raise SerializationError(
                f"store {self.name!r}: stored key {data[:40]!r} cannot be decoded by serde "
                f"{self.key_serde.name!r}: {e}. Was the store written with another key.serde?"
            ) from e

    def _decode_pair(self, kv: tuple[bytes, bytes]) -> tuple[Any, Any]:
        return self._dk(kv[0]), self._dv(kv[1])

    # -- KeyValueStore -------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        data = self.inner.get(self._ek(key))
        return None if data is None else self._dv(data)

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        keys = list(keys)
        ek = self._ek
        encoded = [ek(k) for k in keys]
        found = self.inner.get_all(encoded)
        if not found:
            return {}
        dv = self._dv
        return {k: dv(found[e]) for k, e in zip(keys, encoded) if e in found}

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            reject_none(self.name, key, value)
        self.inner.put(self._ek(key), self._ev(value))

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        if isinstance(entries, Mapping):
            entries = list(entries.items())
        elif not isinstance(entries, list):
            entries = list(entries)
        ke, ve = self.key_serde.encode, self.msg_serde.encode
        try:
            encoded = [(ke(k), ve(v)) for k, v in entries]
        except Exception:
            encoded = []
            for k, v in entries:
                if v is None:
                    reject_none(self.name, k, v)
                encoded.append((self._ek(k), self._ev(v)))
        self.inner.put_all(encoded)

    def delete(self, key: Any) -> None:
        self.inner.delete(self._ek(key))

    def delete_all(self, keys: Iterable[Any]) -> None:
        ek = self._ek
        self.inner.delete_all([ek(k) for k in keys])

    def _check_ordered(self) -> None:
        if not self.key_serde.order_preserving and not self._warned_unordered:
            self._warned_unordered = True
            log.warning(
                "store %r: range/prefix over key serde %r, which is not order-preserving: results "
                "follow the encoded byte order, not the key order. Use an order-preserving key serde "
                "(string, int, long, tuple, bytes) for range queries.",
                self.name,
                self.key_serde.name,
            )

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        self._check_ordered()
        s = None if start is None else self._ek(start)
        e = None if stop is None else self._ek(stop)
        return self.inner.range(s, e).map(self._decode_pair)

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        self._check_ordered()
        return self.inner.prefix(self._ek(prefix)).map(self._decode_pair)

    def all(self) -> KeyValueIterator[Any, Any]:
        return self.inner.all().map(self._decode_pair)
