"""Keyed state example: per-user sessions with keyed state handles and event-time timers.

A session of a user is a run of page views with gaps shorter than :data:`SESSION_GAP_MS`;
it closes when the watermark passes its last view plus the gap (an event-time timer), or
when a view comes a gap or more after it (in one batch), and the task emits one row for
it. A view older than the open session's end joins it (views of one user are expected in
time order, up to the watermark delay). The task implements only the per-record :meth:`UserSessions.process` and
:meth:`UserSessions.on_timer`: the runner scopes every handle to the row's ``user_id``
(the job's key column) and to the timer's key, so no call names the user.

Handles (one store each, :mod:`localstate.keyed`):

* ``session`` — aggregating: ``[start, end, views, total_ms]`` of the open session;
* ``pages`` — map: views per page in the open session (``key.serde = tuple``; its
  entries are ``(user_id, page)``, so ``rescale.key = key[0]`` routes them by the user);
* ``recent`` — list: the last :data:`RECENT` pages of the open session;
* ``lifetime`` — reducing: views over all the user's sessions (never cleared, ``ttl.ms``
  = 30 days of event time: a user not seen for a month is forgotten);
* ``closed`` — value: how many of the user's sessions were closed.

Input columns: ``ts_ms`` (event time, epoch ms), ``user_id``, ``page``, ``duration_ms``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate.keyed import Aggregate

from .task import Emitter, StreamTask, TaskContext
from .workload import Workload

__all__ = ["UserSessions", "SESSION_GAP_MS", "RECENT", "SESSION"]

SESSION_GAP_MS = 30 * 60 * 1000
"""A gap this long without a view closes the user's session."""
RECENT = 3
"""How many of the session's last pages the ``recent`` list keeps."""


def _add_view(acc: list[int], view: tuple[int, int]) -> list[int]:
    ts, duration = view
    return [min(acc[0], ts), max(acc[1], ts), acc[2] + 1, acc[3] + duration]


SESSION: Aggregate[tuple[int, int], list[int], list[int]] = Aggregate(create=lambda: [1 << 62, -(1 << 62), 0, 0], add=_add_view)
"""The ``session`` handle's fold: ``[start, end, views, total_ms]``."""


class UserSessions(StreamTask):
    """Per-user sessions; see the module docs."""

    NAME = "user-sessions"
    KEY = "user_id"
    OUTPUT_SCHEMA = ("user_id string, session_start long, session_end long, views long, distinct_pages long, "
                     "top_page string, last_pages string, total_ms long, lifetime_views long, session_no long")
    STORES: dict[str, dict[str, Any]] = {
        "session": {"factory": "kv", "key.serde": "string", "msg.serde": "json"},
        "pages": {"factory": "kv", "key.serde": "tuple", "msg.serde": "long", "rescale.key": "key[0]"},
        "recent": {"factory": "kv", "key.serde": "string", "msg.serde": "json"},
        "lifetime": {"factory": "kv", "key.serde": "string", "msg.serde": "long",
                     "ttl.ms": 30 * 24 * 3600 * 1000, "ttl.time": "event"},
        "closed": {"factory": "kv", "key.serde": "string", "msg.serde": "long"},
        "timers": {"factory": "kv", "rescale.key": "timer"},
    }
    event_time_column = "ts_ms"
    watermark_delay_ms = 60_000

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        views = workload.page_views
        return pa.table({"ts_ms": pc.multiply(views["ts"].cast(pa.int64()), 1000), "user_id": views["user_id"],
                         "page": views["page"], "duration_ms": views["duration_ms"].cast(pa.int64())})

    def init(self, context: TaskContext) -> None:
        keyed = context.keyed
        self.session = keyed.aggregating("session", SESSION, list)
        self.pages = keyed.map("pages", str, int)
        self.recent = keyed.list("recent", str)
        self.lifetime = keyed.reducing("lifetime", int.__add__, int)
        self.closed = keyed.value("closed", int)
        self.timers = context.timers

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        ts, page = record["ts_ms"], record["page"]
        current = self.session.get()
        if current is not None and ts >= current[1] + SESSION_GAP_MS:
            self._close(record["user_id"], current, emit)  # the gap passed within this batch
        self.session.add((ts, record["duration_ms"]))
        self.pages.put(page, self.pages.get(page, 0) + 1)
        self.recent.update([*self.recent.get()[-(RECENT - 1):], page])
        self.lifetime.add(1)
        self.timers.register(record["user_id"], ts + SESSION_GAP_MS)

    def on_timer(self, key: Any, ts: int, emit: Emitter) -> None:
        current = self.session.get()
        if current is not None and current[1] + SESSION_GAP_MS <= ts:
            self._close(key, current, emit)  # else closed already, or a later view moved its end

    def _close(self, user: str, session: list[int], emit: Emitter) -> None:
        start, end, views, total_ms = session
        pages = dict(self.pages.items())
        closed = (self.closed.get() or 0) + 1
        emit({"user_id": user, "session_start": start, "session_end": end, "views": views,
              "distinct_pages": len(pages), "top_page": min(pages, key=lambda p: (-pages[p], p)),
              "last_pages": ",".join(self.recent.get()), "total_ms": total_ms,
              "lifetime_views": self.lifetime.get(), "session_no": closed})
        self.closed.update(closed)
        self.session.clear()
        self.pages.clear()
        self.recent.clear()
