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
from ..serdes import Serde, decoder_of_many, prefixed_encoder_of_many
from .cached import CachedStore
from .forwarding import ForwardingStore
from .serialized import SerializedStore

__all__ = [
    "TtlPolicy", "TtlStore", "TtlSerializedStore", "ttl_serde", "ttl_clock", "wall_clock_ms", "wall_clock_ns",
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


class TtlStore(ForwardingStore):
    """Wraps a store of ``(expiry_ms, value)`` pairs; the task sees plain values.

    ``now`` is the clock (processing or event time, **ns**); it returns ``None`` while the
    time is unknown (event time before the task's first event): then nothing has
    expired, and a write is an error (its expiry would be meaningless). Complexity: one
    clock read and one comparison per read entry; ``flush()`` examines at most
    ``cleanup_batch`` entries plus those reads found expired.
    """

    def __init__(self, inner: KeyValueStore[Any, Any], policy: TtlPolicy, now: Callable[[], int | None],
                 name: str | None = None, value_serde: Serde | None = None) -> None:
        """``value_serde``: the serde of the values (inside the pairs), given when ``inner``
        is an object cache (:class:`CachedStore`). The per-record paths are then the cache's, with the expiry
        stamp and check fused in (:meth:`CachedStore.expire_with`): ``put`` *is* the cache's
        put, ``get`` (update type on-create-and-write) its
        :meth:`~CachedStore.get`, and a metered layer above counts single puts and
        deletes through the cache (:attr:`counts_writes`), so they make no call there
        either: one Python call per put or get, as without TTL."""
        super().__init__(inner, name)
        self.policy = policy
        self.clock = now
        self._get, self._put = inner.get, inner.put
        self._ttl = policy.ms * 1_000_000
        self._refresh = policy.update == "on-read-and-write"
        self._fused = value_serde is not None and isinstance(inner, CachedStore)
        if self._fused:
            assert isinstance(inner, CachedStore) and value_serde is not None
            inner.expire_with(now, self._ttl, _MAX_EXPIRY_NS, value_serde, self._note_expired, self._no_event_time,
                              _EXPIRY.pack)
            self.metrics = inner.metrics
            self.put = inner.put  # type: ignore[method-assign]
            if not self._refresh:
                self.get = inner.get  # type: ignore[method-assign]
        self._seen_expired: set[Any] = set()
        self._cursor: Any = None
        """Where the next incremental sweep starts (a key; ``None``: from the first key)."""
        self.expired_deleted = 0
        """Entries the sweeps have deleted (tombstones logged) since open."""

    def now(self) -> int:
        """The clock for reads: ``now`` in ns, or a time before everything when unknown."""
        t = self.clock()
        return _NOTHING_EXPIRED if t is None else t

    def _expiry(self) -> int:
        t = self.clock()
        if t is None:
            raise self._no_event_time()
        return min(t + self._ttl, _MAX_EXPIRY_NS)

    def _no_event_time(self) -> InvalidValueError:
        return InvalidValueError(
            f"store {self.name!r} has stores.{self.name}.ttl.time = event, but the task has no event time yet: "
            "advance it first (TaskStorage.advance_event_time(ts); the Spark runner does it from "
            "StreamTask.event_time_column before each input batch)"
        )

    def _note_expired(self, key: Any) -> None:
        # Found expired by a read: the next sweep deletes it (unhashable keys, possible
        # with a json key serde, are left to the incremental sweep).
        try:
            self._seen_expired.add(key)
        except TypeError:
            pass

    # -- reads: never return an expired entry --------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        # (over an object cache with update type on-create-and-write, the cache's get
        # replaces this one: see __init__)
        if self._fused:
            value = self._get(key)  # the cache's get has checked the expiry
            if value is None:
                return default
        else:
            pair = self._get(key)
            if pair is None:
                return default
            t = self.clock()
            if t is not None and pair[0] <= t:
                self._note_expired(key)
                return default
            value = pair[1]
        if self._refresh:  # a new expiry: a write of the layers below, not a put the metrics count
            self.inner.put_all([(key, (self._expiry(), value))])
        return value

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        found = self.inner.get_all(keys)
        now = self.now()
        out = {}
        for k, (expiry, v) in found.items():
            if expiry <= now:
                self._note_expired(k)
            else:
                out[k] = v
        if self._refresh and out:
            expiry = self._expiry()
            self.inner.put_all([(k, (expiry, v)) for k, v in out.items()])
        return out

    def _live(self, it: KeyValueIterator[Any, Any]) -> KeyValueIterator[Any, Any]:
        now = self.now()
        note = self._note_expired

        def live() -> Iterator[tuple[Any, Any]]:
            for k, (expiry, v) in it:
                if expiry <= now:
                    note(k)
                else:
                    yield k, v

        return KeyValueIterator(live(), on_close=it.close, what=f"store {self.name!r} iterator")

    def __len__(self) -> int:
        """Live entries only (one scan): expired entries stay in the layers below until
        a sweep deletes them, so the inner count would include them.
        ``approximate_len()`` is the inner estimate, expired entries included."""
        with self.all() as it:
            return sum(1 for _ in it)

    def range(self, start: Any, stop: Any) -> KeyValueIterator[Any, Any]:
        return self._live(self.inner.range(start, stop))

    def prefix(self, prefix: Any) -> KeyValueIterator[Any, Any]:
        return self._live(self.inner.prefix(prefix))

    def all(self) -> KeyValueIterator[Any, Any]:
        return self._live(self.inner.all())

    def range_keys(self, start: Any, stop: Any) -> CloseableIterator[Any]:
        # the expiry is inside each value: a keys-only scan reads the pairs all the same
        return keys_of(self.all() if start is None and stop is None else self.range(start, stop))

    # -- writes: stamp the expiry -----------------------------------------------------------------
    def put(self, key: Any, value: Any) -> None:
        # (over an object cache, the cache's own put replaces this one: see __init__)
        if value is None:
            reject_none(self.name, key, value)
        self._put(key, (self._expiry(), value))

    @property
    def counts_writes(self) -> bool:
        """Whether the object cache below counts single puts and deletes (set by a metered
        layer above; see :attr:`CachedStore.counts_writes`). Only over a cache."""
        if not self._fused:
            raise AttributeError("counts_writes: no object cache below the ttl layer")
        return bool(self.inner.counts_writes)  # type: ignore[attr-defined]

    @counts_writes.setter
    def counts_writes(self, on: bool) -> None:
        self.inner.counts_writes = on  # type: ignore[attr-defined]

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        items = entries.items() if isinstance(entries, Mapping) else entries
        expiry = self._expiry()
        pairs = []
        for k, v in items:
            if v is None:
                reject_none(self.name, k, v)
            pairs.append((k, (expiry, v)))
        self.inner.put_all(pairs)

    # -- cleanup -----------------------------------------------------------------------------------
    def sweep(self, limit: int | None = None) -> int:
        """Delete (and so log tombstones for) expired entries: those reads found since the
        last sweep, and up to ``limit`` (default ``ttl.cleanup.batch``) more examined from
        the cursor. Returns how many were deleted."""
        limit = self.policy.cleanup_batch if limit is None else limit
        now = self.now()
        doomed: list[Any] = []
        if self._seen_expired:
            seen, self._seen_expired = list(self._seen_expired), set()
            found = self.inner.get_all(seen)
            doomed.extend(k for k, (expiry, _) in found.items() if expiry <= now)
        if limit > 0:
            cursor = self._cursor
            with self.inner.range(cursor, None) as it:
                examined = list(islice(it, limit + (cursor is not None)))
            if cursor is not None and examined and examined[0][0] == cursor:
                examined = examined[1:]  # range() is inclusive of its start: the last key seen before
            elif cursor is not None:
                examined = examined[:limit]
            doomed.extend(k for k, (expiry, _) in examined if expiry <= now)
            self._cursor = examined[-1][0] if len(examined) >= limit else None  # None: wrap around
        if doomed:
            doomed = _unique(doomed)
            self.inner.delete_all(doomed)
            fault_point("ttl.after_sweep")
            self.expired_deleted += len(doomed)
        return len(doomed)

    def flush(self) -> None:
        """Sweep (commit-time cleanup), then push buffered writes down."""
        self.sweep()
        self.inner.flush()
