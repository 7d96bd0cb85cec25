"""The ``serialized`` layer: objects above, bytes below (the only layer that changes types)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, compress, repeat, takewhile
from operator import is_, is_not, itemgetter, ne
from typing import Any

from ..errors import InvalidValueError, SerializationError
from ..kv import CloseableIterator, KeyValueIterator, KeyValueStore, reject_none
from ..serdes import (
    Serde,
    all_of_type,
    decoder_of_many,
    describe_encode_error,
    encoder_of_many,
    get_serde,
)
from .forwarding import ForwardingStore

__all__ = ["SerializedStore"]

log = logging.getLogger("localstate")
_BYTES_SERDE = get_serde("bytes")


def _scan_chunk_sizes() -> Iterator[int]:
    """Pairs a scan decodes per step: few first (a probe takes one pair), then many."""
    return chain((16, 256), repeat(4096))


class SerializedStore(ForwardingStore):
    """Encodes keys with ``key_serde`` and values with ``msg_serde``.

    Bulk methods make one ``encode_many``/``decode_many`` pass per list (see
    :class:`~localstate.serdes.Serde`) and fall back to the per-item encoders only to
    name the offending key or value in the error.
    """

    def __init__(self, inner: KeyValueStore[bytes, bytes], key_serde: Serde, msg_serde: Serde, name: str) -> None:
        super().__init__(inner, name)
        self.key_serde = key_serde
        self.msg_serde = msg_serde
        self._encode_keys = encoder_of_many(key_serde)
        self._encode_values = encoder_of_many(msg_serde)
        self._decode_values = decoder_of_many(msg_serde)
        self._decode_keys = decoder_of_many(key_serde)
        self._warned_unordered = False
        # bytes in, bytes out: scans hand the engine's pairs up undecoded (no call per pair)
        self._decodes = not (key_serde.name == msg_serde.name == "bytes")
        self._bytes_only = key_serde is _BYTES_SERDE and msg_serde is _BYTES_SERDE

    def passthrough_get(self) -> Any:
        """The ``get`` of the layer below when both serdes are the built-in ``bytes`` serde
        (a bytes key and the stored bytes pass this layer unchanged), else None: the
        cached layer's read miss of a bytes key then costs no call through this layer."""
        return self.inner.get if self._bytes_only else None

    # -- encoding helpers ----------------------------------------------------------------
    def encode_key(self, key: Any) -> bytes:
        """The encoded key, or a SerializationError naming the store and the fix.
        ``None`` is never a key, whatever the serde (json would store ``b"null"``)."""
        if key is None:
            raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
        try:
            return self.key_serde.encode(key)
        except SerializationError:
            raise
        except Exception as e:
            raise describe_encode_error(self.name, "key", self.key_serde, key, e) from e


    def put_encoded(self, entries: dict[bytes, bytes]) -> None:
        """Write already encoded pairs to the layer below (the cached layer's flush)."""
        self.inner.put_all(entries)

    def delete_encoded(self, keys: list[bytes]) -> None:
        """Delete already encoded keys in the layer below (the cached layer's flush)."""
        self.inner.delete_all(keys)

    def encode_values(self, values: list[Any]) -> list[bytes]:
        """Every value encoded in one pass; the error names the first bad value."""
        return self._encode_value_list(values)

    def encode_value(self, value: Any) -> bytes:
        """The encoded value, or a SerializationError naming the store and the fix."""
        try:
            return self.msg_serde.encode(value)
        except Exception as e:
            raise describe_encode_error(self.name, "value", self.msg_serde, value, e) from e

    def decode_value(self, data: bytes) -> Any:
        """The stored value decoded; a SerializationError names the serde that failed."""
        try:
            return self.msg_serde.decode(data)
        except Exception as e:
            raise SerializationError(
                f"store {self.name!r}: stored value {data[:40]!r} cannot be decoded by serde "
                f"{self.msg_serde.name!r}: {e}. Was the store written with another msg.serde?"
            ) from e

    def decode_key(self, data: bytes) -> Any:
        """The stored key decoded; a SerializationError names the serde that failed."""
        try:
            return self.key_serde.decode(data)
        except Exception as e:
            raise SerializationError(
                f"store {self.name!r}: stored key {data[:40]!r} cannot be decoded by serde "
                f"{self.key_serde.name!r}: {e}. Was the store written with another key.serde?"
            ) from e

    def _decoded(self, pairs: KeyValueIterator[bytes, bytes]) -> KeyValueIterator[Any, Any]:
        """The decoded pairs of a scan, decoded a chunk at a time (one ``decode_many``
        pass per chunk for the keys and one for the values, no Python call per pair).

        Chunks start small and grow (:func:`_scan_chunk_sizes`), so a probe that takes one
        pair decodes a handful, not thousands; the engine's scan reads from its snapshot,
        so reading ahead within a chunk sees nothing a pair-by-pair scan would not."""
        if not self._decodes:
            return pairs
        chunks = map(pairs.take, _scan_chunk_sizes())
        decoded = chain.from_iterable(map(self._decode_chunk, takewhile(len, chunks)))
        return KeyValueIterator(decoded, on_close=pairs.close, what=f"store {self.name!r} iterator")

    def _decode_chunk(self, chunk: list[tuple[bytes, bytes]]) -> Iterator[tuple[Any, Any]]:
        try:
            keys = self._decode_keys(list(map(itemgetter(0), chunk)))
            values = self._decode_values(list(map(itemgetter(1), chunk)))
        except Exception:
            # pair by pair: the pairs before a bad one are handed out, and the error
            # (naming the store and the bytes) comes where a pair-by-pair scan raised it
            return map(self._decode_pair, chunk)
        return zip(keys, values)

    def _decode_pair(self, kv: tuple[bytes, bytes]) -> tuple[Any, Any]:
        return self.decode_key(kv[0]), self.decode_value(kv[1])

    def encode_keys(self, keys: list[Any]) -> list[bytes]:
        """Every key encoded in one pass; the error names the first bad key."""
        if any(map(is_, keys, repeat(None))):
            raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
        try:
            return self._encode_keys(keys)
        except SerializationError:
            raise
        except Exception:
            return list(map(self.encode_key, keys))

    def _encode_value_list(self, values: list[Any]) -> list[bytes]:
        try:
            return self._encode_values(values)
        except Exception:
            return list(map(self.encode_value, values))

    def _decode_value_list(self, data: list[bytes]) -> list[Any]:
        try:
            return self._decode_values(data)
        except Exception:
            return list(map(self.decode_value, data))

    # -- KeyValueStore -------------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        try:
            if key is None:
                raise TypeError("None")
            encoded = self.key_serde.encode(key)
        except Exception:
            encoded = self.encode_key(key)
        data = self.inner.get(encoded)
        if data is None:
            return default
        try:
            return self.msg_serde.decode(data)
        except Exception:
            return self.decode_value(data)

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        keys = keys if isinstance(keys, list) else list(keys)
        encoded = self.encode_keys(keys)
        found = self.inner.get_all(encoded)
        if not found:
            return {}
        if len(found) < len(encoded):
            # keep the keys whose encoding was found; no per-key Python code
            raw = list(map(found.get, encoded))
            present = list(map(is_not, raw, repeat(None)))
            keys = list(compress(keys, present))
            values = list(compress(raw, present))
        else:  # every key found (or duplicates): look each one up
            values = list(map(found.__getitem__, encoded))
        return dict(zip(keys, self._decode_value_list(values)))

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            reject_none(self.name, key, value)
        try:
            if key is None:
                raise TypeError("None")
            encoded = self.key_serde.encode(key), self.msg_serde.encode(value)
        except Exception:
            ek = self.encode_key(key)
            try:
                encoded = ek, self.encode_value(value)
            except SerializationError as e:
                raise SerializationError(f"{e} (put of key {key!r})") from e
        self.inner.put(*encoded)

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        if (self._bytes_only and type(entries) is dict and all_of_type(entries, bytes)
                and all_of_type(entries.values(), bytes)):
            if entries:
                self.inner.put_all(entries)  # bytes in, bytes out (the timers' batches): nothing to encode
            return
        if isinstance(entries, Mapping):
            keys, values = list(entries), list(entries.values())
        else:
            entries = entries if isinstance(entries, list) else list(entries)
            if not entries:
                return
            self._check_pairs(entries)
            # two C-level passes; ``zip(*entries)`` would build one call argument per pair
            keys, values = list(map(itemgetter(0), entries)), list(map(itemgetter(1), entries))
        if any(map(is_, values, repeat(None))):
            k = keys[list(map(is_, values, repeat(None))).index(True)]
            reject_none(self.name, k, None)
        if not keys:
            return
        # a dict, not a list of pairs: no tuple per record (and later pairs for one key win)
        self.inner.put_all(dict(zip(self.encode_keys(keys), self._encode_value_list(values))))

    def _check_pairs(self, entries: list[Any]) -> None:
        """Refuse a put_all entry that is not a ``(key, value)`` pair, naming it."""
        try:
            if not any(map(ne, map(len, entries), repeat(2))):
                return
        except TypeError:
            pass  # an entry without a length
        bad = next(e for e in entries if not isinstance(e, (tuple, list)) or len(e) != 2)
        raise InvalidValueError(
            f"store {self.name!r}: put_all takes a mapping or (key, value) pairs; got the entry {bad!r}"
        )

    def delete(self, key: Any) -> None:
        self.inner.delete(self.encode_key(key))

    def delete_all(self, keys: Iterable[Any]) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        if self._bytes_only and all_of_type(keys, bytes):
            self.inner.delete_all(keys)  # bytes keys of a bytes store (the timers' fired chunks): as they are
            return
        self.inner.delete_all(self.encode_keys(keys))

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
        s = None if start is None else self.encode_key(start)
        e = None if stop is None else self.encode_key(stop)
        return self._decoded(self.inner.range(s, e))

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        self._check_ordered()
        return self._decoded(self.inner.prefix(self.encode_key(prefix)))

    def all(self) -> KeyValueIterator[Any, Any]:
        return self._decoded(self.inner.all())

    # -- keys-only scans (the timers' firing path): no value is read or decoded ------------------
    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        if start is None and stop is None:  # all keys: as all(), no order warning
            keys = self.inner.range_keys(None, None)
        else:
            self._check_ordered()
            keys = self.inner.range_keys(None if start is None else self.encode_key(start),
                                         None if stop is None else self.encode_key(stop))
        if self.key_serde is _BYTES_SERDE:
            return keys  # bytes keys pass this layer unchanged
        chunks = takewhile(len, map(keys.take, _scan_chunk_sizes()))
        decoded = chain.from_iterable(map(self._decode_key_chunk, chunks))
        return CloseableIterator(decoded, on_close=keys.close, what=f"store {self.name!r} iterator")

    def _decode_key_chunk(self, chunk: list[bytes]) -> Iterable[Any]:
        try:
            return self._decode_keys(chunk)
        except Exception:
            # key by key: the keys before a bad one are handed out, then the error naming it
            return map(self.decode_key, chunk)
