"""Windowed aggregation: tumbling, hopping, sliding and session windows over a task's store.

A :class:`WindowedAggregation` folds ``(key, event time, value)`` records into per-key
windows kept in one key-value store of the task (any ordered engine: memory, rocksdb,
leveldb), and hands out a window's result when the window *closes* (emit-on-close, Kafka
Streams' ``suppress(untilWindowCloses)`` / Flink's default trigger) or after every change
(emit-on-update). The window kinds follow Kafka Streams:

* :class:`Tumbling` ``(size)``: ``[start, start + size)`` with ``start`` a multiple of ``size``;
* :class:`Hopping` ``(size, hop)``: ``[start, start + size)`` with ``start`` a multiple of
  ``hop`` (``hop <= size``); a record belongs to every window that holds its time;
* :class:`Sliding` ``(size)``: Kafka's ``SlidingWindows.ofTimeDifference``, reduced to the
  windows that end at a record: for each distinct event time ``t`` of a key, the window
  ``[t - size, t]`` (both ends inclusive) over every record of that key in it;
* :class:`Session` ``(gap)``: a key's records closer than ``gap`` to each other form one
  session ``[first, last]`` (inclusive); a record that falls within ``gap`` of two
  sessions merges them.

Times are ints in the unit of the event-time column (epoch milliseconds by convention;
the page-views example uses seconds). A float, a bool or a missing time is an error.

**Event time, grace and closing.** The operator keeps its *stream time*, the largest
event time it was fed (Kafka Streams' observed stream time), and :meth:`~WindowedAggregation.close`
closes every window whose end plus ``grace`` (Flink's allowed lateness) is at or before
the watermark it is given — by default that stream time; a task passes
``context.watermark`` to close on its committed event-time clock instead
(:attr:`StreamTask.event_time_column` with ``watermark_delay_ms``). A window
``[s, e)`` closes when ``e + grace <= watermark``; a sliding window ``[s, t]`` when
``t + grace <= watermark``; a session ``[a, b]`` when ``b + gap + grace <= watermark``
(Kafka's session close time). A task calls ``close`` at every window/commit boundary
(:meth:`StreamTask.window`), so windows close at most one micro-batch late and the
closing is part of the same commit as its output.

**Late records.** A record whose window was already closed (its end + grace is at or
before the watermark of the last close) is dropped and counted in
:attr:`~WindowedAggregation.late_records` — one count per window it was refused from, as
Kafka Streams' dropped-records metric counts — and never merged into a closed window.
A record whose window is still open is never dropped, however far behind stream time.

**Store layout** (one store per operator; ``key.serde = tuple``, so keys sort by their
elements; ``CLOCK`` is ``-2**63``, below every window):

========================== ============================== ============================
store key                  value                          what
========================== ============================== ============================
``(CLOCK, "stream_time")`` int                            largest event time fed
``(CLOCK, "closed_at")``   int                            watermark of the last close
``(CLOCK, "shape")``       int                            CRC-32 of the window kind and aggregate
``(start, key)``           accumulator                    tumbling / hopping window
``(end, key, 0)``          0                              sliding: a window ends at ``end``
``(t + size, key, 1)``     0                              sliding: ``t``'s record can go
``("r", key, t)``          accumulator                    sliding: records of ``key`` at ``t``
``(closes_at, key, start)`` 0                             session: close index
``("s", key, start)``      ``[end, accumulator]``         session
========================== ============================== ============================

Int-first keys are time-ordered, so closing is one ordered range scan up to the
watermark; a key's sessions (or sliding records) are one range scan of its ``("s", key)``
(``("r", key)``) keys. The value serde holds the accumulators: ``long`` for
count/sum of ints, ``msgpack`` (or ``json``) for anything else and always for sliding
and session windows.

**The vectorised path.** :meth:`~WindowedAggregation.add_batch` takes an Arrow batch.
Tumbling and hopping windows with a built-in aggregate (:class:`Count`, :class:`Sum`,
:class:`Min`, :class:`Max`) over a store without object cache or TTL are folded in
Arrow: records are grouped per ``(window start, key)`` across batches and go to the
store once per key per commit interval through the columnar store access
(:meth:`TaskStorage.columns`); windows that open and close between two commits never
touch the store. Session windows fold a batch per key in memory (one read of the key's
sessions and one write batch); sliding windows fold a batch with one read and one write
batch, and close a key's windows from one scan of its records; user aggregates over
tumbling and hopping windows fold record by record. The results are the same either way.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import ConfigError, InvalidValueError
from .faults import fault_point

__all__ = [
    "Aggregator", "Aggregate", "Count", "Sum", "Min", "Max", "Reduce",
    "Windows", "Tumbling", "Hopping", "Sliding", "Session",
    "WindowedAggregation", "WindowResult", "CLOCK",
]

CLOCK = -(1 << 63)
"""The first element of the store keys that hold the operator's clock (below every window)."""
_MAX = (1 << 63) - 1
_STREAM_TIME = (CLOCK, "stream_time")
_CLOSED_AT = (CLOCK, "closed_at")
_SHAPE = (CLOCK, "shape")
_SESSION, _RECORDS = "s", "r"
_ENDS, _PURGE = 0, 1
PENDING_ROWS = 2_000_000
"""Window assignments folded in Arrow before they go to the store (bounds task memory)."""


