"""Timers: callbacks for a key at a time, kept in a store on the task's changelog.

A task registers ``(key, timestamp)`` pairs; when its clock passes a timestamp the
timer *fires* (the task's ``on_timer(key, ts, emit)`` runs) and is deleted. Two
domains, as in Flink's ``TimerService``:

* **event time**: fires when the task's event-time clock (its watermark,
  :meth:`TaskStorage.advance_event_time`) reaches ``ts``;
* **processing time**: fires when the wall clock (ms since the epoch) reaches ``ts``.

Timers live in an ordinary key-value store of the task (``bytes`` serdes, no TTL), so
they are written, logged, committed and restored exactly like the rest of its state:
a timer deleted by firing and the output of that firing belong to the same commit,
so after a crash a timer fires again only if the commit that fired it never happened.

Record key: one domain byte, the timestamp as 8 big-endian bytes biased by ``2**63``
(byte order = numeric order, negatives included), then the key: a type tag and its
bytes (``s`` + UTF-8 for ``str``, ``i`` + 8 biased big-endian bytes for ``int``, ``b`` +
the bytes for ``bytes``, ``t`` + the order-preserving ``tuple`` encoding of ``(key,)``
for anything else). A scan of ``[domain, domain + ts]`` therefore yields the due timers
in ``(ts, key)`` order (keys of one type in their natural order; types grouped by tag). Registering the same ``(key, ts)`` twice keeps one timer
(Flink's semantics); a timer at or before the current time fires at the next
:meth:`Timers.fire` — the next time the clock is checked — as in Flink.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import Any

from .errors import ConfigError, InvalidValueError
from .faults import fault_point
from .kv import KeyValueStore
from .serdes import all_of_type, get_serde

__all__ = ["Timers", "EVENT_TIME", "PROCESSING_TIME", "check_timer_store", "is_timer_record", "timer_key"]

EVENT_TIME = b"e"
PROCESSING_TIME = b"p"
_BIAS = 1 << 63
_MARK = b"\x01"
_HEAD = struct.Struct(">cQ")
"""The domain byte and the biased timestamp that start every record key."""
_HEAD_STR = struct.Struct(">cQc")
"""The same, followed by the ``str`` key tag."""
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_TAG, _STR_BODY = itemgetter(9), itemgetter(slice(10, None))
"""The key's type tag in a record key; the UTF-8 of a ``str`` key."""
_FETCH = 4096
_TUPLE = get_serde("tuple")
_STR, _INT, _BYTES, _OTHER = b"s", b"i", b"b", b"t"


def _encode_key(key: Any) -> bytes:
    cls = type(key)
    if cls is str:
        return _STR + key.encode()
    if cls is int and -_BIAS <= key < _BIAS:
        return _INT + (key + _BIAS).to_bytes(8, "big")
    if cls is bytes:
        return _BYTES + key
    return _OTHER + _TUPLE.encode((key,))


def _decode_key(data: bytes) -> Any:
    tag = data[:1]
    if tag == _STR:
        return data[1:].decode()
    if tag == _INT:
        return int.from_bytes(data[1:], "big") - _BIAS
    if tag == _BYTES:
        return data[1:]
    return _TUPLE.decode(data[1:])[0]


def _decode_keys(record_keys: list[bytes]) -> list[Any]:
    """The keys of timer record keys (after the domain byte and the timestamp)."""
    if set(map(_TAG, record_keys)) == {_STR[0]}:  # C-level passes: this is the firing path
        return list(map(bytes.decode, map(_STR_BODY, record_keys)))
    return [_decode_key(k[9:]) for k in record_keys]


def is_timer_record(record_key: bytes) -> bool:
    """Whether ``record_key`` has the shape of a timer record key (domain, timestamp, tagged key)."""
    return len(record_key) >= 10 and record_key[:1] in (EVENT_TIME, PROCESSING_TIME) and \
        record_key[9:10] in (_STR, _INT, _BYTES, _OTHER)


def timer_key(record_key: bytes) -> Any:
    """The key a timer record key was registered for (what ``stores.<timers>.rescale.key
    = timer`` routes by: the input key of the rows that registered it)."""
    if not is_timer_record(record_key):
        raise InvalidValueError(f"{record_key!r} is not a timer record key (domain byte, 8-byte timestamp, key)")
    return _decode_key(record_key[9:])


