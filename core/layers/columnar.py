"""Columnar bulk access to a key-value store: Arrow columns above, the store's bytes below.

A task that holds its keys and values as Arrow columns (a grouped record batch) would
otherwise build a Python tuple per key for the serialized layer to encode, encode each
key again to write it after reading it, and decode every scanned key into a tuple only
to put it back into a column. :class:`ColumnarStore` sits beside the serialized layer,
over the same logged engine, with the same serdes and the same metrics:

* :meth:`~ColumnarStore.encode_keys` encodes key columns once
  (:mod:`localstate.serdes_columns`, byte-identical to the row serde) into
  :class:`EncodedKeys`, which :meth:`~ColumnarStore.get_all`,
  :meth:`~ColumnarStore.put_all` and :meth:`~ColumnarStore.delete_all` take as they
  are: a read-modify-write encodes its keys once, not twice;
* :meth:`~ColumnarStore.range` hands out chunks of columns together with their encoded
  keys, so closed windows can be deleted without encoding them again.

Writes go through the ``logged`` layer like the row API's, so the changelog and the
commit protocol see no difference. Only :class:`EncodedKeys` made by this store are
accepted: keys are always the store's own serde's bytes (two keys are the same key
exactly when their encodings are equal). Without an object cache and without TTL only
(:meth:`localstate.TaskStorage.columns` refuses the others): a cache would hold values
this path neither sees nor updates, and a TTL store stores an expiry with each value.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat, takewhile
from operator import itemgetter
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import InvalidValueError, SerializationError
from ..kv import CloseableIterator, KeyValueStore
from ..metrics import StoreMetrics
from ..serdes import Serde
from ..serdes_columns import Columns, column_decoder, column_encoder
from .serialized import SerializedStore

__all__ = ["ColumnarStore", "EncodedKeys", "ColumnChunk"]

SCAN_CHUNK_ROWS = 65_536
"""Pairs per chunk of :meth:`ColumnarStore.range` unless asked otherwise."""


class EncodedKeys:
    """Keys encoded by one :class:`ColumnarStore`'s key serde, in the order of the columns
    they came from. ``data`` is the list of encoded keys (read-only by convention)."""

    __slots__ = ("data", "_store")

    def __init__(self, data: list[bytes], store: ColumnarStore) -> None:
        self.data = data
        self._store = store

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"EncodedKeys({len(self.data)} keys of store {self._store.name!r})"

    def take(self, indices: list[int]) -> EncodedKeys:
        """The keys at ``indices``, in that order, of the same store."""
        data = self.data
        return EncodedKeys([data[i] for i in indices], self._store)


class ColumnChunk(NamedTuple):
    """One chunk of a columnar scan: the pairs' encoded keys, their key columns and value columns."""

    keys: EncodedKeys
    key_columns: Columns
    value_columns: Columns


