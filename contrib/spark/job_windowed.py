"""Use case 1 — windowed aggregation: page views per user per hour.

State: one store, ``hourly``, keyed by the order-preserving ``tuple`` serde
``(window_start, user_id)`` → view count (``long``). The task's event-time watermark
and the boundary below which windows were already emitted are kept in the same store
under the keys ``(CLOCK_WINDOW, "watermark")`` and ``(CLOCK_WINDOW, "emitted_before")``:
``CLOCK_WINDOW`` is negative, so they sort before every window and no window scan sees
them. (Not a store of their own: a second store costs a second engine open and a second
snapshot per task per micro-batch. State written with a separate ``clock`` store is
refused on open with a message saying so.)

Counting is vectorised: events are counted per ``(window_start, user_id)`` in Arrow
across batches (up to :attr:`PageViewsPerHour.PENDING_ROWS` events, and always before
a window closes), so per-key Python work happens once per key per commit interval,
not once per event. The store work is columnar too (``storage.columns("hourly")``,
:mod:`localstate.layers.columnar`): keys are encoded from the Arrow columns once — a
lookup and the write after it share them — and closed windows are scanned as columns and
deleted by their encoded keys, so no ``(window_start, user_id)`` tuple is built per key.
(Columnar access needs a store without an object cache: a config that sets
``stores.hourly.object.cache.size`` is refused at the task's start, naming the key.)
At every window/commit boundary the task splits the pending counts at the closing
boundary:

* counts of windows that stay open are added to the store: one ``get_all`` (of the keys
  of windows the store already holds) and one ``put_all`` of their distinct keys;
* counts of windows that close now never go to the store: the store is scanned for
  the closed windows it holds (``range((CLOCK_WINDOW + 1,), (boundary,))`` — one ordered scan,
  because the tuple key sorts by window start first), those are added to the pending
  counts, the sums are emitted (sorted by window start, then user) and only the keys
  the store held are deleted. The deletes go to the changelog like any other change,
  so a restored task never re-emits a window.

While the worker keeps the task's storage open between micro-batches
(:mod:`localstate.kept_open`), the counts of the open windows are also kept in memory
(:class:`~localstate.windows_arrow.OpenWindowMemo` in :attr:`TaskContext.memo`, encoded key
→ count, at most :attr:`PageViewsPerHour.MEMO_KEYS`): a micro-batch then looks up in
memory the keys the task wrote before and reads only the others from the store.

Writing a closing window's count only to delete it in the same commit would cost a
get, a put, a scan and a delete per key (and two changelog records) for nothing: in a
batch run over many hours, most windows open and close within the run.

Event time: the watermark is the largest ``ts`` seen by the task; a window
``[s, s + 1h)`` closes once ``s + 1h <= watermark - ALLOWED_LATENESS_S``. An event for
a window that was already emitted is late: it is dropped and counted in
``late_events`` (not part of the state).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from localstate import ConfigError
from localstate.windows import Count, Tumbling, WindowedAggregation
from localstate.windows_arrow import MEMO_KEYS, OpenWindowMemo

from .runner import Emitter, StreamTask, TaskContext
from .workload import HOUR, Workload

__all__ = ["PageViewsPerHour", "PageViewsPerHourWindowed", "ALLOWED_LATENESS_S", "CLOCK_WINDOW"]

ALLOWED_LATENESS_S = 60
"""How long after its end a window stays open for out-of-order events."""

CLOCK_WINDOW = -1
"""The ``window_start`` of the ``hourly`` keys that hold the task's clock (windows start >= 0)."""
_WATERMARK = (CLOCK_WINDOW, "watermark")
_EMITTED_BEFORE = (CLOCK_WINDOW, "emitted_before")
_FORMER_CLOCK_STORE = "clock"