def _ms(value: Any, what: str, *, minimum: int) -> int:
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int (in the event-time unit, e.g. ms), got {value!r} "
                          f"({type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value}")
    return value


# -- window kinds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Windows:
    """What all window kinds share: ``grace`` (keyword-only), how long after its end a
    window still takes records (Kafka's grace period, Flink's allowed lateness)."""

    grace: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        _ms(self.grace, f"{type(self).__name__}: grace", minimum=0)


@dataclass(frozen=True)
class Tumbling(Windows):
    """Fixed, non-overlapping windows ``[start, start + size)``, ``start`` a multiple of ``size``."""

    size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Tumbling: size", minimum=1)

    @property
    def hop(self) -> int:
        return self.size


@dataclass(frozen=True)
class Hopping(Windows):
    """Overlapping windows ``[start, start + size)``, ``start`` a multiple of ``hop``."""

    size: int
    hop: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Hopping: size", minimum=1)
        _ms(self.hop, "Hopping: hop", minimum=1)
        if self.hop > self.size:
            raise ConfigError(f"Hopping: hop ({self.hop}) must be <= size ({self.size}); a hop larger than "
                              "the window would leave gaps no window covers")


@dataclass(frozen=True)
class Sliding(Windows):
    """Per key, the window ``[t - size, t]`` ending at each distinct event time ``t``."""

    size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Sliding: size", minimum=1)


@dataclass(frozen=True)
class Session(Windows):
    """Per key, runs of records less than ``gap`` apart (``[first, last]``)."""

    gap: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.gap, "Session: gap", minimum=1)