class ColumnarStore:
    """Arrow-columnar ``get_all`` / ``put_all`` / ``delete_all`` / ``range`` over the
    bytes store ``inner`` (the logged engine), counted into ``metrics`` as the metered
    layer counts the row API. Columns are lists of ``pa.Array`` (one per ``tuple``
    position, else one); see :mod:`localstate.serdes_columns`."""

    def __init__(self, inner: KeyValueStore[bytes, bytes], key_serde: Serde, msg_serde: Serde, name: str,
                 metrics: StoreMetrics) -> None:
        self.inner = inner
        self.name = name
        self.key_serde = key_serde
        self.msg_serde = msg_serde
        self.metrics = metrics
        self._encode_key_columns = column_encoder(key_serde)
        self._encode_value_columns = column_encoder(msg_serde)
        self._decode_key_columns = column_decoder(key_serde)
        self._decode_value_columns = column_decoder(msg_serde)
        # the row layer over the same bytes: a scan bound is one key, encoded as the row API does
        self._rows = SerializedStore(inner, key_serde, msg_serde, name)

    def encode_keys(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> EncodedKeys:
        """The keys of the rows of ``columns`` (one per ``tuple`` position, else one),
        encoded once; what the key serde cannot encode is a SerializationError naming it."""
        if self.key_serde.name != "tuple" and any(c.null_count for c in columns):
            raise InvalidValueError(f"store {self.name!r}: a null key; None is not a valid key")
        return EncodedKeys(self._encoded(columns, "key", self.key_serde, self._encode_key_columns), self)

    def get_all(self, keys: EncodedKeys) -> Columns:
        """The value columns of ``keys``, row for row, null where a key is absent. (With
        the ``tuple`` msg serde the found tuples give the number of columns: none when no
        key was found.)"""
        data = self._own(keys).data
        found = self.inner.get_all(data)
        m = self.metrics
        m.gets_counted += len(data)
        m.hits += len(found)
        m.misses += len(data) - len(found)
        return self._decode_value_columns(list(map(found.get, data)))

    def put_all(self, keys: EncodedKeys, values: Sequence[pa.Array | pa.ChunkedArray]) -> None:
        """Write row ``i`` of the value columns under ``keys.data[i]`` (a later row of one
        key wins). A null value is refused (delete the key instead), nothing written."""
        data = self._own(keys).data
        lengths = {len(c) for c in values}
        if lengths != {len(data)}:
            raise InvalidValueError(f"store {self.name!r}: put_all of {len(data)} keys got value columns of "
                                    f"lengths {sorted(lengths)}")
        nulls = [i for i, c in enumerate(values) if c.null_count]
        if nulls and self.msg_serde.name != "tuple":
            raise InvalidValueError(f"store {self.name!r}: a null value in column {nulls[0]}; None is not a "
                                    "value (delete the key instead)")
        encoded = self._encoded(values, "value", self.msg_serde, self._encode_value_columns)
        if data:
            self.inner.put_all(dict(zip(data, encoded)))
            self.metrics.puts += len(data)

    def delete_all(self, keys: EncodedKeys) -> None:
        """Delete ``keys`` (absent keys are not an error)."""
        data = self._own(keys).data
        if data:
            self.inner.delete_all(data)
            self.metrics.deletes += len(data)

    def range(self, start: Any, stop: Any, chunk_rows: int = SCAN_CHUNK_ROWS) -> CloseableIterator[ColumnChunk]:
        """The pairs with ``start <= key < stop`` (on encoded bytes; a bound of None is
        open) as :class:`ColumnChunk` of up to ``chunk_rows`` pairs, in key order. Like
        the row ``range`` it reads one snapshot and must be closed (a ``with`` block)."""
        if type(chunk_rows) is not int or chunk_rows < 1:
            raise InvalidValueError(f"store {self.name!r}: chunk_rows must be an int >= 1, got {chunk_rows!r}")
        self._rows._check_ordered()  # the row range's warning over a key serde that is not order-preserving
        s = None if start is None else self._rows.encode_key(start)
        e = None if stop is None else self._rows.encode_key(stop)
        pairs = self.inner.range(s, e)
        self.metrics.range_scans += 1
        chunks = takewhile(len, map(pairs.take, repeat(chunk_rows)))
        return CloseableIterator(map(self._chunk, chunks), on_close=pairs.close,
                                 what=f"store {self.name!r} columnar iterator")

    # -- helpers ------------------------------------------------------------------------------
    def _chunk(self, pairs: list[tuple[bytes, bytes]]) -> ColumnChunk:
        keys = list(map(itemgetter(0), pairs))
        values = list(map(itemgetter(1), pairs))
        return ColumnChunk(EncodedKeys(keys, self), self._decoded(keys, "key", self._decode_key_columns),
                           self._decoded(values, "value", self._decode_value_columns))

    def _decoded(self, data: list[bytes], what: str, decode: Any) -> Columns:
        try:
            return decode(data)
        except Exception as e:
            serde = self.key_serde if what == "key" else self.msg_serde
            raise SerializationError(
                f"store {self.name!r}: a stored {what} cannot be decoded by serde {serde.name!r}: {e}. "
                f"Was the store written with another {'key' if what == 'key' else 'msg'}.serde?"
            ) from e

    def _encoded(self, columns: Sequence[pa.Array | pa.ChunkedArray], what: str, serde: Serde,
                 encode: Any) -> list[bytes]:
        try:
            return encode(list(columns))
        except Exception as e:
            types = [str(getattr(c, "type", type(c).__name__)) for c in columns]
            raise SerializationError(
                f"store {self.name!r}: the {what} serde {serde.name!r} cannot encode the {what} columns "
                f"({', '.join(types)}): {type(e).__name__}: {e}. Convert the {what}s first or set "
                f"stores.{self.name}.{'key' if what == 'key' else 'msg'}.serde to a serde for this type."
            ) from e

    def _own(self, keys: EncodedKeys) -> EncodedKeys:
        if not isinstance(keys, EncodedKeys) or keys._store is not self:
            raise InvalidValueError(
                f"store {self.name!r}: expected EncodedKeys from this store's encode_keys() or range(), got "
                f"{keys!r}"
            )
        return keys

