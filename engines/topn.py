"""``topn``: a persistent top-N / reorder heap (sortedcontainers).

Keeps members with a score, best first. With a capacity (``stores.<s>.topn.size``,
``0`` = unbounded) it is a running top-N: an offer that does not beat the worst kept
member is rejected, one that does evicts the worst. With ``order = min`` and no
capacity it is a reorder buffer: :meth:`TopNEngine.pop_until` drains everything up to
a watermark in order ("bounded sort" of a nearly-sorted stream).

Change records (docs/design/protocol.md): ``member`` (the member encoded with ``key.serde``) →
encoded score (+ payload encoded with ``msg.serde``); evictions, removals and pops
are tombstones. The value layout is one tag byte then 8 bytes big-endian then the
payload: ``b"i"``/``b"I"`` + signed 64-bit int, ``b"d"``/``b"D"`` + IEEE double
(upper case: a payload follows, possibly empty). The state is in memory and rebuilt
from the changelog on open (the default ``prepare_restore``).

Config::

    stores.trending.factory = topn
    stores.trending.key.serde = string
    stores.trending.msg.serde = json
    stores.trending.topn.size = 100
    stores.trending.topn.order = max
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from localstate.engine import (
    ChangeRecord,
    StorageEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import ConfigError, CorruptionError, InvalidValueError, StoreClosedError
from localstate.serdes import Serde, encode_for
from sortedcontainers import SortedList

__all__ = ["TopNEngine", "TopNEngineFactory", "TopNOptions", "Entry"]

_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


class Entry(NamedTuple):
    """One kept member: ``member`` and ``payload`` decoded by the store's serdes."""

    member: Any
    score: int | float
    payload: Any = None


@dataclass(frozen=True)
class TopNOptions:
    """``stores.<s>.topn.*``.

    ``size``: members kept (the worst is evicted beyond it); ``0`` = unbounded.
    ``order``: ``max`` (highest score is best) or ``min`` (lowest score is best).
    """

    size: int = 100
    order: Literal["max", "min"] = "max"

    def validate(self, prefix: str) -> None:
        if self.size < 0:
            raise ConfigError(
                f"{prefix}.size = {self.size}: must be a positive capacity, or 0 for unbounded"
            )


def encode_score(score: int | float, payload: bytes | None) -> bytes:
    """The change-record value for ``score`` (+ ``payload``); see the module doc."""
    if type(score) is int:
        head = (b"I" if payload is not None else b"i") + _Q.pack(score)
    else:
        head = (b"D" if payload is not None else b"d") + _D.pack(score)
    return head if payload is None else head + payload


def decode_score(value: bytes) -> tuple[int | float, bytes | None]:
    """Inverse of :func:`encode_score`."""
    tag = value[:1]
    if tag == b"i":
        return _Q.unpack_from(value, 1)[0], None
    if tag == b"d":
        return _D.unpack_from(value, 1)[0], None
    if tag == b"I":
        return _Q.unpack_from(value, 1)[0], value[9:]
    if tag == b"D":
        return _D.unpack_from(value, 1)[0], value[9:]
    raise ValueError(f"unknown score tag {tag!r}")


