"""Sessions closed by processing-time timers on a ticking stream: the job, its config and
a driver for tests that SIGKILL it (``python -m localstate.testing.spark_ticks``).

:func:`gap_sessions_task`'s ``GapSessions`` counts each user's events in store ``sessions`` and (re)registers a
processing-time timer ``gap_ms(user)`` after the user's last event; when it fires the
session closes: one output row ``user, events, due, fired`` and the entry is deleted. A
row without a user is an error, so a tick row that reached ``process`` would fail the
run. The driver runs the job over a directory of JSON-lines files with
``timer_interval_ms`` until every user's session has closed and the run ran three micro-batches of its own, its output one JSON file
per micro-batch (``output/batch-B.json``, overwritten by a re-run: an idempotent sink),
and writes ``result.json``. Each task run records ``start`` in ``events/`` and, with
``--window-sleep``, sleeps in ``window`` (a kill there lands mid-task).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from localstate import Config
from localstate.layers.ttl import wall_clock_ms

__all__ = ["gap_sessions_task", "OUTPUT_SCHEMA", "write_output", "read_events", "session_config", "gap_ms", "closed_sessions", "main"]

OUTPUT_SCHEMA = "user string, events long, due long, fired long"
BASE_GAP_MS = 1000


def gap_ms(user: str, step_ms: int = 300) -> int:
    """The inactivity gap of ``user`` (``u<i>``): staggered by ``step_ms``, so sessions close over several ticks."""
    return BASE_GAP_MS + step_ms * int(user[1:])


def session_config(root: Path, *, partitions: int = 2, engine: str = "rocksdb") -> Config:
    """The job's config: state and file changelog under ``root``."""
    return Config.from_dict({
        "job.name": "gap-sessions",
        "job.partitions": partitions,
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.sessions.factory": engine,
        "stores.sessions.key.serde": "string",
        "stores.sessions.msg.serde": "json",
        "stores.sessions.changelog": "file.gap-sessions-sessions",
        "stores.timers.factory": engine,
        "stores.timers.changelog": "file.gap-sessions-timers",
    })


def gap_sessions_task(*, gap_step_ms: int = 300, window_sleep_s: float = 0.0, events_dir: Path | None = None) -> type:
    """The ``GapSessions`` StreamTask class (built on call: this module imports without
    pyspark); its settings travel with the pickled class to the Python workers."""
    from localstate.contrib.spark import StreamTask

    step, sleep_s, events = gap_step_ms, window_sleep_s, None if events_dir is None else str(events_dir)

    class GapSessions(StreamTask):
        """Per-user sessions closed by a processing-time timer ``gap_ms(user)`` after the last event."""

        gap_step_ms = step
        window_sleep_s = sleep_s
        events_dir = events

        def init(self, context: Any) -> None:
            self.context = context
            self.sessions = context.store("sessions")
            self.timers = context.processing_timers
            if self.events_dir:
                self._event("start")

        def _event(self, phase: str) -> None:
            from localstate.contrib.spark.streaming import stream_batch_id

            path = Path(self.events_dir) / f"{time.time_ns()}-{os.getpid()}-{self.context.partition}.json"
            tmp = path.with_name(f".{path.name}")
            tmp.write_text(json.dumps({"phase": phase, "partition": self.context.partition,
                                       "batch": stream_batch_id(), "time": time.time()}))
            os.replace(tmp, path)

        def process(self, record: dict[str, Any], emit: Any) -> None:
            user = record["user"]
            if user is None:
                raise AssertionError(f"a row without a user reached process(): {record!r}")
            session = self.sessions.get(user) or {"events": 0, "due": None}
            if session["due"] is not None:
                self.timers.delete(user, session["due"])
            session["events"] += 1
            session["due"] = wall_clock_ms() + gap_ms(user, self.gap_step_ms)
            self.timers.register(user, session["due"])
            self.sessions.put(user, session)

        def on_timer(self, key: Any, ts: int, emit: Any) -> None:
            session = self.sessions.get(key)
            if session is None or session["due"] != ts:
                raise AssertionError(f"timer ({key!r}, {ts}) fired for session {session!r}")
            self.sessions.delete(key)
            emit({"user": key, "events": session["events"], "due": ts, "fired": wall_clock_ms()})

        def window(self, emit: Any) -> None:
            if self.window_sleep_s:
                time.sleep(self.window_sleep_s)

    return GapSessions


def closed_sessions(output: Path) -> list[dict[str, Any]]:
    """Every session closed in the output files (one per micro-batch), in batch order."""
    rows: list[dict[str, Any]] = []
    for path in sorted(output.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        rows.extend(json.loads(path.read_text()))
    return rows


def read_events(root: Path) -> list[dict[str, Any]]:
    """The task runs' ``start`` events, oldest first."""
    return sorted((json.loads(p.read_text()) for p in (root / "events").glob("[0-9]*.json")),
                  key=lambda e: e["time"])


def write_output(output: Path) -> Any:
    """An idempotent ``output(df, batch_id)``: the batch's rows to ``output/batch-B.json``."""
    output.mkdir(parents=True, exist_ok=True)

    def write(df: Any, batch_id: int) -> None:
        rows = [r.asDict() for r in df.collect()]
        tmp = output / f".batch-{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, output / f"batch-{batch_id}.json")

    return write


def batches_tasks_may_be_at(checkpoint: Path, last: int) -> set[int]:
    """The micro-batch ids each task's committed state may include once a query whose last
    finished micro-batch is ``last`` was stopped: ``last``, or the one after it when the
    stop interrupted that one after a task's commit (Spark started it, in its ``offsets``
    log, and never finished it, in its ``commits`` log; the next start rolls the task back
    to Spark's)."""
    from localstate.contrib.spark.ticks import log_batches

    cut = last + 1 in log_batches(checkpoint / "offsets") - log_batches(checkpoint / "commits")
    return {last, last + 1} if cut else {last}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--users", type=int, required=True, help="stop once this many sessions closed")
    parser.add_argument("--interval-ms", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--spark-tasks", type=int, default=None)
    parser.add_argument("--window-sleep", type=float, default=0.0)
    parser.add_argument("--gap-step-ms", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args(argv)

    root: Path = args.root
    (root / "events").mkdir(parents=True, exist_ok=True)
    from localstate.contrib.spark import StatefulJob, spark_session

    spark = spark_session("local[2]", app_name="ticks-driver", **{"spark.sql.shuffle.partitions": "2"})
    task = gap_sessions_task(gap_step_ms=args.gap_step_ms, window_sleep_s=args.window_sleep, events_dir=root / "events")
    job = StatefulJob(session_config(root, partitions=args.partitions), task, key="user",
                      output_schema=OUTPUT_SCHEMA, spark_tasks=args.spark_tasks)
    stream = spark.readStream.schema("user string").json(str(args.input))
    query = job.run_stream(stream, checkpoint_location=str(root / "checkpoint"),
                           output=write_output(root / "output"), timer_interval_ms=args.interval_ms)
    deadline = time.monotonic() + args.timeout
    status = "ok"
    try:
        # until every session closed and this run ran micro-batches of its own
        while (len({r["user"] for r in closed_sessions(root / "output")}) < args.users
               or len(query.recentProgress) < 3):
            if query.exception() is not None:
                status = f"failed: {query.exception()}"
                break
            if time.monotonic() > deadline:
                status = "timeout"
                break
            time.sleep(0.1)
    finally:
        query.stop()
        last = query.lastProgress
        spark.stop()
    (root / "result.json").write_text(json.dumps({"status": status,
                                                  "last_batch": last["batchId"] if last else None}))
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
