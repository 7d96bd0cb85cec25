"""Tumbling and hopping windows with a built-in aggregate (:class:`Count`, :class:`Sum`,
:class:`Min`, :class:`Max`) folded in Arrow (:mod:`localstate.windows`): a batch's
records are grouped per ``(window start, key)`` across batches and go to the store once
per key per commit interval through the columnar store access
(:meth:`TaskStorage.columns`); windows that open and close between two commits never
touch the store. Records fed one at a time take the record-by-record path."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .windows_kinds import Aggregator, Count, Windows
from .windows_store import CLOCK, Lateness, TimedFold, WindowResult

__all__ = ["ArrowFold", "PENDING_ROWS", "OpenWindowMemo", "MEMO_KEYS"]

PENDING_ROWS = 2_000_000
"""Window assignments folded in Arrow before they go to the store (bounds task memory)."""

MEMO_KEYS = 2_000_000
"""Open windows whose values a task keeps in memory between runs at most."""


class OpenWindowMemo:
    """The values of the windows a fold last wrote, by encoded key, kept in the storage's
    :attr:`~localstate.storage.TaskStorage.memo` while it stays open between runs
    (:mod:`localstate.kept_open`): a fold looks the windows it updates up here first and
    reads only the others back from the store (one ``get_all``), instead of reading every
    one back every run. Empty after an open; past ``limit`` keys it is given up for the
    storage's life and the fold reads the store.

    The fold keeps it equal to the store: :meth:`stored` after each ``put_all``,
    :meth:`dropped` after each ``delete_all``, :meth:`forget` when it writes the store by
    another path. A run that fails closes the storage and the memo with it."""

    def __init__(self, memo: dict[str, Any], name: str, columns: Any, limit: int = MEMO_KEYS) -> None:
        self._memo = memo
        self._name = name
        self._columns = columns
        self._limit = limit

    def lookup(self, keys: Any, like: Any) -> Any:
        """The stored values of ``keys`` (EncodedKeys) as an Arrow array of ``like``'s type,
        null where the store holds none: from memory where known, the rest from the store."""
        import pyarrow as pa

        held = self._memo.get(self._name)
        if held is None:
            (stored,) = self._columns.get_all(keys)
            return stored
        found = list(map(held.get, keys.data))
        missing = [i for i, value in enumerate(found) if value is None]
        if missing:
            (read,) = self._columns.get_all(keys.take(missing))
            for i, value in zip(missing, read.to_pylist()):
                found[i] = value
        return pa.array(found, like.type)

    def stored(self, keys: Any, values: Any) -> None:
        """``values`` (an Arrow array) were just written under ``keys``."""
        memo = self._memo
        if memo.get(self._name + ".too-many"):
            return
        held = memo.setdefault(self._name, {})
        held.update(zip(keys.data, values.to_pylist()))
        if len(held) > self._limit:
            del memo[self._name]
            memo[self._name + ".too-many"] = True

    def dropped(self, keys: Any) -> None:
        """``keys`` were just deleted from the store."""
        held = self._memo.get(self._name)
        if held is not None:
            pop = held.pop
            for key in keys.data:
                pop(key, None)

    def forget(self) -> None:
        """Drop what is known (the store was written around the memo)."""
        self._memo.pop(self._name, None)


class ArrowFold(TimedFold):
    """:class:`TimedFold` with the vectorised path: :meth:`add_batch` folds Arrow columns
    into pending window assignments, which :meth:`flush` (and :meth:`close`) move into the
    store through ``columns`` (the store's columnar access)."""

    def __init__(self, store: Any, columns: Any, windows: Windows, aggregator: Aggregator, lateness: Lateness, *,
                 updates: bool, memo: dict[str, Any] | None = None, name: str = "") -> None:
        super().__init__(store, windows, aggregator, lateness, updates=updates)
        self.columns = columns
        self.open_windows = OpenWindowMemo(memo if memo is not None else {}, f"windows.{name}.open", columns)
        self._pending: list[Any] = []
        self._pending_rows = 0

    def add(self, key: Any, ts: int, value: Any) -> list[WindowResult]:
        self.flush()
        self.open_windows.forget()  # the record path writes the store around the memo
        return super().add(key, ts, value)

    def add_records(self, records: Iterable[tuple[Any, Any, Any]]) -> list[WindowResult]:
        self.flush()
        self.open_windows.forget()
        return super().add_records(records)

    def add_batch(self, times: Any, keys: Any, values: Any) -> Any:
        """Fold a batch: ``times`` (int64 numpy), ``keys`` and ``values`` (Arrow arrays;
        ``values`` None when counting). With ``updates``, the windows the batch changed
        (columns ``window_start``, ``window_end``, ``key``, ``value``); else None."""
        import numpy as np
        import pyarrow as pa
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
        closed_at = self.lateness.closed_at
        if closed_at is not None:
            fresh = starts + size + w.grace > closed_at
            late = len(fresh) - int(fresh.sum())
            if late:
                self.lateness.dropped(late)
                starts = starts[fresh]
                take = np.flatnonzero(fresh) if take is None else take[fresh]
        if take is not None:
            index = pa.array(take)
            keys, values = keys.take(index), values.take(index)
        if len(starts) == 0:
            return None
        self._pending.append(pa.table({"w": starts, "k": keys, "v": values}))
        self._pending_rows += len(starts)
        if self.updates:
            changed = self._take_pending()
            assert changed is not None
            stored = self._add_to_store(changed)
            return pa.table({"window_start": stored.column("w"), "window_end": pc.add(stored.column("w"), size),
                             "key": stored.column("k"), "value": stored.column("v")})
        if self._pending_rows >= PENDING_ROWS:
            self.flush()
        return None

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
                folded = self._combine(folded, self.open_windows.lookup(keys, folded))
            self.columns.put_all(keys, [folded])
            self.open_windows.stored(keys, folded)
            out.append(pa.table({"w": part.column("w"), "k": part.column("k"), "v": folded}))
        return out[0] if len(out) == 1 else pa.concat_tables(out, promote_options="permissive")

    def _holds_window(self, start: int) -> bool:
        with self.store.range_keys((start,), (start + 1,)) as keys:
            return next(keys, None) is not None

    def flush(self) -> None:
        pending = self._take_pending()
        if pending is not None:
            self._add_to_store(pending)

    def close(self, watermark: int) -> Any:
        closed_at = self.lateness.closed_at
        if closed_at is not None and self._last_start(watermark) == self._last_start(closed_at):
            self.flush()  # no window start became closable: nothing to scan
            return None
        return self._close_vectorised(watermark)

    def _last_start(self, watermark: int) -> int:
        """The latest tumbling/hopping window start that is closed at ``watermark``.
        Windows that start at or before it had to be closed by then: a record for one
        of them arriving later is late."""
        w = self.windows
        x = watermark - w.grace - w.size  # type: ignore[attr-defined]
        return x - x % w.hop  # type: ignore[attr-defined]

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
            self.open_windows.dropped(keys)
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
