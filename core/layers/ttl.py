"""The ``ttl`` layer: entries that expire a fixed time after they were written.

Configured per key-value store with ``stores.<s>.ttl.ms`` (see :class:`TtlPolicy`).
The semantics follow Flink's ``StateTtlConfig`` (update on create and write, or also on
read; expired entries never returned; an incremental sweep at each commit that deletes
them with logged tombstones; processing or event time). The expiry is encoded below the
serialized layer as an 8-byte prefix of the value and checked here, above the object
cache. The rules and the reasons are in docs/design/ttl.md.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Any, Literal

from ..errors import ConfigError, InvalidValueError
from ..faults import fault_point
from ..kv import CloseableIterator, KeyValueIterator, KeyValueStore, keys_of, reject_none
from ..metrics import StoreMetrics
from ..serdes import Serde, decoder_of_many, prefixed_encoder_of_many
from .cached import CachedStore
from .forwarding import ForwardingStore
from .serialized import SerializedStore

__all__ = [
    "TtlPolicy", "Expiry", "TtlStore", "ExpiringCachedStore", "TtlSerializedStore", "ttl_serde", "ttl_clock", "wall_clock_ms", "wall_clock_ns",
    "EXPIRY_BYTES",
]

EXPIRY_BYTES = 8
_EXPIRY = struct.Struct(">q")  # signed: an event-time expiry may be before the epoch
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
MAX_TTL_MS = 100 * 365 * 24 * 3600 * 1000
"""The largest ``ttl.ms`` (100 years): expiries in ns stay inside 64 bits."""
_MAX_EXPIRY_NS = (1 << 63) - 1
_NOTHING_EXPIRED = -(1 << 63)
wall_clock_ns = time.time_ns
"""Processing time for TTL: nanoseconds since the epoch."""


def wall_clock_ms() -> int:
    """Processing time: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def ttl_clock(policy: TtlPolicy | None, event_time_ms: Callable[[], int | None]) -> Callable[[], int | None]:
    """"Now" in **ns** for a store with ``policy``: the wall clock (processing time), or
    ``event_time_ms()`` scaled to ns for ``ttl.time = event`` (``None`` while unknown).
    The one clock rule of TTL: the task's stores and every reader of committed state
    (:class:`~localstate.StateReader`, ``localstate get``/``dump``) take "now" from here."""
    if policy is None or policy.time != "event":
        return wall_clock_ns

    def event_now() -> int | None:
        t = event_time_ms()
        return None if t is None else t * 1_000_000

    return event_now


@dataclass(frozen=True)
class TtlPolicy:
    """The parsed ``stores.<s>.ttl.*`` keys of one store."""

    ms: int
    time: Literal["processing", "event"] = "processing"
    update: Literal["on-create-and-write", "on-read-and-write"] = "on-create-and-write"
    cleanup_batch: int = 1000

    @classmethod
    def parse(cls, store: str, raw: Mapping[str, Any]) -> TtlPolicy | None:
        """From the store's ``ttl.*`` keys (relative names) through the one options route
        (:func:`~localstate.options.parse_options`); ``None`` when no ``ttl.*`` key is set."""
        from ..options import parse_options

        prefix = f"stores.{store}.ttl"
        if "ms" not in raw:
            if not raw:
                return None
            parse_options(cls, {**raw, "ms": 1}, prefix)  # an unknown key or a bad value is the first error
            raise ConfigError(f"{prefix}.* is set but {prefix}.ms is not: set {prefix}.ms (e.g. {prefix}.ms = 24h)")
        return parse_options(cls, raw, prefix)

    def validate(self, prefix: str) -> None:
        """The bounds no type says (called by ``parse_options``)."""
        if self.ms <= 0:
            raise ConfigError(f"{prefix}.ms = {self.ms!r}: must be > 0 (leave it unset for entries that never expire)")
        if self.ms > MAX_TTL_MS:
            raise ConfigError(f"{prefix}.ms = {self.ms!r}: must be <= {MAX_TTL_MS} (leave it unset for no expiry)")
        if self.cleanup_batch < 0:
            raise ConfigError(f"{prefix}.cleanup.batch = {self.cleanup_batch}: must be >= 0 "
                              "(0: only entries a read found expired)")


