"""Crash trials of a task whose sessions close on ticks: runs with no input that only fire
processing-time timers and commit (``localstate torture --workload ticks``).

A Spark job with ``run_stream(timer_interval_ms=T)`` runs each task once per tick with no
input rows: the task opens its storage, fires its due timers, calls ``window`` and
commits. :class:`TickSessionsWorkload` is that task's life in the one crash harness
(:mod:`localstate.testing.torture`): one batch in three carries input, the others are
ticks. The processing-time clock is the batch number times :attr:`STEP_MS` (the harness
compares every reopen with a crash-free reference run, so the clock must replay the same).
"""

from __future__ import annotations

import random
from typing import Any

from localstate import KeyValueStore, TaskStorage
from localstate.timers import PROCESSING_TIME, Timers

from .torture_adapters import WorkloadAdapter, _by_counter

__all__ = ["TickSessionsWorkload"]


class TickSessionsWorkload(WorkloadAdapter):
    """Per-key sessions over any key-value engine, closed by processing-time timers at ticks.

    Data batches (every third: 3, 6, …) count each row into its key's session in the
    store under test (``s``: ``{"events": n, "due": ts}``) and move its timer to
    ``now + gap`` (gap 1.5, 2.5 or 3.5 steps: it comes due during the ticks that follow).
    Every batch, tick or not, then fires the due timers — per timer on odd batches, in
    chunks (``fire_batch``) on even ones — and a firing deletes the session and counts
    ``key@ts`` into ``closed`` with its event count, in the same commit. So a timer fired
    twice shows as a count of 2 (**duplicated**), a lost firing as a missing close or a
    session still open (**lost**)."""

    STEP_MS = 100
    GAPS_MS = (150, 250, 350)
    store_options = {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16, "write.batch.size": 8}
    extra_stores = {
        "timers": {"object.cache.size": 16, "write.batch.size": 8},
        "closed": {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16, "write.batch.size": 8},
    }
    crash_points = ("timers.after_fire",)
    key_value = True

    def open(self, storage: TaskStorage) -> None:
        self.storage = storage
        self.now = 0
        self.closed = storage.store("closed")
        self.timers = Timers(storage.store("timers"), PROCESSING_TIME, lambda: self.now)

    def apply_batch(self, store: KeyValueStore, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        self.now = now = batch * self.STEP_MS
        timers, closed = self.timers, self.closed
        if batch % 3 == 0:
            for _ in range(ops):
                k = f"k{rng.randrange(keys)}"
                session = store.get(k) or {"events": 0, "due": None}
                if session["due"] is not None:
                    timers.delete(k, session["due"])
                session["events"] += 1
                session["due"] = now + rng.choice(self.GAPS_MS)
                timers.register(k, session["due"])
                store.put(k, session)

        def close(key: str, ts: int) -> dict[str, Any]:
            session = store.pop(key)
            name = f"{key}@{ts}"
            was = closed.get(name)
            return {"n": (was["n"] if was else 0) + 1, "events": session["events"]}

        def on_timer(key: str, ts: int) -> None:
            closed[f"{key}@{ts}"] = close(key, ts)

        def on_timers(keys_: list[str], stamps: list[int]) -> None:
            closed.put_all([(f"{k}@{t}", close(k, t)) for k, t in zip(keys_, stamps)])

        if batch % 2:
            timers.fire(on_timer)
        else:
            timers.fire_batch(on_timers, chunk=3)

    def observe(self, store: KeyValueStore, keys: int) -> dict[str, Any]:
        with store.all() as it:
            out: dict[str, Any] = {f"open:{k}": v for k, v in it}
        with self.closed.all() as it:
            out.update({f"closed:{k}": v for k, v in it})
        out.update({f"timer:{k}@{ts}": 1 for k, ts in self.timers.pending()})
        return out

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual,
                           lambda v: v["n"] if isinstance(v, dict) and "n" in v else 0)