# -- aggregates -----------------------------------------------------------------------------------
class Aggregator:
    """How a window folds its records: ``initial()`` → ``add(acc, value)`` per record,
    ``merge(a, b)`` (sessions that merge, sliding windows), ``result(acc)`` when emitted.
    The accumulator must fit the store's value serde. ``arrow`` names the Arrow
    ``group_by`` aggregation that computes the same fold (the vectorised path), or None."""

    arrow: str | None = None
    merges = True
    """Whether :meth:`merge` is defined (session and sliding windows need it)."""

    def initial(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no merge(); session and sliding windows need one")

    def result(self, acc: Any) -> Any:
        return acc


class Count(Aggregator):
    """The number of records (their values are ignored)."""

    arrow = "sum"  # of ones

    def initial(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b


class Sum(Aggregator):
    """The sum of the values (``None`` values are skipped)."""

    arrow = "sum"

    def initial(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc if value is None else acc + value

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class _Extreme(Aggregator):
    pick: Callable[[Any, Any], Any]

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        if value is None:
            return acc
        return value if acc is None else type(self).pick(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return self.add(a, b)


class Min(_Extreme):
    """The smallest value (``None`` values are skipped)."""

    arrow = "min"
    pick = min


class Max(_Extreme):
    """The largest value (``None`` values are skipped)."""

    arrow = "max"
    pick = max


class Reduce(Aggregator):
    """Kafka Streams' ``reduce``: the first value, then ``fn(acc, value)`` per record;
    ``fn`` also merges two sessions."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self.fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else self.fn(a, b)


class Aggregate(Aggregator):
    """Kafka Streams' ``aggregate(initializer, aggregator[, session merger])``: the
    accumulator starts as ``initializer()``, each record makes it ``adder(acc, value)``;
    ``merger(a, b)`` joins two (needed by session and sliding windows); ``result(acc)``
    turns it into the emitted value (default: the accumulator itself)."""

    def __init__(self, initializer: Callable[[], Any], adder: Callable[[Any, Any], Any],
                 merger: Callable[[Any, Any], Any] | None = None,
                 result: Callable[[Any], Any] | None = None) -> None:
        self.initializer, self.adder, self.merger, self.finish = initializer, adder, merger, result
        self.merges = merger is not None

    def initial(self) -> Any:
        return self.initializer()

    def add(self, acc: Any, value: Any) -> Any:
        return self.adder(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        if self.merger is None:
            return super().merge(a, b)
        return self.merger(a, b)

    def result(self, acc: Any) -> Any:
        return acc if self.finish is None else self.finish(acc)


class WindowResult(NamedTuple):
    """One window's result: its bounds (see the window kind for inclusive ends), key and value."""

    window_start: int
    window_end: int
    key: Any
    value: Any


def _time(ts: Any, key: Any) -> int:
    if type(ts) is int:
        return ts
    if ts is None:
        raise InvalidValueError(f"record with key {key!r} has no event time (None)")
    if hasattr(ts, "__index__") and not isinstance(ts, bool):  # numpy integers
        return int(ts)
    raise InvalidValueError(f"record with key {key!r}: event time must be an int, got {ts!r} ({type(ts).__name__})")


# -- the operator ---------------------------------------------------------------------------------
class WindowedAggregation:
    """Windows of kind ``windows`` folding records with ``aggregator``, kept in the task's
    store ``store`` (``key.serde = tuple``; see the module docstring for its layout).

    ``emit="close"`` (default): :meth:`close` returns each window once, final, when it
    closes; :meth:`add`/:meth:`add_batch` return nothing. ``emit="update"``: every
    change is returned by :meth:`add`/:meth:`add_batch` as it happens, and :meth:`close`
    only forgets closed windows (it returns them too, as the final values).
    """

    def __init__(self, storage: Any, store: str, windows: Windows, aggregator: Aggregator | None = None, *,
                 emit: str = "close") -> None:
        if not isinstance(windows, Windows):
            raise ConfigError(f"windows must be Tumbling(...), Hopping(...), Sliding(...) or Session(...), "
                              f"got {windows!r}")
        if emit not in ("close", "update"):
            raise ConfigError(f"emit must be 'close' or 'update', got {emit!r}")
        aggregator = Count() if aggregator is None else aggregator
        if not isinstance(aggregator, Aggregator):
            raise ConfigError(f"aggregator must be Count(), Sum(), Min(), Max(), Reduce(fn) or Aggregate(...), "
                              f"got {aggregator!r}")
        if isinstance(windows, (Sliding, Session)) and not aggregator.merges:
            raise ConfigError(f"{type(windows).__name__.lower()} windows merge accumulators, and the aggregate "
                              f"{type(aggregator).__name__} has no merge: give Aggregate(...) a merger")
        spec = storage.config.stores.get(store)
        if spec is None:
            raise ConfigError(f"windows are kept in the store {store!r}, which the config does not declare; add "
                              f"stores.{store}.factory = memory (or rocksdb), stores.{store}.key.serde = tuple")
        if spec.key_serde != "tuple":
            raise ConfigError(f"store {store!r} keeps windows, so it needs stores.{store}.key.serde = tuple "
                              f"(got {spec.key_serde!r})")
        if isinstance(windows, (Sliding, Session)) and spec.msg_serde not in ("msgpack", "json", "pickle"):
            raise ConfigError(f"store {store!r} keeps {type(windows).__name__.lower()} windows, which store lists "
                              f"and accumulators: it needs stores.{store}.msg.serde = msgpack (got "
                              f"{spec.msg_serde!r})")
        self.name = store
        self.windows = windows
        self.aggregator = aggregator
        self.emit = emit
        self.store = storage.store(store)
        self.columns: Any = None
        self._vectorised = (isinstance(windows, (Tumbling, Hopping)) and aggregator.arrow is not None
                            and spec.object_cache_size == 0 and spec.ttl is None)
        if self._vectorised:
            self.columns = storage.columns(store)
        clock = self.store.get_all([_STREAM_TIME, _CLOSED_AT, _SHAPE])
        shape = zlib.crc32(f"{windows!r} {type(aggregator).__name__}".encode())
        if clock.get(_SHAPE, shape) != shape:
            raise ConfigError(f"store {store!r} holds windows written with other window or aggregate settings "
                              f"than {windows!r} with {type(aggregator).__name__}(); its windows would be read "
                              "wrongly. Declare the windows it was written with, or keep the new ones in a new "
                              "store (nothing was changed)")
        self._shape = shape
        self.stream_time: int | None = clock.get(_STREAM_TIME)
        """The largest event time fed so far (committed with the windows)."""
        self.closed_at: int | None = clock.get(_CLOSED_AT)
        """The watermark of the last :meth:`close` (a record whose window ends, plus grace,
        at or before it is late)."""
        self._metrics = storage.metrics(store)
        self.late_records = 0
        """Record-window pairs dropped since this operator was built because the window had closed
        (also counted in the store's ``late_records`` metric, ``localstate_window_late_records_total``)."""
        self._pending: list[Any] = []
        self._pending_rows = 0

    # -- feeding --------------------------------------------------------------------------------
    def add(self, key: Any, ts: int, value: Any = None) -> list[WindowResult]:
        """Fold one record into its windows. Returns the updated windows with
        ``emit="update"``, else ``[]``."""
        ts = _time(ts, key)
        self._apply_pending()
        w = self.windows
        if isinstance(w, Session):
            out = self._add_session(key, ts, value)
        elif isinstance(w, Sliding):
            out = self._add_sliding(key, ts, value)
        else:
            out = self._add_timed(key, ts, value)
        if self.stream_time is None or ts > self.stream_time:
            self.stream_time = ts
        return out if self.emit == "update" else []

    def add_batch(self, batch: Any, *, key: str, time: str, value: str | None = None) -> Any:
        """Fold the rows of an Arrow batch (columns ``key``, ``time`` — int or timestamp,
        no nulls — and ``value`` unless counting). Returns the windows the batch changed,
        each once with its value after the batch, as an Arrow table (columns
        ``window_start``, ``window_end``, ``key``, ``value``) with ``emit="update"``, else None."""
        import pyarrow as pa

        nothing = _table([]) if self.emit == "update" else None
        if batch.num_rows == 0:
            return nothing
        times = self._time_column(batch, time)
        keys = self._column(batch, key, "key")
        values = self._column(batch, value, "value") if value is not None else None
        if not self._vectorised:
            records = zip(keys.to_pylist(), times.tolist(),
                          values.to_pylist() if values is not None else [None] * len(times))
            self._apply_pending()
            if isinstance(self.windows, Session):
                changed = self._add_sessions(records)
            elif isinstance(self.windows, Sliding):
                changed = self._add_sliding_records(records)
            else:  # each changed window once, with its value after the batch
                last = {(r.window_start, r.window_end, r.key): r for k, t, v in records for r in self.add(k, t, v)}
                changed = list(last.values())
            latest = int(times.max())
            if self.stream_time is None or latest > self.stream_time:
                self.stream_time = latest
            return _table(changed) if self.emit == "update" else None
        import numpy as np
        import pyarrow.compute as pc

        w = self.windows
        size, hop = w.size, w.hop  # type: ignore[attr-defined]
        if values is None or isinstance(self.aggregator, Count):
            values = pa.array(np.ones(len(times), np.int64))
        base = times - times % hop
        if hop == size:
            starts, take = base, None
        else:
            parts, takes = [], []
            index = np.arange(len(times))
            for i in range(-(-size // hop)):
                s = base - i * hop
                keep = s + size > times
                parts.append(s[keep])
                takes.append(index[keep])
            starts, take = np.concatenate(parts), np.concatenate(takes)
        if self.closed_at is not None:
            fresh = starts + size + w.grace > self.closed_at
            late = len(fresh) - int(fresh.sum())
            if late:
                self._dropped(late)
                starts = starts[fresh]
                take = np.flatnonzero(fresh) if take is None else take[fresh]
        if take is not None:
            index = pa.array(take)
            keys, values = keys.take(index), values.take(index)
        latest = int(times.max())
        if self.stream_time is None or latest > self.stream_time:
            self.stream_time = latest
        if len(starts) == 0:
            return nothing
        self._pending.append(pa.table({"w": starts, "k": keys, "v": values}))
        self._pending_rows += len(starts)
        if self.emit == "update":
            changed = self._take_pending()
            assert changed is not None
            stored = self._add_to_store(changed)
            return pa.table({"window_start": stored.column("w"), "window_end": pc.add(stored.column("w"), size),
                             "key": stored.column("k"), "value": stored.column("v")})
        if self._pending_rows >= PENDING_ROWS:
            self._apply_pending()
        return None

    def _time_column(self, batch: Any, name: str) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        column = self._column(batch, name, "time")
        if column.null_count:
            raise InvalidValueError(f"windows of store {self.name!r}: {column.null_count} record(s) have no event "
                                    f"time (null in column {name!r})")
        if pa.types.is_timestamp(column.type):
            column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
        elif not pa.types.is_integer(column.type):
            raise InvalidValueError(f"windows of store {self.name!r}: the event-time column {name!r} has type "
                                    f"{column.type}; use a timestamp or an integer column")
        import numpy as np

        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)

    def _column(self, batch: Any, name: str, what: str) -> Any:
        try:
            return batch.column(name)
        except KeyError:
            raise InvalidValueError(f"windows of store {self.name!r}: the {what} column {name!r} is not an input "
                                    f"column (columns: {', '.join(batch.schema.names)})") from None

    # -- tumbling / hopping, record at a time -------------------------------------------------------
    def _starts(self, ts: int) -> list[int]:
        w = self.windows
        size, hop = w.size, w.hop  # type: ignore[attr-defined]
        first = ts - ts % hop
        return [s for s in range(first, ts - size, -hop)]

    def _dropped(self, n: int) -> None:
        self.late_records += n
        self._metrics.late_records += n

    def _late(self, end: int) -> bool:
        """Whether a window ending at ``end`` (the close time's base) was closed already."""
        return self.closed_at is not None and end + self.windows.grace <= self.closed_at

    def _add_timed(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        size = self.windows.size  # type: ignore[attr-defined]
        agg, store = self.aggregator, self.store
        out = []
        for start in self._starts(ts):
            if self._late(start + size):
                self._dropped(1)
                continue
            k = (start, key)
            acc = store.get(k)
            acc = agg.add(agg.initial() if acc is None else acc, value)
            store.put(k, acc)
            out.append(WindowResult(start, start + size, key, agg.result(acc)))
        return out

    # -- vectorised tumbling / hopping ------------------------------------------------------------
    def _take_pending(self) -> Any:
        if not self._pending:
            return None
        import pyarrow as pa

        fn = self.aggregator.arrow
        grouped = pa.concat_tables(self._pending).group_by(["w", "k"], use_threads=False).aggregate([("v", fn)])
        self._pending = []
        self._pending_rows = 0
        return pa.table({"w": grouped.column("w"), "k": grouped.column("k"), "v": grouped.column(f"v_{fn}")})

    def _combine(self, pending: Any, stored: Any) -> Any:
        import pyarrow.compute as pc

        fn = self.aggregator.arrow
        if fn == "sum":
            return pc.add(pending, pc.fill_null(stored, 0))
        if fn == "min":
            return pc.min_element_wise(pending, stored)
        return pc.max_element_wise(pending, stored)

    def _add_to_store(self, counts: Any) -> Any:
        """Fold ``counts`` (distinct ``(w, k)``) into the store, a column at a time; returns
        the folded values (columns ``w``, ``k``, ``v``). A window the store holds no key
        of needs no lookup: one ordered probe per distinct window tells."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if counts.num_rows == 0:
            return counts
        windows = pc.unique(counts.column("w"))
        held = pa.array([w for w in windows.to_pylist() if self._holds_window(w)], pa.int64())
        if len(held) == len(windows):
            parts = [(counts, True)]
        else:
            in_held = pc.is_in(counts.column("w"), held)
            parts = [(counts.filter(pc.invert(in_held)), False), (counts.filter(in_held), True)]
        out = []
        for part, look_up in parts:
            if part.num_rows == 0:
                continue
            keys = self.columns.encode_keys([part.column("w"), part.column("k")])
            folded = part.column("v").combine_chunks()
            if look_up:
                (stored,) = self.columns.get_all(keys)
                folded = self._combine(folded, stored)
            self.columns.put_all(keys, [folded])
            out.append(pa.table({"w": part.column("w"), "k": part.column("k"), "v": folded}))
        return out[0] if len(out) == 1 else pa.concat_tables(out, promote_options="permissive")

    def _holds_window(self, start: int) -> bool:
        with self.store.range_keys((start,), (start + 1,)) as keys:
            return next(keys, None) is not None

    def _apply_pending(self) -> None:
        pending = self._take_pending()
        if pending is not None:
            self._add_to_store(pending)

    # -- sliding ------------------------------------------------------------------------------------
    def _add_sliding(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        if self._late(ts):
            self._dropped(1)
            return []
        agg, store, size = self.aggregator, self.store, self.windows.size  # type: ignore[attr-defined]
        k = (_RECORDS, key, ts)
        acc = store.get(k)
        store.put_all([(k, agg.add(agg.initial() if acc is None else acc, value)),
                       ((ts, key, _ENDS), 0), ((ts + size, key, _PURGE), 0)])
        if self.emit != "update":
            return []
        with store.range_keys((_RECORDS, key, ts), (_RECORDS, key, ts + size + 1)) as ends:
            return [self._sliding_window(key, end) for _, _, end in ends]

    def _sliding_window(self, key: Any, end: int) -> WindowResult:
        return self._sliding_windows(key, [end])[0]

    def _sliding_windows(self, key: Any, ends: list[int]) -> list[WindowResult]:
        """The windows of ``key`` ending at each of ``ends`` (ascending), folded from one
        range scan of the key's records."""
        agg, size = self.aggregator, self.windows.size  # type: ignore[attr-defined]
        with self.store.range((_RECORDS, key, ends[0] - size), (_RECORDS, key, ends[-1] + 1)) as records:
            parts = [(k[2], part) for k, part in records]
        times = [t for t, _ in parts]
        out = []
        for end in ends:
            acc = None
            for _, part in parts[bisect_left(times, end - size):bisect_right(times, end)]:
                acc = part if acc is None else agg.merge(acc, part)
            out.append(WindowResult(end - size, end, key, agg.result(acc)))
        return out

    def _add_sliding_records(self, records: Iterable[tuple[Any, int, Any]]) -> list[WindowResult]:
        """:meth:`_add_sliding` for many records: one ``get_all`` and one ``put_all`` for the
        batch. Returns the windows the records changed, each once, as they stand after them."""
        agg, store, size = self.aggregator, self.store, self.windows.size  # type: ignore[attr-defined]
        folded: dict[tuple[Any, int], list[Any]] = {}
        for k, t, v in records:
            t = _time(t, k)
            if self._late(t):
                self._dropped(1)
            else:
                folded.setdefault((k, t), []).append(v)
        if not folded:
            return []
        have = store.get_all([(_RECORDS, k, t) for k, t in folded])
        puts: list[tuple[Any, Any]] = []
        for (k, t), values in folded.items():
            acc = have.get((_RECORDS, k, t))
            acc = agg.initial() if acc is None else acc
            for v in values:
                acc = agg.add(acc, v)
            puts += [((_RECORDS, k, t), acc), ((t, k, _ENDS), 0), ((t + size, k, _PURGE), 0)]
        store.put_all(puts)
        if self.emit != "update":
            return []
        by_key: dict[Any, list[int]] = {}
        for k, t in folded:
            by_key.setdefault(k, []).append(t)
        out = []
        for k, stamps in by_key.items():
            stamps.sort()
            with store.range_keys((_RECORDS, k, stamps[0]), (_RECORDS, k, stamps[-1] + size + 1)) as it:
                ends = [e for _, _, e in it]
            # a window [e - size, e] changed when it holds one of the records' times
            ends = [e for e in ends if bisect_right(stamps, e) > bisect_left(stamps, e - size)]
            out += self._sliding_windows(k, ends)
        return out

    # -- sessions -----------------------------------------------------------------------------------
    def _add_session(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        agg, store, w = self.aggregator, self.store, self.windows
        gap = w.gap  # type: ignore[attr-defined]
        start, end, acc = ts, ts, agg.add(agg.initial(), value)
        merged = []
        with store.range((_SESSION, key, CLOCK), (_SESSION, key, _MAX)) as sessions:
            for (_, _, s), (e, a) in sessions:
                if s - gap <= ts <= e + gap:
                    merged.append((s, e))
                    start, end, acc = min(start, s), max(end, e), agg.merge(a, acc)
        if self._late(end + gap):
            self._dropped(1)
            return []
        if merged:
            store.delete_all([k for s, e in merged for k in ((_SESSION, key, s), (e + gap + w.grace, key, s))])
        store.put_all([((_SESSION, key, start), [end, acc]), ((end + gap + w.grace, key, start), 0)])
        return [WindowResult(start, end, key, agg.result(acc))]

    def _add_sessions(self, records: Iterable[tuple[Any, int, Any]]) -> list[WindowResult]:
        """:meth:`_add_session` for many records: each key's sessions are read once, its
        records applied in arrival order in memory, and the changes written in one batch.
        Returns the sessions the records changed, each once, as they stand after them."""
        agg, store, w = self.aggregator, self.store, self.windows
        gap, grace = w.gap, w.grace  # type: ignore[attr-defined]
        by_key: dict[Any, list[tuple[int, Any]]] = {}
        for k, t, v in records:
            by_key.setdefault(k, []).append((_time(t, k), v))
        deletes: list[Any] = []
        puts: list[tuple[Any, Any]] = []
        changed: list[WindowResult] = []
        for key, items in by_key.items():
            with store.range((_SESSION, key, CLOCK), (_SESSION, key, _MAX)) as stored:
                before = {s: (e, a) for (_, _, s), (e, a) in stored}
            sessions = dict(before)
            touched: set[int] = set()
            for ts, value in items:
                start, end, acc = ts, ts, agg.add(agg.initial(), value)
                merged = [s for s, (e, _) in sessions.items() if s - gap <= ts <= e + gap]
                for s in merged:
                    e, a = sessions[s]
                    start, end, acc = min(start, s), max(end, e), agg.merge(a, acc)
                if self._late(end + gap):
                    self._dropped(1)
                    continue
                for s in merged:
                    del sessions[s]
                    touched.discard(s)
                sessions[start] = (end, acc)
                touched.add(start)
            for s, (e, a) in before.items():
                if sessions.get(s) != (e, a):
                    deletes += [(_SESSION, key, s), (e + gap + grace, key, s)]
            for s in sorted(touched):
                e, a = sessions[s]
                puts += [((_SESSION, key, s), [e, a]), ((e + gap + grace, key, s), 0)]
                changed.append(WindowResult(s, e, key, agg.result(a)))
        if deletes:
            store.delete_all(deletes)
        if puts:
            store.put_all(puts)
        return changed

    # -- closing ------------------------------------------------------------------------------------
    def close(self, watermark: int | None = None) -> Any:
        """Close every window whose end + grace is at or before ``watermark`` (default:
        the stream time): return them as an Arrow table (``window_start``, ``window_end``,
        ``key``, ``value``; sorted by start, key, end), delete them from the store, and
        write the operator's clock. Call at every commit boundary: it also moves the
        records folded in Arrow into the store."""
        import pyarrow.compute as pc

        if watermark is None:
            watermark = self.stream_time
        elif type(watermark) is not int:
            raise InvalidValueError(f"close: the watermark must be an int, got {watermark!r}")
        out: Any = None
        if watermark is not None and (self.closed_at is None or watermark > self.closed_at):
            if self._vectorised:
                if self.closed_at is not None and self._last_start(watermark) == self._last_start(self.closed_at):
                    self._apply_pending()  # no window start became closable: nothing to scan
                else:
                    out = self._close_vectorised(watermark)
            else:
                self._apply_pending()
                w = self.windows
                if isinstance(w, Session):
                    rows = self._close_sessions(watermark)
                elif isinstance(w, Sliding):
                    rows = self._close_sliding(watermark)
                else:
                    rows = self._close_timed(watermark)
                out = _table(rows)
            self.closed_at = watermark
            fault_point("windows.after_close")
        else:
            self._apply_pending()
        clock = [(_CLOSED_AT, self.closed_at), (_STREAM_TIME, self.stream_time), (_SHAPE, self._shape)]
        self.store.put_all([(k, v) for k, v in clock if v is not None])
        if out is None or out.num_rows == 0:
            return _table([]) if out is None else out
        order = [("window_start", "ascending"), ("key", "ascending")]
        if isinstance(self.windows, Session):  # the only kind where a start and key hold two windows
            order.append(("window_end", "ascending"))
        return out.take(pc.sort_indices(out, order))

    def _last_start(self, watermark: int) -> int:
        """The latest tumbling/hopping window start that is closed at ``watermark``.
        Windows that start at or before it had to be closed by then: a record for one
        of them arriving later is late."""
        w = self.windows
        x = watermark - w.grace - w.size  # type: ignore[attr-defined]
        return x - x % w.hop  # type: ignore[attr-defined]

    def _close_timed(self, watermark: int) -> list[WindowResult]:
        size, agg = self.windows.size, self.aggregator  # type: ignore[attr-defined]
        bound = watermark - self.windows.grace - size + 1
        with self.store.range((CLOCK + 1,), (bound,)) as closed:
            items = list(closed)
        self.store.delete_all([k for k, _ in items])
        return [WindowResult(s, s + size, key, agg.result(acc)) for (s, key), acc in items]

    def _close_vectorised(self, watermark: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        size = self.windows.size  # type: ignore[attr-defined]
        bound = watermark - self.windows.grace - size + 1
        pending = self._take_pending()
        closing = []
        if pending is not None:
            closes = pc.less(pending.column("w"), bound)
            self._add_to_store(pending.filter(pc.invert(closes)))
            closing.append(pending.filter(closes))
        closed_keys = []
        with self.columns.range((CLOCK + 1,), (bound,)) as chunks:
            for chunk in chunks:
                (w, k), (v,) = chunk.key_columns, chunk.value_columns
                closing.append(pa.table({"w": w, "k": k, "v": v}))
                closed_keys.append(chunk.keys)
        for keys in closed_keys:  # after the scan: it reads one snapshot either way
            self.columns.delete_all(keys)
        closing = [t for t in closing if t.num_rows]
        if not closing:
            return None
        if len(closing) == 1:
            out = closing[0]
        else:  # a window both in the store and pending: fold the two
            fn = self.aggregator.arrow
            grouped = (pa.concat_tables(closing, promote_options="permissive")
                       .group_by(["w", "k"], use_threads=False).aggregate([("v", fn)]))
            out = pa.table({"w": grouped.column("w"), "k": grouped.column("k"), "v": grouped.column(f"v_{fn}")})
        w = out.column("w").combine_chunks()
        return pa.table({"window_start": w, "window_end": pc.add(w, size), "key": out.column("k").combine_chunks(),
                         "value": out.column("v").combine_chunks()})

    def _close_sliding(self, watermark: int) -> list[WindowResult]:
        bound = watermark - self.windows.grace + 1
        with self.store.range_keys((CLOCK + 1,), (bound,)) as closed:
            index = list(closed)
        ends: dict[Any, list[int]] = {}
        for end, key, kind in index:
            if kind == _ENDS:
                ends.setdefault(key, []).append(end)
        rows = [r for key, stamps in ends.items() for r in self._sliding_windows(key, stamps)]
        size = self.windows.size  # type: ignore[attr-defined]
        purged = [(_RECORDS, key, t - size) for t, key, kind in index if kind == _PURGE]
        self.store.delete_all(index + purged)
        return rows

    def _close_sessions(self, watermark: int) -> list[WindowResult]:
        with self.store.range_keys((CLOCK + 1,), (watermark + 1,)) as closed:
            index = list(closed)
        keys = [(_SESSION, key, start) for _, key, start in index]
        sessions = self.store.get_all(keys)
        agg = self.aggregator
        rows = []
        for k in keys:
            end, acc = sessions[k]
            rows.append(WindowResult(k[2], end, k[1], agg.result(acc)))
        self.store.delete_all(index + keys)
        return rows

    def flush(self) -> None:
        """Move the records folded in Arrow into the store (``close`` does this too)."""
        self._apply_pending()


def _table(rows: Iterable[WindowResult]) -> Any:
    import pyarrow as pa

    rows = list(rows)
    if not rows:
        return pa.table({"window_start": pa.array([], pa.int64()), "window_end": pa.array([], pa.int64()),
                         "key": pa.array([], pa.null()), "value": pa.array([], pa.null())})
    starts, ends, keys, values = zip(*rows)
    return pa.table({"window_start": pa.array(starts, pa.int64()), "window_end": pa.array(ends, pa.int64()),
                     "key": pa.array(keys), "value": pa.array(values)})