def ttl_serde(inner: Serde) -> Serde:
    """The value serde of a TTL store: ``(expiry_ms, value)`` ↔ 8-byte expiry + ``inner`` bytes."""
    encode, decode = inner.encode, inner.decode
    encode_many_after, decode_many = prefixed_encoder_of_many(inner), decoder_of_many(inner)
    pack, unpack_from = _EXPIRY.pack, _EXPIRY.unpack_from

    def enc(pair: tuple[int, Any]) -> bytes:
        return pack(pair[0]) + encode(pair[1])

    def dec(data: bytes) -> tuple[int, Any]:
        return unpack_from(data)[0], decode(data[EXPIRY_BYTES:])

    def enc_many(pairs: list[tuple[int, Any]]) -> list[bytes]:
        return encode_many_after(map(pack, map(_FIRST, pairs)), list(map(_SECOND, pairs)))

    def dec_many(items: list[bytes]) -> list[tuple[int, Any]]:
        values = decode_many([b[EXPIRY_BYTES:] for b in items])
        return list(zip(map(_FIRST, map(unpack_from, items)), values))

    return Serde(f"ttl+{inner.name}", enc, dec, False, enc_many, dec_many)


class TtlSerializedStore(SerializedStore):
    """The serialized layer of a TTL store: values are :func:`ttl_serde` pairs of
    ``value_serde``. Its ``get`` builds the ``(expiry, value)`` pair inline rather than
    through the pair serde's decoder: a read miss is the per-record read path of a cached
    TTL store, and that call was ~4% of it. A stored value that does not decode raises the
    standard error through :meth:`decode_value`, as the plain layer's ``get`` does."""

    def __init__(self, inner: KeyValueStore[bytes, bytes], key_serde: Serde, value_serde: Serde, name: str) -> None:
        super().__init__(inner, key_serde, ttl_serde(value_serde), name)
        self._value_decode = value_serde.decode

    def get(self, key: Any, default: Any = None) -> Any:
        try:  # as SerializedStore.get: the serde's encoder inline, encode_key names a bad key
            if key is None:
                raise TypeError("None")
            encoded = self.key_serde.encode(key)
        except Exception:
            encoded = self.encode_key(key)
        data = self.inner.get(encoded)
        if data is None:
            return default
        try:
            return _EXPIRY.unpack_from(data)[0], self._value_decode(data[EXPIRY_BYTES:])
        except Exception:
            return self.decode_value(data)


def _unique(keys: list[Any]) -> list[Any]:
    """``keys`` once each, in order, told apart as the serdes tell them apart: by ``repr``,
    not by Python equality, which merges ``1``, ``1.0`` and ``True`` (distinct keys for
    the json serde) and fails on the lists a json-keyed scan gives for array keys (a list
    and the tuple a read was given are one key)."""
    return list(dict(zip(map(_key_id, keys), keys)).values())


def _key_id(key: Any) -> str:
    return repr(tuple(key)) if type(key) is list else repr(key)