class PageViewsPerHour(StreamTask):
    """Page views per ``(hour, user)``, emitted when the hour closes.

    Input columns: ``ts`` (int64 epoch seconds), ``user_id`` (string); keyed by
    ``user_id``. Output rows: ``window_start`` (epoch seconds), ``user_id``, ``views``.
    """

    NAME = "pageviews-hourly"
    KEY = "user_id"
    OUTPUT_SCHEMA = "window_start long, user_id string, views long"
    STORES: dict[str, dict[str, Any]] = {
        "hourly": {
            "factory": "kv",
            "key.serde": "tuple",
            "msg.serde": "long",
            # Counts are written once per key per commit interval (see _apply_pending), so
            # an object cache would only add work.
            "object.cache.size": 0,
            "write.batch.size": 10_000,
        },
    }

    PENDING_ROWS = 2_000_000
    """Events counted in Arrow before the counts go to the store (bounds task memory)."""

    MEMO_KEYS = MEMO_KEYS
    """Open-window counts kept in memory between micro-batches at most (per task)."""

    late_events = 0
    """Events dropped in this task attempt because their window had been emitted."""

    _MEMO = "pageviews-hourly.open-counts"

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        return workload.page_views.select(["ts", "user_id"])

    def init(self, context: TaskContext) -> None:
        self.hourly = context.store("hourly")
        self.hourly_columns = context.storage.columns("hourly")
        clock = self.hourly.get_all([_WATERMARK, _EMITTED_BEFORE])
        committed = context.storage.checkpoint
        if not clock and committed is not None and _FORMER_CLOCK_STORE in committed.offsets:
            raise ConfigError(
                f"job {context.config.job_name!r} partition {context.partition}: this state was written by an "
                f"older {type(self).__name__} that kept its watermark in a store {_FORMER_CLOCK_STORE!r}; the "
                "job now keeps it in 'hourly'. Finish the old job's windows with the old version, or start "
                "over with a new job.name or a fresh state dir"
            )
        self.watermark: int = clock.get(_WATERMARK, 0)
        self.emitted_before: int = clock.get(_EMITTED_BEFORE, 0)
        self.late_events = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.open_windows = OpenWindowMemo(context.memo, self._MEMO, self.hourly_columns, self.MEMO_KEYS)

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        if batch.num_rows == 0:
            return
        ts = batch.column("ts").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        window_start = ts - ts % HOUR
        users = batch.column("user_id")
        fresh = window_start >= self.emitted_before
        late = len(fresh) - int(fresh.sum())
        if late:
            self.late_events += late
            window_start = window_start[fresh]
            users = users.filter(pa.array(fresh))
        if len(window_start) == 0:
            return
        self._pending.append(pa.table({"w": window_start, "u": users, "n": np.ones(len(window_start), np.int64)}))
        self._pending_rows += len(window_start)
        if self._pending_rows >= self.PENDING_ROWS:
            self._apply_pending()
        self.watermark = max(self.watermark, int(ts.max()))

    def _take_pending(self) -> pa.Table | None:
        """The pending counts grouped by ``(w, u)`` (columns ``w``, ``u``, ``n``), and
        forget them; None when nothing is pending."""
        if not self._pending:
            return None
        grouped = (
            pa.concat_tables(self._pending)
            .group_by(["w", "u"], use_threads=False)
            .aggregate([("n", "sum")])
        )
        self._pending = []
        self._pending_rows = 0
        return pa.table({"w": grouped.column("w"), "u": grouped.column("u"), "n": grouped.column("n_sum")})

    def _add_to_store(self, counts: pa.Table) -> None:
        """Add ``counts`` (distinct ``(w, u)`` keys) to the store, a column at a time: the
        keys of windows the store already holds are encoded once, looked up in one
        ``get_all`` and written back in one ``put_all``; the others are only written.

        A window the store holds no key of (one that opened since the last commit — in a
        stream, about every other window per micro-batch) needs no lookup: one ordered
        probe per distinct window tells, instead of a get per key."""
        if counts.num_rows == 0:
            return
        windows = pc.unique(counts.column("w"))
        held = pa.array([w for w in windows.to_pylist() if self._holds_window(w)], pa.int64())
        if len(held) == len(windows):
            parts = [(counts, True)]
        else:
            in_held = pc.is_in(counts.column("w"), held)
            parts = [(counts.filter(pc.invert(in_held)), False), (counts.filter(in_held), True)]
        for part, look_up in parts:
            if part.num_rows == 0:
                continue
            keys = self.hourly_columns.encode_keys([part.column("w"), part.column("u")])
            views = part.column("n").combine_chunks()
            if look_up:
                views = pc.add(views, pc.fill_null(self.open_windows.lookup(keys, views), 0))
            self.hourly_columns.put_all(keys, [views])
            self.open_windows.stored(keys, views)

    def _holds_window(self, window_start: int) -> bool:
        """Whether the store holds any key of the window starting at ``window_start``."""
        with self.hourly.range((window_start,), (window_start + 1,)) as keys:
            return next(keys, None) is not None

    def _apply_pending(self) -> None:
        """Add every pending count to the store."""
        pending = self._take_pending()
        if pending is not None:
            self._add_to_store(pending)

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        """The per-record path (same result as :meth:`process_batch`, much slower)."""
        ts = int(record["ts"])
        window_start = ts - ts % HOUR
        if window_start < self.emitted_before:
            self.late_events += 1
            return
        key = (window_start, record["user_id"])
        self.hourly[key] = (self.hourly.get(key) or 0) + 1
        self.watermark = max(self.watermark, ts)

    def closing_boundary(self) -> int:
        """Windows starting before this boundary are closed at the current watermark."""
        closed_until = self.watermark - ALLOWED_LATENESS_S
        return closed_until - closed_until % HOUR

    def window(self, emit: Emitter) -> None:
        boundary = self.closing_boundary()
        clock: list[tuple[tuple[int, str], int]] = []
        if boundary > self.emitted_before:
            self._close_windows(boundary, emit)
            self.emitted_before = boundary
            clock.append((_EMITTED_BEFORE, boundary))
        else:
            self._apply_pending()
        if self.watermark:
            clock.append((_WATERMARK, self.watermark))
        if clock:
            self.hourly.put_all(clock)

    def _close_windows(self, boundary: int, emit: Emitter) -> None:
        """Emit every window starting before ``boundary`` (pending counts plus what the
        store holds), store the pending counts of the windows still open, and delete
        the closed windows from the store."""
        pending = self._take_pending()
        closing: list[pa.Table] = []
        if pending is not None:
            closes = pc.less(pending.column("w"), boundary)
            self._add_to_store(pending.filter(pc.invert(closes)))
            closing.append(pending.filter(closes))
        closed_keys = []
        with self.hourly_columns.range((CLOCK_WINDOW + 1,), (boundary,)) as chunks:
            for chunk in chunks:  # columns, decoded a chunk at a time; the keys stay encoded
                (w, u), (n,) = chunk.key_columns, chunk.value_columns
                closing.append(pa.table({"w": w, "u": u, "n": n}))
                closed_keys.append(chunk.keys)
        for keys in closed_keys:  # after the scan: it reads one snapshot either way
            self.hourly_columns.delete_all(keys)
            self.open_windows.dropped(keys)
        closing = [t for t in closing if t.num_rows]
        if not closing:
            return
        if len(closing) == 1:
            out = closing[0]
        else:  # a window both in the store and pending: add the two counts
            grouped = pa.concat_tables(closing, promote_options="permissive").group_by(["w", "u"], use_threads=False).aggregate([("n", "sum")])
            out = pa.table({"w": grouped.column("w"), "u": grouped.column("u"), "n": grouped.column("n_sum")})
        out = out.take(pc.sort_indices(out, [("w", "ascending"), ("u", "ascending")]))
        emit.arrow(pa.RecordBatch.from_arrays(
            [out.column("w").combine_chunks(), out.column("u").combine_chunks(), out.column("n").combine_chunks()],
            names=["window_start", "user_id", "views"],
        ))


