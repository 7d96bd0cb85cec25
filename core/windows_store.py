"""How windows are kept in their store, record by record (:mod:`localstate.windows`):
the store keys of each window kind, the windows a record lands in, and closing them.
docs/windows.md draws the store layout; the vectorised tumbling/hopping path is
:mod:`localstate.windows_arrow`."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import Any, NamedTuple

from .errors import InvalidValueError
from .metrics import StoreMetrics
from .windows_kinds import Aggregator, Windows

__all__ = ["CLOCK", "WindowResult", "Lateness", "WindowFold", "TimedFold", "SlidingFold", "SessionFold",
           "event_time", "result_table"]

CLOCK = -(1 << 63)
"""The first element of the store keys that hold the operator's clock (below every window)."""
_MAX = (1 << 63) - 1
_SESSION, _RECORDS = "s", "r"
_ENDS, _PURGE = 0, 1


class WindowResult(NamedTuple):
    """One window's result: its bounds (see the window kind for inclusive ends), key and value."""

    window_start: int
    window_end: int
    key: Any
    value: Any


def event_time(ts: Any, key: Any) -> int:
    """A record's event time as an int; :class:`InvalidValueError` naming the key when it is none."""
    if type(ts) is int:
        return ts
    if ts is None:
        raise InvalidValueError(f"record with key {key!r} has no event time (None)")
    if hasattr(ts, "__index__") and not isinstance(ts, bool):  # numpy integers
        return int(ts)
    raise InvalidValueError(f"record with key {key!r}: event time must be an int, got {ts!r} ({type(ts).__name__})")


def result_table(rows: Iterable[WindowResult]) -> Any:
    """Window results as an Arrow table (``window_start``, ``window_end``, ``key``, ``value``)."""
    import pyarrow as pa

    rows = list(rows)
    if not rows:
        return pa.table({"window_start": pa.array([], pa.int64()), "window_end": pa.array([], pa.int64()),
                         "key": pa.array([], pa.null()), "value": pa.array([], pa.null())})
    starts, ends, keys, values = zip(*rows)
    return pa.table({"window_start": pa.array(starts, pa.int64()), "window_end": pa.array(ends, pa.int64()),
                     "key": pa.array(keys), "value": pa.array(values)})


class Lateness:
    """Which windows closed already: ``closed_at`` is the watermark of the last close (a
    window whose end plus ``grace`` is at or before it takes no more records), and the
    records refused for that are counted here and in the store's metrics."""

    def __init__(self, grace: int, closed_at: int | None, metrics: StoreMetrics) -> None:
        self.grace = grace
        self.closed_at = closed_at
        self.late_records = 0
        self._metrics = metrics

    def late(self, end: int) -> bool:
        """Whether a window ending at ``end`` (the close time's base) was closed already."""
        return self.closed_at is not None and end + self.grace <= self.closed_at

    def dropped(self, n: int) -> None:
        self.late_records += n
        self._metrics.late_records += n