class Expiry:
    """The ttl rules of one store, shared by its ttl layer and, with an object cache, the
    cache's per-record paths (:class:`CachedStore` is built with it).

    ``clock`` is "now" (processing or event time, **ns**); it returns ``None`` while the
    time is unknown (event time before the task's first event): then nothing has
    expired, and a write is an error (its expiry would be meaningless). Complexity: one
    clock read and one comparison per read entry; a sweep examines at most
    ``cleanup_batch`` entries plus those reads found expired.
    """

    def __init__(self, policy: TtlPolicy, clock: Callable[[], int | None], name: str,
                 value_serde: Serde | None = None) -> None:
        """``value_serde``: the serde of the values inside the pairs (an object cache
        checks each put value with it)."""
        self.policy = policy
        self.clock = clock
        self.name = name
        self.value_serde = value_serde
        self.ttl_ns = policy.ms * 1_000_000
        self.max_expiry = _MAX_EXPIRY_NS
        self.refresh = policy.update == "on-read-and-write"
        """Whether a read gives a live entry a new expiry."""
        self.pack = _EXPIRY.pack
        """The bytes an expiry is stored as, in front of the value's bytes."""
        self._seen_expired: set[Any] = set()
        self._cursor: Any = None
        """Where the next incremental sweep starts (a key; ``None``: from the first key)."""
        self.expired_deleted = 0
        """Entries the sweeps have deleted (tombstones logged) since open."""

    def now(self) -> int:
        """The clock for reads: ``now`` in ns, or a time before everything when unknown."""
        t = self.clock()
        return _NOTHING_EXPIRED if t is None else t

    def stamp(self) -> int:
        """The expiry of an entry written now."""
        t = self.clock()
        if t is None:
            raise self.no_time()
        return min(t + self.ttl_ns, _MAX_EXPIRY_NS)

    def no_time(self) -> InvalidValueError:
        return InvalidValueError(
            f"store {self.name!r} has stores.{self.name}.ttl.time = event, but the task has no event time yet: "
            "advance it first (TaskStorage.advance_event_time(ts); the Spark runner does it from "
            "StreamTask.event_time_column before each input batch)"
        )

    def note_expired(self, key: Any) -> None:
        """Found expired by a read: the next sweep deletes it (unhashable keys, possible
        with a json key serde, are left to the incremental sweep)."""
        try:
            self._seen_expired.add(key)
        except TypeError:
            pass

    def stamped(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> list[tuple[Any, Any]]:
        """``entries`` as ``(key, (expiry, value))`` pairs; a ``None`` value is refused."""
        items = entries.items() if isinstance(entries, Mapping) else entries
        expiry = self.stamp()
        pairs = []
        for k, v in items:
            if v is None:
                reject_none(self.name, k, v)
            pairs.append((k, (expiry, v)))
        return pairs

    def live_found(self, found: Mapping[Any, tuple[int, Any]]) -> dict[Any, Any]:
        """The values of the live pairs of a ``get_all`` result."""
        now = self.now()
        out = {}
        for k, (expiry, v) in found.items():
            if expiry <= now:
                self.note_expired(k)
            else:
                out[k] = v
        return out

    def live(self, it: KeyValueIterator[Any, Any]) -> KeyValueIterator[Any, Any]:
        """The live pairs of a scan, as ``(key, value)``."""
        now = self.now()
        note = self.note_expired

        def live() -> Iterator[tuple[Any, Any]]:
            for k, (expiry, v) in it:
                if expiry <= now:
                    note(k)
                else:
                    yield k, v

        return KeyValueIterator(live(), on_close=it.close, what=f"store {self.name!r} iterator")

    def sweep(self, get_all: Callable[[list[Any]], Mapping[Any, tuple[int, Any]]],
              scan: Callable[[Any, Any], KeyValueIterator[Any, Any]],
              delete_all: Callable[[list[Any]], None], limit: int | None = None) -> int:
        """Delete (and so log tombstones for) expired entries, through the pair-level
        ``get_all``/``scan``/``delete_all`` of the store below the ttl rules: those reads
        found since the last sweep, and up to ``limit`` (default ``ttl.cleanup.batch``)
        more examined from the cursor. Returns how many were deleted."""
        limit = self.policy.cleanup_batch if limit is None else limit
        now = self.now()
        doomed: list[Any] = []
        if self._seen_expired:
            seen, self._seen_expired = list(self._seen_expired), set()
            found = get_all(seen)
            doomed.extend(k for k, (expiry, _) in found.items() if expiry <= now)
        if limit > 0:
            cursor = self._cursor
            with scan(cursor, None) as it:
                examined = list(islice(it, limit + (cursor is not None)))
            if cursor is not None and examined and examined[0][0] == cursor:
                examined = examined[1:]  # range() is inclusive of its start: the last key seen before
            elif cursor is not None:
                examined = examined[:limit]
            doomed.extend(k for k, (expiry, _) in examined if expiry <= now)
            self._cursor = examined[-1][0] if len(examined) >= limit else None  # None: wrap around
        if doomed:
            doomed = _unique(doomed)
            delete_all(doomed)
            fault_point("ttl.after_sweep")
            self.expired_deleted += len(doomed)
        return len(doomed)


class TtlStore(ForwardingStore):
    """The ttl layer over a store of ``(expiry, value)`` pairs (no object cache): the
    task sees plain values; the rules are ``expiry``'s (:class:`Expiry`)."""

    def __init__(self, inner: KeyValueStore[Any, Any], expiry: Expiry) -> None:
        super().__init__(inner, expiry.name)
        self.expiry = expiry
        self._clock = expiry.clock  # the per-record read path's own reference
        self._refresh = expiry.refresh

    @property
    def expired_deleted(self) -> int:
        """Entries the sweeps have deleted (tombstones logged) since open."""
        return self.expiry.expired_deleted

    # -- reads: never return an expired entry --------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        pair = self.inner.get(key)
        if pair is None:
            return default
        t = self._clock()
        if t is not None and pair[0] <= t:
            self.expiry.note_expired(key)
            return default
        if self._refresh:  # a new expiry: a write of the layers below, not a put the metrics count
            self.inner.put_all([(key, (self.expiry.stamp(), pair[1]))])
        return pair[1]

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        out = self.expiry.live_found(self.inner.get_all(keys))
        if self.expiry.refresh and out:
            self.inner.put_all(self.expiry.stamped(out))
        return out

    def __len__(self) -> int:
        """Live entries only (one scan): expired entries stay in the layers below until
        a sweep deletes them, so the inner count would include them.
        ``approximate_len()`` is the inner estimate, expired entries included."""
        with self.all() as it:
            return sum(1 for _ in it)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(self.inner.range(start, stop))

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(self.inner.prefix(prefix))

    def all(self) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(self.inner.all())

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        # the expiry is inside each value: a keys-only scan reads the pairs all the same
        return keys_of(self.all() if start is None and stop is None else self.range(start, stop))

    # -- writes: stamp the expiry -----------------------------------------------------------------
    def put(self, key: Any, value: Any) -> None:
        if value is None:
            reject_none(self.name, key, value)
        self.inner.put(key, (self.expiry.stamp(), value))

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        self.inner.put_all(self.expiry.stamped(entries))

    # -- cleanup -----------------------------------------------------------------------------------
    def sweep(self, limit: int | None = None) -> int:
        """Delete expired entries now (see :meth:`Expiry.sweep`)."""
        inner = self.inner
        return self.expiry.sweep(inner.get_all, inner.range, inner.delete_all, limit)

    def flush(self) -> None:
        """Sweep (commit-time cleanup), then push buffered writes down."""
        self.sweep()
        self.inner.flush()


class ExpiringCachedStore(CachedStore):
    """The object cache of a ttl store: the task-facing layer, built with the store's
    :class:`Expiry`. Its per-record ``put``/``get``/``delete`` are the cache's own, with
    the expiry stamp and check inline (one Python call per record); here the bulk calls
    and scans stamp and check as :class:`TtlStore` does, and a flush sweeps first."""

    def __init__(self, inner: KeyValueStore[Any, Any], cache_size: int, batch_size: int, name: str,
                 metrics: StoreMetrics | None, codec: Any, *, metered: bool, expiry: Expiry) -> None:
        super().__init__(inner, cache_size, batch_size, name, metrics, codec, metered=metered, expiry=expiry)
        self.expiry = expiry

    @property
    def expired_deleted(self) -> int:
        """Entries the sweeps have deleted (tombstones logged) since open."""
        return self.expiry.expired_deleted

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        out = self.expiry.live_found(super().get_all(keys))
        if self.expiry.refresh and out:
            self._put_all(self.expiry.stamped(out))
        return out

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        super().put_all(self.expiry.stamped(entries))

    def __len__(self) -> int:
        """Live entries only (one scan; see :meth:`TtlStore.__len__`)."""
        with self.expiry.live(self._range(None, None)) as it:
            return sum(1 for _ in it)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(super().range(start, stop))

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(super().prefix(prefix))

    def all(self) -> KeyValueIterator[Any, Any]:
        return self.expiry.live(super().all())

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        # the expiry is inside each value: a keys-only scan reads the pairs all the same
        return keys_of(self.all() if start is None and stop is None else self.range(start, stop))

    def sweep(self, limit: int | None = None) -> int:
        """Delete expired entries now (see :meth:`Expiry.sweep`), through this cache, uncounted."""
        return self.expiry.sweep(super().get_all, self._range, self._delete_all, limit)

    def flush(self) -> None:
        """Sweep (commit-time cleanup), then push the dirty entries down."""
        self.sweep()
        super().flush()
