"""Windowed aggregation: tumbling, hopping, sliding and session windows over a task's store.

A :class:`WindowedAggregation` folds ``(key, event time, value)`` records into per-key
windows kept in one key-value store of the task (any ordered engine: memory, rocksdb,
leveldb), and hands out a window's result when the window *closes* (emit-on-close, Kafka
Streams' ``suppress(untilWindowCloses)`` / Flink's default trigger) or after every change
(emit-on-update). The window kinds and aggregates are :mod:`localstate.windows_kinds`;
how each kind is kept in the store, :mod:`localstate.windows_store` (record by record)
and :mod:`localstate.windows_arrow` (tumbling and hopping with a built-in aggregate,
folded in Arrow). Times are ints in the unit of the event-time column (epoch
milliseconds by convention); a float, a bool or a missing time is an error.

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
The store layout is drawn in docs/windows.md.
"""

from __future__ import annotations

import zlib
from typing import Any

from .errors import ConfigError, InvalidValueError
from .faults import fault_point
from .windows_arrow import PENDING_ROWS, ArrowFold
from .windows_kinds import (
    Aggregate,
    Aggregator,
    Count,
    Hopping,
    Max,
    Min,
    Reduce,
    Session,
    Sliding,
    Sum,
    Tumbling,
    Windows,
)
from .windows_store import (
    CLOCK,
    Lateness,
    SessionFold,
    SlidingFold,
    TimedFold,
    WindowFold,
    WindowResult,
    event_time,
    result_table,
)

__all__ = [
    "Aggregator", "Aggregate", "Count", "Sum", "Min", "Max", "Reduce",
    "Windows", "Tumbling", "Hopping", "Sliding", "Session",
    "WindowedAggregation", "WindowResult", "CLOCK", "PENDING_ROWS",
]

_STREAM_TIME = (CLOCK, "stream_time")
_CLOSED_AT = (CLOCK, "closed_at")
_SHAPE = (CLOCK, "shape")


class WindowedAggregation:
    """Windows of kind ``windows`` folding records with ``aggregator``, kept in the task's
    store ``store`` (``key.serde = tuple``; docs/windows.md draws its layout).

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
        self._lateness = Lateness(windows.grace, clock.get(_CLOSED_AT), storage.metrics(store))
        updates = emit == "update"
        self._arrow: ArrowFold | None = None
        self._fold: WindowFold
        if isinstance(windows, Session):
            self._fold = SessionFold(self.store, windows, aggregator, self._lateness, updates=updates)
        elif isinstance(windows, Sliding):
            self._fold = SlidingFold(self.store, windows, aggregator, self._lateness, updates=updates)
        elif aggregator.arrow is not None and spec.object_cache_size == 0 and spec.ttl is None:
            self._fold = self._arrow = ArrowFold(self.store, storage.columns(store), windows, aggregator,
                                                 self._lateness, updates=updates, memo=getattr(storage, "memo", None), name=store)
        else:
            self._fold = TimedFold(self.store, windows, aggregator, self._lateness, updates=updates)

    @property
    def closed_at(self) -> int | None:
        """The watermark of the last :meth:`close` (a record whose window ends, plus grace,
        at or before it is late)."""
        return self._lateness.closed_at

    @closed_at.setter
    def closed_at(self, value: int | None) -> None:
        self._lateness.closed_at = value

    @property
    def late_records(self) -> int:
        """Record-window pairs dropped since this operator was built because the window had closed
        (also counted in the store's ``late_records`` metric, ``localstate_window_late_records_total``)."""
        return self._lateness.late_records

    @late_records.setter
    def late_records(self, value: int) -> None:
        self._lateness.late_records = value

    @property
    def columns(self) -> Any:
        """The store's columnar access when windows are folded in Arrow, else None."""
        return None if self._arrow is None else self._arrow.columns

    # -- feeding --------------------------------------------------------------------------------
    def add(self, key: Any, ts: int, value: Any = None) -> list[WindowResult]:
        """Fold one record into its windows. Returns the updated windows with
        ``emit="update"``, else ``[]``."""
        ts = event_time(ts, key)
        out = self._fold.add(key, ts, value)
        if self.stream_time is None or ts > self.stream_time:
            self.stream_time = ts
        return out if self.emit == "update" else []

    def add_batch(self, batch: Any, *, key: str, time: str, value: str | None = None) -> Any:
        """Fold the rows of an Arrow batch (columns ``key``, ``time`` — int or timestamp,
        no nulls — and ``value`` unless counting). Returns the windows the batch changed,
        each once with its value after the batch, as an Arrow table (columns
        ``window_start``, ``window_end``, ``key``, ``value``) with ``emit="update"``, else None."""
        nothing = result_table([]) if self.emit == "update" else None
        if batch.num_rows == 0:
            return nothing
        times = self._time_column(batch, time)
        keys = self._column(batch, key, "key")
        values = self._column(batch, value, "value") if value is not None else None
        if self._arrow is None:
            records = zip(keys.to_pylist(), times.tolist(),
                          values.to_pylist() if values is not None else [None] * len(times))
            changed = self._fold.add_records(records)
            out = result_table(changed) if self.emit == "update" else None
        else:
            out = self._arrow.add_batch(times, keys, values)
        latest = int(times.max())
        if self.stream_time is None or latest > self.stream_time:
            self.stream_time = latest
        return nothing if out is None else out

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
            out = self._fold.close(watermark)
            self.closed_at = watermark
            fault_point("windows.after_close")
        else:
            self._fold.flush()
        clock = [(_CLOSED_AT, self.closed_at), (_STREAM_TIME, self.stream_time), (_SHAPE, self._shape)]
        self.store.put_all([(k, v) for k, v in clock if v is not None])
        if out is None or out.num_rows == 0:
            return result_table([]) if out is None else out
        order = [("window_start", "ascending"), ("key", "ascending")]
        if isinstance(self.windows, Session):  # the only kind where a start and key hold two windows
            order.append(("window_end", "ascending"))
        return out.take(pc.sort_indices(out, order))

    def flush(self) -> None:
        """Move the records folded in Arrow into the store (``close`` does this too)."""
        self._fold.flush()