class WindowFold:
    """The windows of one kind in ``store``: :meth:`add` folds a record, :meth:`add_records`
    many (each changed window returned once, as it stands after them), :meth:`close`
    removes and returns the windows closed at a watermark. ``updates``: the caller wants
    the changed windows (emit-on-update); without, :meth:`add_records` may skip them."""

    def __init__(self, store: Any, windows: Windows, aggregator: Aggregator, lateness: Lateness, *,
                 updates: bool) -> None:
        self.store = store
        self.windows = windows
        self.aggregator = aggregator
        self.lateness = lateness
        self.updates = updates

    def add(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        raise NotImplementedError

    def add_records(self, records: Iterable[tuple[Any, Any, Any]]) -> list[WindowResult]:
        """``(key, time, value)`` records folded in order."""
        last = {(r.window_start, r.window_end, r.key): r for k, t, v in records
                for r in self.add(k, event_time(t, k), v)}
        return list(last.values())

    def close(self, watermark: int) -> Any:
        """The windows closed at ``watermark``, removed from the store, as an Arrow table
        (None: none)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Move what is folded in memory into the store (nothing for a record-by-record fold)."""


class TimedFold(WindowFold):
    """Tumbling and hopping windows: ``(start, key) -> accumulator``."""

    def _starts(self, ts: int) -> list[int]:
        w = self.windows
        size, hop = w.size, w.hop  # type: ignore[attr-defined]
        first = ts - ts % hop
        return [s for s in range(first, ts - size, -hop)]

    def add(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        size = self.windows.size  # type: ignore[attr-defined]
        agg, store = self.aggregator, self.store
        out = []
        for start in self._starts(ts):
            if self.lateness.late(start + size):
                self.lateness.dropped(1)
                continue
            k = (start, key)
            acc = store.get(k)
            acc = agg.add(agg.initial() if acc is None else acc, value)
            store.put(k, acc)
            out.append(WindowResult(start, start + size, key, agg.result(acc)))
        return out

    def close(self, watermark: int) -> Any:
        size, agg = self.windows.size, self.aggregator  # type: ignore[attr-defined]
        bound = watermark - self.windows.grace - size + 1
        with self.store.range((CLOCK + 1,), (bound,)) as closed:
            items = list(closed)
        self.store.delete_all([k for k, _ in items])
        return result_table(WindowResult(s, s + size, key, agg.result(acc)) for (s, key), acc in items)

class SlidingFold(WindowFold):
    """Sliding windows: ``("r", key, t) -> accumulator`` of the records at ``t``, and the
    index ``(t, key, 0)`` (a window ends at ``t``) and ``(t + size, key, 1)`` (``t``'s
    records can go)."""

    def add(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        if self.lateness.late(ts):
            self.lateness.dropped(1)
            return []
        agg, store, size = self.aggregator, self.store, self.windows.size  # type: ignore[attr-defined]
        k = (_RECORDS, key, ts)
        acc = store.get(k)
        store.put_all([(k, agg.add(agg.initial() if acc is None else acc, value)),
                       ((ts, key, _ENDS), 0), ((ts + size, key, _PURGE), 0)])
        if not self.updates:
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

    def add_records(self, records: Iterable[tuple[Any, Any, Any]]) -> list[WindowResult]:
        """:meth:`add` for many records: one ``get_all`` and one ``put_all`` for the
        batch. Returns the windows the records changed, each once, as they stand after them."""
        agg, store, size = self.aggregator, self.store, self.windows.size  # type: ignore[attr-defined]
        folded: dict[tuple[Any, int], list[Any]] = {}
        for k, t, v in records:
            t = event_time(t, k)
            if self.lateness.late(t):
                self.lateness.dropped(1)
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
        if not self.updates:
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

    def close(self, watermark: int) -> Any:
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
        return result_table(rows)

class SessionFold(WindowFold):
    """Session windows: ``("s", key, start) -> [end, accumulator]`` and the close index
    ``(closes_at, key, start)``."""

    def add(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        agg, store, w = self.aggregator, self.store, self.windows
        gap = w.gap  # type: ignore[attr-defined]
        start, end, acc = ts, ts, agg.add(agg.initial(), value)
        merged = []
        with store.range((_SESSION, key, CLOCK), (_SESSION, key, _MAX)) as sessions:
            for (_, _, s), (e, a) in sessions:
                if s - gap <= ts <= e + gap:
                    merged.append((s, e))
                    start, end, acc = min(start, s), max(end, e), agg.merge(a, acc)
        if self.lateness.late(end + gap):
            self.lateness.dropped(1)
            return []
        if merged:
            store.delete_all([k for s, e in merged for k in ((_SESSION, key, s), (e + gap + w.grace, key, s))])
        store.put_all([((_SESSION, key, start), [end, acc]), ((end + gap + w.grace, key, start), 0)])
        return [WindowResult(start, end, key, agg.result(acc))]

    def add_records(self, records: Iterable[tuple[Any, Any, Any]]) -> list[WindowResult]:
        """:meth:`add` for many records: each key's sessions are read once, its
        records applied in arrival order in memory, and the changes written in one batch.
        Returns the sessions the records changed, each once, as they stand after them."""
        agg, store, w = self.aggregator, self.store, self.windows
        gap, grace = w.gap, w.grace  # type: ignore[attr-defined]
        by_key: dict[Any, list[tuple[int, Any]]] = {}
        for k, t, v in records:
            by_key.setdefault(k, []).append((event_time(t, k), v))
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
                if self.lateness.late(end + gap):
                    self.lateness.dropped(1)
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

    def close(self, watermark: int) -> Any:
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
        return result_table(rows)