def _timestamps(timestamps: Iterable[Any], what: str) -> list[int]:
    """Every timestamp checked as :func:`_timestamp` does, in C-level passes when all are
    plain ints in range (the batch path); otherwise one check each, naming the bad one."""
    stamps = timestamps if isinstance(timestamps, list) else list(timestamps)
    if stamps and set(map(type, stamps)) <= {int} and min(stamps) >= -_BIAS and max(stamps) < _BIAS:
        return stamps
    return [_timestamp(t, what) for t in stamps]


def check_timer_store(name: str, spec: Any) -> None:
    """Refuse a timers store that is not a key-value store, or whose layers would change
    the record bytes."""
    from .config import engine_kind
    from .registry import resolve_factory

    if engine_kind(resolve_factory(spec.factory, store=name)) == "other":
        raise ConfigError(
            f"store {name!r} keeps timers, so it must be a key-value store (memory, rocksdb, leveldb); "
            f"stores.{name}.factory = {spec.factory!r} is not"
        )
    if spec.key_serde != "bytes" or spec.msg_serde != "bytes" or spec.ttl is not None:
        raise ConfigError(
            f"store {name!r} keeps timers, so it needs stores.{name}.key.serde = bytes, "
            f"stores.{name}.msg.serde = bytes and no stores.{name}.ttl.*"
        )


def _timestamp(ts: Any, what: str) -> int:
    if isinstance(ts, int) and not isinstance(ts, bool):
        if -_BIAS <= ts < _BIAS:
            return ts
    elif hasattr(ts, "__index__") and not isinstance(ts, bool):  # numpy integers
        return _timestamp(int(ts), what)
    raise InvalidValueError(f"{what}: timestamp must be an int (ms), got {ts!r} ({type(ts).__name__})")


