"""The ``cached`` layer: an LRU of deserialized values plus a dirty set.

Writes land in the cache and in ``_dirty`` (an insertion-ordered dict used as an
ordered set: rewriting a key is the dedup). Dirty entries go down in batches of
``write.batch.size``, so counting ``x=1, x=2, x=3`` between two commits writes only
``x=3`` to the engine and the changelog. A scan (``range``/``prefix``/``all``) first
pushes the dirty entries down and then reads the layer below — Samza's approach —
so scans always see the cache's writes, deletes included.

``put_all``/``delete_all`` of at least ``write.batch.size`` distinct keys skip the
dirty set: the batch (deduplicated, later pairs win) goes down right away together
with whatever was dirty, in chunks of ``write.batch.size``; each chunk costs one serde
pass, one engine batch and one hand-over to the change logger rather than a chain of
calls per key. Smaller batches join the dirty set like single writes.

Values are cached as the objects you put: mutating a returned object without a
``put`` changes the cache but not the store.

**Key identity** (which Python keys are one key, a serde concern) is
:class:`~.keys.KeyIdentity`'s: keys equal in Python but encoded differently stay apart.

**Validation at the call.** A key or value its serde cannot encode (``None`` keys
included) is rejected by the ``put``/``put_all``/``delete`` that passed it, naming
the store and the key, before it enters the cache — never at a later, unrelated
write, commit or close.

**Encoded once.** The bytes that validation produced are kept with the dirty entry and
are the bytes that go down (below the serialized layer) at the flush, so a value is
encoded exactly once per put and a serde with a cost or a side effect runs once. The
stored value is therefore the value as it was at its ``put``, as in Kafka Streams'
cache of serialized bytes. In a ttl store's cache the kept bytes are the pair's: the
packed expiry followed by the value's bytes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from itertools import compress, islice, repeat
from operator import is_, is_not, itemgetter
from typing import TYPE_CHECKING, Any

from ..errors import SerializationError, StoreClosedError
from ..kv import CloseableIterator, KeyValueIterator, KeyValueStore, reject_none
from ..metrics import StoreMetrics
from .forwarding import ForwardingStore
from .keys import Encoded, KeyIdentity, all_simple, plain

if TYPE_CHECKING:
    from .ttl import Expiry

__all__ = ["CachedStore"]


class _Marker(Enum):
    ABSENT = "absent"  # known not to exist (deleted, or looked up and missing)


_ABSENT = _Marker.ABSENT
_MISSING = object()
def _exact_type(serde: Any) -> type | None:
    """The type every object of which ``serde`` encodes as it is (so needs no check)."""
    from ..serdes import get_serde

    return bytes if serde is get_serde("bytes") else None


class CachedStore(ForwardingStore):
    """LRU object cache of ``cache_size`` entries; dirty batches of ``batch_size``."""

    def __init__(
        self,
        inner: KeyValueStore[Any, Any],
        cache_size: int,
        batch_size: int,
        name: str,
        metrics: StoreMetrics | None = None,
        codec: Any = None,
        *,
        metered: bool = False,
        expiry: Expiry | None = None,
    ) -> None:
        """``codec`` (the serialized layer below: ``encode_key``, ``decode_key``,
        ``encode_values``) validates keys and values at the call that passes them and
        gives each key its identity (see the module docstring).

        ``metrics``: the store's counters. Reads always count a hit or a miss there; with
        ``metered`` this layer is the task-facing one and also counts puts, deletes and
        scans (so no metered layer sits above it: one Python call per record).

        ``expiry``: the ttl rules (:class:`~.ttl.Expiry`) when this cache is a ttl
        store's (:class:`~.ttl.ExpiringCachedStore`): its entries are ``(expiry, value)``
        pairs, :meth:`put` takes a plain value, checks it with the value's own serde and
        caches it with its expiry stamped (``expiry.stamp()``), and :meth:`get` gives the
        value of a live pair and hands the key of an expired one to
        ``expiry.note_expired``: the ttl stamp and check fused into the per-record path."""
        super().__init__(inner, name)
        self._codec = codec
        self._keys = KeyIdentity(codec, name)
        self._values_check: Callable[[list[Any]], object] | None = (
            codec.encode_values if codec is not None else None
        )
        value_serde = expiry.value_serde if expiry is not None else (codec.msg_serde if codec is not None else None)
        # the serdes' own single-item encoders: the fast path of put's validation
        self._key_encode: Callable[[Any], bytes] | None = codec.key_serde.encode if codec is not None else None
        self._value_encode: Callable[[Any], bytes] | None = value_serde.encode if value_serde is not None else None
        # a value (key) of this exact type is valid without calling its encoder: the
        # built-in bytes serde stores every bytes object as it is
        self._value_exact: type | None = _exact_type(value_serde) if value_serde is not None else None
        self._key_exact: type | None = _exact_type(codec.key_serde) if codec is not None else None
        passthrough = codec.passthrough_get() if codec is not None else None
        self._miss_get: Callable[[Any], Any] = passthrough or inner.get
        """How a read miss of a ``_key_exact`` key reads the layer below."""
        self.cache_size = max(1, cache_size)
        self.batch_size = max(1, min(batch_size, self.cache_size))
        self.metrics = metrics or StoreMetrics()
        self._metered = metered
        if metered:
            # every point read counts here as a hit or a miss, which is the read count
            self.metrics.cache_counts_gets = True
        # OrderedDict: O(1) popitem(last=False); a plain dict degrades to O(holes) when
        # its front is popped repeatedly (next(iter(d)) skips deleted slots).
        self._cache: OrderedDict[Any, Any] = OrderedDict()
        self._dirty: dict[Any, tuple[bytes, bytes | None] | bytes | None] = {}
        """Cache key -> its encoded ``(key, value)`` (value ``None``: a delete) when kept; a
        bytes store's put of a ``bytes`` key: the ``bytes`` value; else ``None`` (the cached
        value, encoded at the flush)."""
        self._keeps_bytes = codec is not None and passthrough is None
        """Whether dirty entries keep their encodings: a codec below that encodes (bytes
        keys and values of the built-in bytes serde go down as they are anyway)."""
        self._passthrough = passthrough is not None
        """Whether the codec below is the built-in bytes serde for keys and values: a dirty
        ``bytes`` key then keeps its ``bytes`` value, which is its own encoding."""
        self._dirty_bytes = self._passthrough
        """Whether every dirty entry is a ``bytes`` key kept with its ``bytes`` value (a bytes
        store's puts): the dirty set is then the encoded batch and goes down as it is."""
        self._closed = False
        self._expiry = expiry
        # the ttl rules the per-record paths use inline (0 = plain values, no ttl)
        self._ttl_ns = expiry.ttl_ns if expiry is not None else 0
        self._refresh = expiry is not None and expiry.refresh
        if expiry is not None:
            self._clock = expiry.clock
            self._max_expiry = expiry.max_expiry
            self._pack_expiry = expiry.pack

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.name!r} is closed; open the task's TaskStorage again")

    # -- validation -------------------------------------------------------------------------
    def _check_value(self, key: Any, value: Any) -> None:
        check = self._values_check
        if check is None:
            return
        try:
            check([value])
        except SerializationError as e:
            raise SerializationError(f"{e} (put of key {key!r})") from e

    def _check_values(self, batch: dict[Any, Any]) -> None:
        check = self._values_check
        if check is not None and batch:
            values = list(batch.values())
            try:
                check(values)
            except SerializationError as e:
                raise SerializationError(f"{e} (put_all)") from e

    # -- internals -------------------------------------------------------------------------
    def _evict(self) -> None:
        """Drop least recently used entries beyond ``cache_size``; a dirty one sends the
        dirty set down first (a dirty entry is never dropped unwritten)."""
        cache = self._cache
        while len(cache) > self.cache_size:
            oldest, value = cache.popitem(last=False)
            if oldest in self._dirty:
                cache[oldest] = value
                cache.move_to_end(oldest, last=False)
                self._flush_dirty()
                cache.popitem(last=False)

    def _flush_dirty(self, new_puts: dict[Any, Any] | None = None, new_deletes: list[Any] | None = None) -> None:
        """Write the dirty entries to the layer below: ``put_all``/``delete_all`` calls of at
        most ``write.batch.size`` keys each.

        ``new_puts`` / ``new_deletes`` are a newer batch going down with them (it wins over
        a dirty entry of the same key). The dirty set is cleared once the writes succeeded,
        so a batch the layers below reject (an unencodable key) leaves this layer unchanged.
        """
        if self._dirty_bytes and new_puts is None and new_deletes is None:
            # a bytes store's puts: the dirty set is already the encoded batch (no loop here)
            dirty = self._dirty
            if dirty:
                self._codec.put_encoded(dirty)
                self._dirty = {}
            return
        cache = self._cache
        puts: dict[Any, Any] = {}
        deletes: list[Any] = []
        enc_puts: dict[bytes, bytes] = {}
        enc_deletes: list[bytes] = []
        keeps_bytes = self._keeps_bytes
        for k, enc in self._dirty.items():
            if enc is not None:
                if not keeps_bytes:
                    puts[k] = enc  # a bytes store's bytes value, as it was put
                elif enc[1] is None:
                    enc_deletes.append(enc[0])
                else:
                    enc_puts[enc[0]] = enc[1]
                continue
            v = cache[k]
            if v is _ABSENT:
                deletes.append(k)
            else:
                puts[k] = v
        if new_puts and (enc_puts or enc_deletes):
            # a newer batch of values wins over kept encodings of its keys
            for ek in self._codec.encode_keys(list(map(plain, new_puts))):
                enc_puts.pop(ek, None)
                if ek in enc_deletes:
                    enc_deletes.remove(ek)
        if new_puts:
            if deletes:
                deletes = [k for k in deletes if k not in new_puts]
            if puts:
                puts.update(new_puts)
            else:
                puts = new_puts
        if new_deletes:
            if puts:
                pop = puts.pop
                for k in new_deletes:
                    pop(k, None)
            deletes.extend(new_deletes)
        # Down in chunks of write.batch.size: each chunk is still one serde pass and one
        # engine batch, and its encoded bytes stay in the CPU cache on the way down
        # (one pass over 50,000 records measured slower than 100 passes over 500).
        size = self.batch_size
        if enc_puts:
            items = iter(enc_puts.items())
            while chunk := dict(islice(items, size)):
                self._codec.put_encoded(chunk)
        encoded = Encoded in set(map(type, puts)) if puts else False
        if len(puts) <= size and not encoded:
            if puts:
                self.inner.put_all(puts)
        else:
            items = iter(puts.items())
            while chunk := dict(islice(items, size)):
                # pairs, not a dict, when keys are Encoded: plain keys equal in Python
                # (1 and True) must not merge on the way down
                self.inner.put_all([(plain(k), v) for k, v in chunk.items()] if encoded else chunk)
        if deletes and Encoded in set(map(type, deletes)):
            deletes = list(map(plain, deletes))
        # deletes after every put: a newer delete of a key put earlier wins
        for start in range(0, len(enc_deletes), size):
            self._codec.delete_encoded(enc_deletes[start : start + size])
        for start in range(0, len(deletes), size):
            self.inner.delete_all(deletes[start : start + size])
        self._dirty = {}
        self._dirty_bytes = self._passthrough

    def _evict_one(self) -> None:
        """``_evict`` after a single insert: one entry to drop, usually clean."""
        oldest, value = self._cache.popitem(last=False)
        if oldest in self._dirty:
            self._cache[oldest] = value
            self._cache.move_to_end(oldest, last=False)
            self._evict()

    def _write_batch(self, batch: dict[Any, Any], deletes: bool,
                     encoded: dict[Any, tuple[bytes, bytes | None]] | None = None) -> None:
        """Apply a deduplicated batch (values, or all ``_ABSENT`` when ``deletes``).

        A batch smaller than ``write.batch.size`` joins the dirty set like single writes.
        A larger one goes straight down together with the dirty set — per chunk of
        ``write.batch.size`` keys one serde pass, one engine batch, one hand-over to the
        change logger — and then only its newest ``cache_size`` entries are kept in the
        cache, clean. (Recency inside one batch follows each key's first position in it.)
        ``encoded`` holds the batch's encodings per cache key, kept in the dirty set.
        """
        cache = self._cache
        if len(batch) < self.batch_size:
            cache.update(batch)
            deque(map(cache.move_to_end, batch), 0)
            dirty = self._dirty
            dirty.update(encoded if encoded is not None else dict.fromkeys(batch))
            self._dirty_bytes = False
            if len(dirty) >= self.batch_size:
                self._flush_dirty()
            if len(cache) > self.cache_size:
                self._evict()
            return
        if deletes:
            self._flush_dirty(new_deletes=list(batch))
        else:
            self._flush_dirty(new_puts=batch)
        self._keep_clean(batch)

    def _keep_clean(self, batch: dict[Any, Any]) -> None:
        """After a batch went down: keep its newest ``cache_size`` entries, clean."""
        cache = self._cache
        if len(batch) >= self.cache_size:
            cache.clear()
            cache.update(islice(batch.items(), len(batch) - self.cache_size, None))
        else:
            cache.update(batch)
            deque(map(cache.move_to_end, batch), 0)
            self._evict()

    # -- KeyValueStore -----------------------------------------------------------------------
    def get(self, key: Any, default: Any = None, _stored: bool = False) -> Any:
        """The value under ``key``, else ``default``. With an ``expiry`` the value of a live
        ``(expiry, value)`` pair; with ``_stored`` (``get_all``) the pair."""
        if self._closed:
            self._check_open()
        t = type(key)
        ck = key if t is str or t is bytes or t is int else self._keys.of(key)
        cache = self._cache
        v = cache.get(ck, _MISSING)
        if v is _MISSING:
            self.metrics.misses += 1
            v = self._miss_get(key) if t is self._key_exact else self.inner.get(key)
            cache[ck] = _ABSENT if v is None else v
            if len(cache) > self.cache_size:
                self._evict_one()
            if v is None:
                return default
        else:
            self.metrics.hits += 1
            cache.move_to_end(ck)
            if v is _ABSENT:
                return default
        if self._ttl_ns and not _stored:  # with an expiry: v is an (expiry, value) pair
            now = self._clock()
            if now is not None and v[0] <= now:
                self._expiry.note_expired(key)  # type: ignore[union-attr]
                return default
            if self._refresh:  # a new expiry: a write of the pair, not a put the metrics count
                self._put_all([(key, (self._expiry.stamp(), v[1]))])  # type: ignore[union-attr]
            return v[1]
        return v

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        if self._closed:
            self._check_open()
        keys = keys if isinstance(keys, list) else list(keys)
        if not all_simple(keys):
            out = {}
            for k in keys:  # per key: each gets its own identity (see the module docstring)
                v = CachedStore.get(self, k, None, True)  # as stored: with an expiry, the pairs
                if v is not None:
                    out[k] = v
            return out
        cache = self._cache
        cached = list(map(cache.get, keys, repeat(_MISSING)))
        missing = list(compress(keys, map(is_, cached, repeat(_MISSING))))
        metrics = self.metrics
        metrics.misses += len(missing)
        out: dict[Any, Any] = {}
        if len(missing) < len(keys):
            metrics.hits += len(keys) - len(missing)
            hit_keys = list(compress(keys, map(is_not, cached, repeat(_MISSING))))
            hit_values = list(compress(cached, map(is_not, cached, repeat(_MISSING))))
            deque(map(cache.move_to_end, hit_keys), 0)
            if any(map(is_, hit_values, repeat(_ABSENT))):
                out = {k: v for k, v in zip(hit_keys, hit_values) if v is not _ABSENT}
            else:
                out = dict(zip(hit_keys, hit_values))
        if missing:
            found = self.inner.get_all(missing)
            out.update(found)
            if len(missing) <= self.cache_size:
                fill = dict.fromkeys(missing, _ABSENT)
                fill.update(found)
                cache.update(fill)
                if len(cache) > self.cache_size:
                    self._evict()
        return out

    def put(self, key: Any, value: Any) -> None:
        """One put (or, with the ``_ABSENT`` marker from :meth:`delete`, one delete).

        The per-record path of every cached store, so it is one function, not a call per
        concern: the value and key are checked (an unencodable one raises here, naming the
        store and key), then the entry goes into the cache and the dirty set; a full dirty
        set goes down; the LRU end is evicted inline (a dirty one calls out: it is written
        first). A ``bytes`` value or key of the built-in bytes serde needs no encoder call.
        With an ``expiry`` the value is also paired with its expiry.
        """
        if value is None:
            reject_none(self.name, key, value)
        ev = None
        if value is not _ABSENT:
            if type(value) is not self._value_exact:
                encode = self._value_encode
                if encode is not None:
                    try:
                        ev = encode(value)
                    except Exception:
                        # raises the standard error naming store and key (of the stored pair, with ttl)
                        self._check_value(key, (0, value) if self._ttl_ns else value)
            else:
                ev = value  # the bytes serde stores a bytes value as it is
            ttl = self._ttl_ns
            if ttl:
                now = self._clock()
                if now is None:
                    raise self._expiry.no_time()  # type: ignore[union-attr]
                expiry = now + ttl
                value = (expiry if expiry < self._max_expiry else self._max_expiry, value)
                if ev is not None:
                    ev = self._pack_expiry(value[0]) + ev
        if self._closed:
            self._check_open()
        t = type(key)
        if t is self._key_exact:
            ek = key  # valid by its type, its own encoding and its own cache key
        elif (t is str or t is bytes or t is int) and self._key_encode is not None:
            try:
                ek = self._key_encode(key)  # a simple key is its own cache key
            except Exception:
                ek = self._keys.of(key)  # raises the standard error
        else:
            key, ek = self._keys.of_enc(key)
        cache = self._cache
        if key in cache:
            cache[key] = value
            cache.move_to_end(key)
        else:
            cache[key] = value
        dirty = self._dirty
        if self._keeps_bytes:
            dirty[key] = (ek, ev)
        elif ev is value and ek is key and self._passthrough:
            dirty[key] = value  # a bytes key and value of a bytes store: their own encodings
        else:
            dirty[key] = None
            self._dirty_bytes = False
        if len(dirty) >= self.batch_size:
            self._flush_dirty()
        if len(cache) > self.cache_size:
            oldest, old = cache.popitem(False)
            if oldest in self._dirty:  # the LRU end is dirty: it goes down first
                cache[oldest] = old
                cache.move_to_end(oldest, last=False)
                self._evict()
        if self._metered:
            if value is _ABSENT:
                self.metrics.deletes += 1
            else:
                self.metrics.puts += 1

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        if not isinstance(entries, (list, Mapping)):
            entries = list(entries)
        self._put_all(entries)
        if self._metered:
            self.metrics.puts += len(entries)

    def _put_all(self, entries: list[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        """:meth:`put_all` without counting (the ttl layer's own writes use it too)."""
        if self._closed:
            self._check_open()
        # two columns, not a list of pairs: a mapping's items() would be one GC-tracked
        # tuple per entry, all alive at once (most young collections of a bulk write)
        if isinstance(entries, Mapping):
            keys, values = list(entries), list(entries.values())
        else:
            keys, values = list(map(itemgetter(0), entries)), list(map(itemgetter(1), entries))
        if not keys:
            return
        if any(map(is_, values, repeat(None))):
            reject_none(self.name, next(compress(keys, map(is_, values, repeat(None)))), None)
        codec = self._codec
        if codec is not None and len(keys) >= self.batch_size:
            self._put_encoded(keys, values)
            return
        if self._keeps_bytes:
            ckeys, enc_keys = self._keys.of_all_enc(keys)
            try:
                enc_values = codec.encode_values(values)
            except SerializationError as e:
                raise SerializationError(f"{e} (put_all)") from e
            batch = dict(zip(ckeys, values))  # later pairs for one key win
            self._write_batch(batch, deletes=False, encoded=dict(zip(ckeys, zip(enc_keys, enc_values))))
            return
        batch = dict(zip(self._keys.of_all(keys), values))  # later pairs for one key win
        self._check_values(batch)
        self._write_batch(batch, deletes=False)

    def _put_encoded(self, keys: list[Any], values: list[Any]) -> None:
        """A large ``put_all``: keys and values encoded once, here (a bad one raises before
        anything is written), then sent below the serdes in chunks of ``write.batch.size``
        after the dirty set; the cache keeps the newest ``cache_size`` of them, clean."""
        codec = self._codec
        size = self.batch_size
        # encoded in chunks (50,000 values in one pass measured slower than 100 passes of
        # 500: the bytes fall out of the CPU cache), all before the first write
        chunks = []
        try:
            for i in range(0, len(keys), size):
                chunks.append((codec.encode_keys(keys[i : i + size]), codec.encode_values(values[i : i + size])))
        except SerializationError as e:
            raise SerializationError(f"{e} (put_all)") from e
        ckeys = keys if all_simple(keys) else list(map(self._keys.of, keys))
        self._flush_dirty()
        for enc_keys, enc_values in chunks:
            codec.put_encoded(dict(zip(enc_keys, enc_values)))  # later pairs for one key win
        self._keep_clean(dict(zip(ckeys, values)))

    def delete(self, key: Any) -> None:
        CachedStore.put(self, key, _ABSENT)

    def delete_all(self, keys: Iterable[Any]) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        self._delete_all(keys)
        if self._metered:
            self.metrics.deletes += len(keys)

    def _delete_all(self, keys: list[Any]) -> None:
        """:meth:`delete_all` without counting (the ttl layer's sweep uses it too)."""
        if self._closed:
            self._check_open()
        if self._keeps_bytes and keys:
            ckeys, enc_keys = self._keys.of_all_enc(keys)
            batch = dict.fromkeys(ckeys, _ABSENT)
            self._write_batch(batch, deletes=True, encoded=dict(zip(ckeys, zip(enc_keys, repeat(None)))))
            return
        batch = dict.fromkeys(self._keys.of_all(keys), _ABSENT)
        if batch:
            self._write_batch(batch, deletes=True)

    # Scans first push the dirty entries down, then read the layer below.
    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        self._count_scan()
        return self._range(start, stop)

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        self._count_scan()
        self._check_open()
        self._flush_dirty()
        return self.inner.prefix(prefix)

    def all(self) -> KeyValueIterator[Any, Any]:
        self._count_scan()
        return self._range(None, None)

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        self._count_scan()
        self._check_open()
        self._flush_dirty()
        return self.inner.range_keys(start, stop)

    def _count_scan(self) -> None:
        if self._metered:
            self.metrics.range_scans += 1

    def _range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        """:meth:`range` (``all`` with two ``None``) without counting."""
        self._check_open()
        self._flush_dirty()
        return self.inner.all() if start is None and stop is None else self.inner.range(start, stop)

    def flush(self) -> None:
        self._check_open()
        self._flush_dirty()
        self.inner.flush()

    def __len__(self) -> int:
        self._check_open()
        self._flush_dirty()  # the count below must see the cache's writes and deletes
        return len(self.inner)

    def approximate_len(self) -> int:
        self._check_open()
        self._flush_dirty()
        return self.inner.approximate_len()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_dirty()
        finally:
            self._cache.clear()
            self._dirty = {}
            self.inner.close()

    def dirty_count(self) -> int:
        return len(self._dirty)
