"""Use case 1 — windowed aggregation: page views per user per hour.

State: store ``hourly`` keyed by the order-preserving ``tuple`` serde
``(window_start, user_id)`` → view count (``long``), and store ``clock`` holding the
task's event-time watermark and the boundary below which windows were already emitted.

Counting is vectorised: events are counted per ``(window_start, user_id)`` in Arrow
across batches (up to :attr:`PageViewsPerHour.PENDING_ROWS` events, and always before
a window closes), then the counts of the distinct keys are read with one ``get_all``
and written with one ``put_all`` — per-key Python work happens once per key per commit
interval, not once per event. At every window/commit boundary the task scans the store for the
windows that have closed (``range(None, (boundary,))`` — one ordered scan, because the
tuple key sorts by window start first), emits them, and deletes them; the deletes go
to the changelog like any other change, so a restored task never re-emits a window.

Event time: the watermark is the largest ``ts`` seen by the task; a window
``[s, s + 1h)`` closes once ``s + 1h <= watermark - ALLOWED_LATENESS_S``. An event for
a window that was already emitted is late: it is dropped and counted in
``late_events`` (not part of the state).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .runner import Emitter, StreamTask, TaskContext
from .workload import HOUR, Workload

__all__ = ["PageViewsPerHour", "ALLOWED_LATENESS_S"]

ALLOWED_LATENESS_S = 60
"""How long after its end a window stays open for out-of-order events."""

_WATERMARK = "watermark"
_EMITTED_BEFORE = "emitted_before"


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
        "clock": {"factory": "kv", "key.serde": "string", "msg.serde": "long"},
    }

    PENDING_ROWS = 2_000_000
    """Events counted in Arrow before the counts go to the store (bounds task memory)."""

    late_events = 0
    """Events dropped in this task attempt because their window had been emitted."""

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        return workload.page_views.select(["ts", "user_id"])

    def init(self, context: TaskContext) -> None:
        self.hourly = context.store("hourly")
        self.clock = context.store("clock")
        self.watermark: int = self.clock.get(_WATERMARK) or 0
        self.emitted_before: int = self.clock.get(_EMITTED_BEFORE) or 0
        self.late_events = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

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

    def _apply_pending(self) -> None:
        """Add the pending counts to the store: one ``get_all`` and one ``put_all`` of the
        distinct ``(window_start, user_id)`` keys since the last call."""
        if not self._pending:
            return
        grouped = (
            pa.concat_tables(self._pending)
            .group_by(["w", "u"], use_threads=False)
            .aggregate([("n", "sum")])
        )
        self._pending = []
        self._pending_rows = 0
        keys = list(zip(grouped.column("w").to_pylist(), grouped.column("u").to_pylist()))
        counts = grouped.column("n_sum").to_pylist()
        existing = self.hourly.get_all(keys)
        if existing:
            get = existing.get
            self.hourly.put_all([(k, get(k, 0) + n) for k, n in zip(keys, counts)])
        else:
            self.hourly.put_all(list(zip(keys, counts)))

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
        self._apply_pending()
        boundary = self.closing_boundary()
        if boundary > self.emitted_before:
            starts: list[int] = []
            users: list[str] = []
            views: list[int] = []
            keys: list[tuple[int, str]] = []
            with self.hourly.range(None, (boundary,)) as closed:
                for key, count in closed:
                    keys.append(key)
                    starts.append(key[0])
                    users.append(key[1])
                    views.append(count)
            if keys:
                emit.arrow(pa.RecordBatch.from_arrays(
                    [pa.array(starts, pa.int64()), pa.array(users, pa.string()), pa.array(views, pa.int64())],
                    names=["window_start", "user_id", "views"],
                ))
                self.hourly.delete_all(keys)
            self.emitted_before = boundary
            self.clock[_EMITTED_BEFORE] = boundary
        if self.watermark:
            self.clock[_WATERMARK] = self.watermark