class Timers:
    """The timers of one domain (event or processing time) of one task.

    ``store`` is the task's timers store (``bytes`` serdes); ``now`` is the domain's
    clock in ms. Timer keys are anything the ``tuple`` serde encodes (``str``, ``int``,
    ``bytes``, ``float``, ``bool``, ``None``, tuples of those).
    """

    def __init__(self, store: KeyValueStore[bytes, bytes], domain: bytes, now: Callable[[], int]) -> None:
        if domain not in (EVENT_TIME, PROCESSING_TIME):
            raise ValueError(f"unknown timer domain {domain!r}")
        self.store = store
        self.domain = domain
        self.now = now
        self._registered_due = False
        self._current: int | None = None

    def _encode(self, key: Any, ts: int) -> bytes:
        try:
            return self.domain + (ts + _BIAS).to_bytes(8, "big") + _encode_key(key)
        except (TypeError, ValueError) as e:
            raise InvalidValueError(f"timer key {key!r} cannot be stored: {e}") from None

    def register(self, key: Any, ts: int) -> None:
        """Fire ``on_timer(key, ts)`` once the clock reaches ``ts`` (ms). Idempotent per
        ``(key, ts)``; a ``ts`` already passed fires at the next :meth:`fire`."""
        ts = _timestamp(ts, f"register({key!r}, {ts!r})")
        self.store.put(self._encode(key, ts), _MARK)
        if self._current is not None and ts <= self._current:
            self._registered_due = True

    def register_all(self, keys: Iterable[Any], timestamps: Iterable[int]) -> None:
        """:meth:`register` for pairs of ``keys`` and ``timestamps`` in one batch (one
        serde pass, one engine write batch, one changelog hand-over)."""
        keys, stamps = list(keys), _timestamps(timestamps, "register_all")
        if len(keys) != len(stamps):
            raise InvalidValueError(f"register_all: {len(keys)} keys but {len(stamps)} timestamps")
        if not keys:
            return
        # a dict: later duplicates of one (key, ts) collapse before any layer sees them
        self.store.put_all(dict.fromkeys(self._record_keys(keys, stamps), _MARK))
        if self._current is not None and min(stamps) <= self._current:
            self._registered_due = True

    def _record_keys(self, keys: list[Any], stamps: list[int]) -> list[bytes]:
        """The record keys of ``(key, ts)`` pairs, built in C-level passes."""
        biased = map(_BIAS.__add__, stamps)
        if all_of_type(keys, str):  # the head ends with the str tag: one concatenation per key
            heads = map(_HEAD_STR.pack, repeat(self.domain), biased, repeat(_STR))
            try:
                return list(map(bytes.__add__, heads, map(str.encode, keys)))
            except UnicodeEncodeError as e:  # a lone surrogate
                raise InvalidValueError(f"a timer key cannot be stored: {e}") from None
        try:
            encoded = [_encode_key(k) for k in keys]
        except (TypeError, ValueError) as e:
            raise InvalidValueError(f"a timer key cannot be stored: {e}") from None
        return list(map(bytes.__add__, map(_HEAD.pack, repeat(self.domain), biased), encoded))

    def delete(self, key: Any, ts: int) -> None:
        """Remove the timer ``(key, ts)``; not an error if there is none."""
        self.store.delete(self._encode(key, _timestamp(ts, f"delete({key!r}, {ts!r})")))

    def delete_all(self, keys: Iterable[Any], timestamps: Iterable[int]) -> None:
        """:meth:`delete` for pairs of ``keys`` and ``timestamps`` in one batch."""
        keys, stamps = list(keys), _timestamps(timestamps, "delete_all")
        if len(keys) != len(stamps):
            raise InvalidValueError(f"delete_all: {len(keys)} keys but {len(stamps)} timestamps")
        if keys:
            self.store.delete_all(self._record_keys(keys, stamps))

    def pending(self, up_to: int | None = None) -> list[tuple[Any, int]]:
        """``(key, ts)`` of the registered timers (with ``ts <= up_to``), in firing order."""
        stop = self._stop(up_to)
        with self.store.range_keys(self.domain, stop) as it:
            return list(map(_decode, it))

    def _stop(self, up_to: int | None) -> bytes:
        if up_to is None or up_to + 1 >= _BIAS:
            return bytes([self.domain[0] + 1])
        return self.domain + (max(up_to, -_BIAS - 1) + 1 + _BIAS).to_bytes(8, "big")

    def fire(self, on_timer: Callable[[Any, int], None], up_to: int | None = None) -> int:
        """Fire every timer with ``ts <= up_to`` (default: the clock now) in ``(ts, key)``
        order, deleting each before calling ``on_timer(key, ts)``; timers registered by
        ``on_timer`` that are already due fire in the same call. Returns the count."""
        up_to = self.now() if up_to is None else up_to
        stop = self._stop(up_to)
        fired = 0
        self._current = up_to
        start = self.domain
        try:
            while True:
                with self.store.range_keys(start, stop) as it:
                    due = it.take(_FETCH)
                if not due:
                    return fired
                self._registered_due = False
                for record_key in due:
                    self.store.delete(record_key)
                    key, ts = _decode(record_key)
                    on_timer(key, ts)
                    fired += 1
                    fault_point("timers.after_fire")
                    if self._registered_due:
                        break  # a new timer may sort before the rest: scan again from the start
                start = self.domain if self._registered_due else record_key + b"\x00"
        finally:
            self._current = None

    def fire_batch(self, on_timers: Callable[[list[Any], list[int]], None], up_to: int | None = None,
                   chunk: int = 65536) -> int:
        """The vectorised :meth:`fire`: hands due timers to ``on_timers(keys, timestamps)``
        in chunks (each chunk in ``(ts, key)`` order, deleted in one batch first). Timers
        that ``on_timers`` registers at or before ``up_to`` fire in a later chunk.

        Each chunk is one range scan that starts after the previous chunk's last timer
        (so it never walks the deletions of earlier chunks), or again at the start of
        the domain when ``on_timers`` registered a due timer (through this object, as
        ``context.timers`` is) that may sort before it. A due timer registered through
        another :class:`Timers` over the same store fires at the next call instead.
        """
        if type(chunk) is not int or chunk < 1:
            raise InvalidValueError(f"fire_batch: chunk must be an int >= 1, got {chunk!r}")
        up_to = self.now() if up_to is None else up_to
        stop = self._stop(up_to)
        fired = 0
        self._current = up_to
        start = self.domain
        try:
            while True:
                with self.store.range_keys(start, stop) as it:  # keys only: a timer's value is a mark
                    due = it.take(chunk)
                if not due:
                    return fired
                self.store.delete_all(due)
                stamps = list(map(_BIAS.__rsub__, map(_SECOND, map(_HEAD.unpack_from, due))))
                keys = _decode_keys(due)
                self._registered_due = False
                on_timers(keys, stamps)
                fired += len(due)
                fault_point("timers.after_fire")
                start = self.domain if self._registered_due else due[-1] + b"\x00"
        finally:
            self._current = None


def _decode(record_key: bytes) -> tuple[Any, int]:
    return _decode_key(record_key[9:]), int.from_bytes(record_key[1:9], "big") - _BIAS