class TopNEngine(StorageEngine):
    """Members ordered by score, best first; ties broken by encoded member bytes.

    All members and payloads pass through the store's ``key.serde`` / ``msg.serde``
    (default ``bytes``). Scores are ``int`` (64-bit) or finite ``float``; ``bool``,
    NaN and infinities are rejected with :class:`InvalidValueError`.

    >>> heap.offer("page-7", 120)            # doctest: +SKIP
    True
    >>> heap.top(1)                          # doctest: +SKIP
    [Entry(member='page-7', score=120, payload=None)]
    """

    def __init__(self, context: StoreContext, options: TopNOptions | None = None) -> None:
        options = options or TopNOptions()
        self.name = context.store
        self.capacity = options.size
        self.order = options.order
        self._sign = -1 if options.order == "max" else 1
        self._logger = context.change_logger
        self._key: Serde = context.key_serde
        self._msg: Serde = context.msg_serde
        # member bytes -> (score, payload bytes | None); and (rank, member) sorted, rank
        # = sign * score so the best member is always first.
        self._entries: dict[bytes, tuple[int | float, bytes | None]] | None = {}
        self._order: SortedList = SortedList()
        self._deferred: list[ChangeRecord] = []

    # -- helpers ---------------------------------------------------------------------------
    def _require_open(self) -> dict[bytes, tuple[int | float, bytes | None]]:
        """The entries of the open heap (reads: no side effect)."""
        entries = self._entries
        if entries is None:
            raise StoreClosedError(f"store {self.name!r} (topn engine) is closed")
        return entries

    def _writable(self) -> dict[bytes, tuple[int | float, bytes | None]]:
        """The entries, for a mutation or a commit: first logs the tombstones of members
        evicted while restoring into a smaller capacity (never logged during restore)."""
        entries = self._require_open()
        if self._deferred:
            self._logger.log_all(self._deferred)
            self._deferred = []
        return entries

    def _enc_member(self, member: Any) -> bytes:
        if member is None:
            raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
        return encode_for(self.name, "key", self._key, member)

    def _enc_payload(self, payload: Any) -> bytes | None:
        if payload is None:
            return None
        return encode_for(self.name, "value", self._msg, payload)

    def _check_score(self, member: Any, score: Any) -> None:
        t = type(score)
        if t is float:
            if not math.isfinite(score):
                raise InvalidValueError(
                    f"store {self.name!r}: score {score!r} for member {member!r:.60} is not finite; "
                    "scores must be finite floats or 64-bit ints"
                )
            return
        if t is int:
            if not _INT_MIN <= score <= _INT_MAX:
                raise InvalidValueError(
                    f"store {self.name!r}: score {score} for member {member!r:.60} does not fit in a "
                    "signed 64-bit int; pass it as a float if approximate ordering is fine"
                )
            return
        raise InvalidValueError(
            f"store {self.name!r}: score {score!r:.60} ({t.__name__}) for member {member!r:.60} is not "
            "an int or float; convert it first (bool is not accepted)"
        )

    def _entry(self, member: bytes, score: int | float, payload: bytes | None) -> Entry:
        key, msg = self._key, self._msg
        m = key.decode(member) if key is not None else member
        p = None if payload is None else (msg.decode(payload) if msg is not None else payload)
        return Entry(m, score, p)

    # -- the top-N API ---------------------------------------------------------------------------
    def offer(self, member: Any, score: int | float, payload: Any = None) -> bool:
        """Set ``member``'s score (and payload); ``True`` if it is kept afterwards.

        A new member when the heap is full must beat the worst kept member (by score,
        then by encoded member bytes), which is then evicted; otherwise the offer is
        rejected (``False``, nothing changes). A kept member's score is replaced, up or
        down. O(log n).
        """
        entries = self._writable()
        m = self._enc_member(member)
        self._check_score(member, score)
        p = self._enc_payload(payload)
        return self._offer(entries, m, score, p)

    def _offer(self, entries: dict, m: bytes, score: int | float, p: bytes | None) -> bool:
        rank = self._sign * score
        old = entries.get(m)
        order = self._order
        if old is not None:
            if old[0] == score and type(old[0]) is type(score) and old[1] == p:
                return True
            order.remove((self._sign * old[0], m))
        elif self.capacity and len(entries) >= self.capacity:
            worst = order[-1]
            if (rank, m) >= worst:
                return False
            del order[-1]
            del entries[worst[1]]
            self._logger.log(worst[1], None)
        order.add((rank, m))
        entries[m] = (score, p)
        self._logger.log(m, encode_score(score, p))
        return True

    def offer_all(self, offers: Iterable[tuple[Any, int | float] | tuple[Any, int | float, Any]]) -> int:
        """:meth:`offer` each ``(member, score)`` or ``(member, score, payload)`` in order;
        returns how many were kept. Validation errors stop at the bad offer (earlier
        offers stay applied). The batch path: offers that cannot enter a full heap are
        rejected after one dict lookup and one comparison with the cached worst entry."""
        entries = self._writable()
        key = self._key
        encode = None if key is None or key.name == "bytes" else key.encode
        enc_member, check, enc_payload, offer = self._enc_member, self._check_score, self._enc_payload, self._offer
        isfinite, get = math.isfinite, entries.get
        cap, sign, order = self.capacity, self._sign, self._order
        worst = order[-1] if cap and len(entries) >= cap else None
        kept = 0
        for o in offers:
            member, score = o[0], o[1]
            if encode is not None and type(member) is str:
                try:
                    m = encode(member)
                except Exception:
                    m = enc_member(member)
            else:
                m = enc_member(member)
            t = type(score)
            if not ((t is float and isfinite(score)) or (t is int and _INT_MIN <= score <= _INT_MAX)):
                check(member, score)
            if worst is not None and len(o) == 2 and (sign * score, m) >= worst and get(m) is None:
                continue  # cannot enter the full heap: nothing changes
            kept += offer(entries, m, score, enc_payload(o[2]) if len(o) > 2 else None)
            worst = order[-1] if cap and len(entries) >= cap else None
        return kept

    def remove(self, member: Any) -> bool:
        """Remove ``member``; ``True`` if it was kept (it is not an error if it was not)."""
        entries = self._writable()
        m = self._enc_member(member)
        old = entries.pop(m, None)
        if old is None:
            return False
        self._order.remove((self._sign * old[0], m))
        self._logger.log(m, None)
        return True

    def score(self, member: Any) -> int | float | None:
        """``member``'s score, or ``None`` if it is not kept. O(1)."""
        entry = self._require_open().get(self._enc_member(member))
        return None if entry is None else entry[0]

    def get(self, member: Any) -> Entry | None:
        """``member``'s :class:`Entry` (score and payload), or ``None``. O(1)."""
        m = self._enc_member(member)
        entry = self._require_open().get(m)
        return None if entry is None else self._entry(m, *entry)

    def top(self, k: int | None = None) -> list[Entry]:
        """The best ``k`` entries (all if ``None``), best first. O(k + log n)."""
        entries = self._require_open()
        if k is not None and k < 0:
            raise InvalidValueError(f"store {self.name!r}: top(k) needs k >= 0, got {k}")
        members = self._order[:k] if k is not None else list(self._order)
        make = self._entry
        return [make(m, *entries[m]) for _, m in members]

    def pop(self) -> Entry:
        """Remove and return the best entry; ``IndexError`` if empty. O(log n)."""
        entries = self._writable()
        if not entries:
            raise IndexError(f"pop from an empty top-N store {self.name!r}")
        _, m = self._order.pop(0)
        score, p = entries.pop(m)
        self._logger.log(m, None)
        return self._entry(m, score, p)

    def pop_until(self, score: int | float, *, inclusive: bool = True) -> list[Entry]:
        """Remove and return, best first, every entry ranked before ``score``.

        With ``order = min``: every entry with a score ``<= score`` (``<`` when not
        ``inclusive``); with ``order = max``: ``>= score``. The bounded-sort use case:
        buffer a nearly-sorted stream by timestamp and drain up to the watermark.
        O(k log n) for k popped entries.
        """
        entries = self._writable()
        self._check_score("<watermark>", score)
        limit = self._sign * score
        order = self._order
        end = order.bisect_left((limit,))
        if inclusive:
            n = len(order)
            while end < n and order[end][0] == limit:
                end += 1
        if not end:
            return []
        taken = order[:end]
        del order[:end]
        log, make = self._logger.log, self._entry
        out = []
        for _, m in taken:
            s, p = entries.pop(m)
            log(m, None)
            out.append(make(m, s, p))
        return out

    def __len__(self) -> int:
        return len(self._require_open())

    def __contains__(self, member: Any) -> bool:
        return self._enc_member(member) in self._require_open()

    # -- StorageEngine -------------------------------------------------------------------------------
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        entries = self._entries
        if entries is None:
            raise StoreClosedError(f"store {self.name!r} (topn engine) is closed")
        for m, v in records:
            if v is None:
                entries.pop(m, None)
                continue
            try:
                entries[m] = decode_score(v)
            except (ValueError, struct.error) as e:
                raise CorruptionError(
                    f"store {self.name!r}: change record for member {m!r:.60} has a bad score value "
                    f"{v!r:.40} ({e}); the changelog does not belong to a topn store"
                ) from e
        sign = self._sign
        self._order = order = SortedList([(sign * s, m) for m, (s, _) in entries.items()])
        cap = self.capacity
        if cap and len(order) > cap:
            # the capacity shrank since these records were written: evict now, log the
            # tombstones with the next mutation or commit (never while restoring).
            for _, m in order[cap:]:
                del entries[m]
                self._deferred.append((m, None))
            del order[cap:]

    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        entries = self._entries
        if entries is None:
            raise StoreClosedError(f"store {self.name!r} (topn engine) is closed")
        get = entries.get
        out: list[ChangeRecord] = []
        for k in keys:
            e = get(k)
            out.append((k, None if e is None else encode_score(e[0], e[1])))
        return out

    def prepare_commit(self) -> None:
        self._writable()

    def flush(self) -> None:
        self._writable()

    def close(self) -> None:
        self._entries = None
        self._order = SortedList()
        self._deferred = []

    def _check(self) -> None:
        """Verify every invariant in O(n log n); raises AssertionError on violation."""
        entries = self._require_open()
        order = self._order
        order._check()
        assert len(order) == len(entries), (len(order), len(entries))
        for rank, m in order:
            score = entries[m][0]
            assert rank == self._sign * score, (m, rank, score)
            assert type(score) in (int, float)
        if self.capacity:
            assert len(entries) <= self.capacity, (len(entries), self.capacity)


class TopNEngineFactory(StorageEngineFactory):
    """Factory ``topn``: options ``stores.<s>.topn.size`` and ``stores.<s>.topn.order``."""

    options_prefix = "topn"
    options_type = TopNOptions
    description = "persistent top-N / reorder heap (sortedcontainers); member -> score change records"

    def create(self, spec: StoreSpec, context: StoreContext) -> TopNEngine:
        return TopNEngine(context, spec.options)