class PageViewsPerHourWindowed(StreamTask):
    """:class:`PageViewsPerHour` on the built-in windows (:mod:`localstate.windows`): a
    tumbling hour with :data:`ALLOWED_LATENESS_S` of grace counting views per user, the
    same input, output rows and ``hourly`` store config, and the same output byte for
    byte. The window clock is the operator's (``(CLOCK, ...)`` keys of ``hourly``)."""

    NAME = "pageviews-hourly-windowed"
    KEY = PageViewsPerHour.KEY
    OUTPUT_SCHEMA = PageViewsPerHour.OUTPUT_SCHEMA
    STORES = PageViewsPerHour.STORES
    input_table = staticmethod(PageViewsPerHour.input_table)

    @property
    def late_events(self) -> int:
        """Events dropped in this task attempt because their window had been emitted."""
        return self.hourly.late_records

    def init(self, context: TaskContext) -> None:
        self.hourly = WindowedAggregation(context.storage, "hourly", Tumbling(HOUR, grace=ALLOWED_LATENESS_S), Count())

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        self.hourly.add_batch(batch, key="user_id", time="ts")

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        self.hourly.add(record["user_id"], record["ts"])

    def window(self, emit: Emitter) -> None:
        closed = self.hourly.close()
        if closed.num_rows:
            emit.arrow(closed.select(["window_start", "key", "value"]).rename_columns(
                ["window_start", "user_id", "views"]))
