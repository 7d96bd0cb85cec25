"""Timers that fire without input: ``StatefulJob.run_stream(timer_interval_ms=T)``.

The job (:mod:`localstate.testing.spark_ticks`) opens a session per user on each event
and closes it with a processing-time timer a gap after the user's last event. With
ticks, every session closes on time with no input after it; no tick row reaches
``process`` (the task fails on a row without a user); each tick micro-batch is a commit
version of every task; after a stop, or SIGKILLs of the driver, and a restart from the
checkpoint, every session closed exactly once with its exact event count and nothing is
left in the state. Bad intervals and triggers that cannot tick are errors before
anything is written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate import ConfigError, TaskStorage
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.streaming import committed_batches
from localstate.testing.processes import run_process_group
from localstate.testing.spark_ticks import (
    OUTPUT_SCHEMA,
    batches_tasks_may_be_at,
    closed_sessions,
    gap_sessions_task,
    read_events,
    session_config,
    write_output,
)

pytestmark = pytest.mark.spark

TICK_MS = 200
ON_TIME_MS = 10_000
"""How late after its due time a session may close: a tick, a micro-batch and the
machine's load (the CI machine is shared)."""


def _write_events(directory: Path, events: Counter[str], name: str = "events-0.json") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"user": u}) for u, n in sorted(events.items()) for _ in range(n)]
    tmp = directory / f".{name}"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, directory / name)


def _wait(predicate: Any, query: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f}s")
        time.sleep(0.1)


def _left_in_state(config: Any) -> dict[str, list[Any]]:
    """What every partition's committed ``sessions`` and ``timers`` stores still hold."""
    left: dict[str, list[Any]] = {"sessions": [], "timers": []}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage:
            for name in left:
                with storage.store(name).all() as items:
                    left[name].extend(k for k, _ in items)
    return left


def _check_exact(rows: list[dict[str, Any]], events: Counter[str]) -> None:
    assert Counter(r["user"] for r in rows) == Counter(set(events)), f"a session closed twice or never: {rows}"
    assert {r["user"]: r["events"] for r in rows} == dict(events)
    assert all(r["fired"] >= r["due"] for r in rows), rows


def _stream(spark: Any, input_dir: Path) -> Any:
    return spark.readStream.schema("user string").json(str(input_dir))


@pytest.mark.parametrize("spark_tasks", [None, 1], ids=["task-per-spark-task", "tasks-share-a-spark-task"])
def test_a_session_closes_on_time_with_no_input_after_it(spark: Any, tmp_path: Path, spark_tasks: int | None) -> None:
    config = session_config(tmp_path, partitions=2, engine="memory")
    job = StatefulJob(config, gap_sessions_task(), key="user", output_schema=OUTPUT_SCHEMA, spark_tasks=spark_tasks)
    events = Counter({"u0": 3, "u1": 1, "u2": 2})
    _write_events(tmp_path / "input", events)
    query = job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(tmp_path / "checkpoint"),
                           output=write_output(tmp_path / "output"), timer_interval_ms=TICK_MS)
    try:
        _wait(lambda: len(closed_sessions(tmp_path / "output")) >= len(events), query, 120, "every session closing")
        batches = query.lastProgress["batchId"]
        _wait(lambda: query.lastProgress["batchId"] >= batches + 2, query, 60, "two more tick micro-batches")
    finally:
        query.stop()
    rows = closed_sessions(tmp_path / "output")
    _check_exact(rows, events)
    late = {r["user"]: r["fired"] - r["due"] for r in rows}
    assert max(late.values()) < ON_TIME_MS, late
    # The events were one micro-batch; every later one was a tick with no input rows (its
    # one row is the tick source's, filtered out before the tasks), and the sessions
    # closed in those.
    progress = [p for p in query.recentProgress if p["batchId"] > 0]
    assert progress and all(p["sources"][0]["numInputRows"] == 0 for p in progress)
    assert all(p["sources"][1]["description"].startswith("RatePerMicroBatch") for p in progress)
    closing = {int(p.stem.split("-")[1]) for p in (tmp_path / "output").glob("batch-*.json")
               if json.loads(p.read_text())}
    assert min(closing) > 0, closing
    # Every task committed every micro-batch, ticks included, whichever Spark task ran it:
    # each is at the last micro-batch whose output was written (or the one the stop cut).
    last = max(int(p.stem.split("-")[1]) for p in (tmp_path / "output").glob("batch-*.json"))
    committed = committed_batches(config)
    assert set(committed) == {0, 1}, committed
    assert set(committed.values()) <= batches_tasks_may_be_at(tmp_path / "checkpoint", last), (committed, last)
    assert _left_in_state(config) == {"sessions": [], "timers": []}


def test_without_ticks_a_due_timer_waits_for_input(spark: Any, tmp_path: Path) -> None:
    """The behaviour ticks change: with only a processingTime trigger, no micro-batch runs
    without new input, so a due timer does not fire."""
    config = session_config(tmp_path, partitions=2, engine="memory")
    job = StatefulJob(config, gap_sessions_task(), key="user", output_schema=OUTPUT_SCHEMA)
    _write_events(tmp_path / "input", Counter({"u0": 1}))
    query = job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(tmp_path / "checkpoint"),
                           output=write_output(tmp_path / "output"),
                           trigger={"processingTime": f"{TICK_MS} milliseconds"})
    try:
        _wait(lambda: query.lastProgress is not None, query, 60, "the first micro-batch")
        time.sleep(3.0)  # five gaps of u0
        assert query.lastProgress["batchId"] == 0
    finally:
        query.stop()
    assert closed_sessions(tmp_path / "output") == []


def test_restart_from_the_checkpoint_after_a_stop_closes_every_session_once(spark: Any, tmp_path: Path) -> None:
    config = session_config(tmp_path, partitions=3)
    task = gap_sessions_task(gap_step_ms=1500)
    events = Counter({f"u{i}": i + 1 for i in range(5)})
    _write_events(tmp_path / "input", events)

    def start() -> Any:
        job = StatefulJob(config, task, key="user", output_schema=OUTPUT_SCHEMA)
        return job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(tmp_path / "checkpoint"),
                              output=write_output(tmp_path / "output"), timer_interval_ms=TICK_MS)

    query = start()
    try:
        _wait(lambda: len(closed_sessions(tmp_path / "output")) >= 1, query, 120, "the first session closing")
    finally:
        query.stop()
    first = closed_sessions(tmp_path / "output")
    assert len(first) < len(events), "every session closed before the stop: nothing left to resume"
    query = start()
    try:
        _wait(lambda: len(closed_sessions(tmp_path / "output")) >= len(events), query, 120, "every session closing")
    finally:
        query.stop()
    _check_exact(closed_sessions(tmp_path / "output"), events)
    assert _left_in_state(config) == {"sessions": [], "timers": []}


RUN_TIMEOUT_S = 240.0
GAP_STEP_MS = 3000
"""The driver test's sessions are due 1 s, 4 s, … 16 s after their events: some close
before the first kill, the others at ticks of the restarted drivers (how many in which run
depends on how long a restart takes on the machine)."""


def _run_driver(root: Path, users: int, kill: Any, n: int) -> tuple[int | None, dict[str, Any] | None, dict[int, int]]:
    """Start the driver; SIGKILL its process group once ``kill(root)`` names a moment."""
    cmd = [sys.executable, "-m", "localstate.testing.spark_ticks", "--root", str(root), "--input",
           str(root / "input"), "--users", str(users), "--interval-ms", str(TICK_MS), "--partitions", "3",
           "--spark-tasks", "2", "--window-sleep", "0.3", "--gap-step-ms", str(GAP_STEP_MS)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    run = run_process_group(cmd, env, root / f"driver-{n}.log", timeout_s=RUN_TIMEOUT_S,
                            kill_when=None if kill is None else lambda: kill(root))
    if run.timed_out:
        pytest.fail(f"driver run {n} did not finish within {RUN_TIMEOUT_S:.0f}s; log: {root / f'driver-{n}.log'}")
    return run.returncode, run.moment, run.survivors


def _mid_task_after_a_close(root: Path) -> dict[str, Any] | None:
    """A task run of a micro-batch after the first one that closed a session, still in
    its ``window`` sleep (started less than 0.15 s ago)."""
    rows = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (root / "output").glob("batch-*.json")}
    closing = [b for b, r in rows.items() if r]
    if not closing:
        return None
    now = time.time()
    late = [e for e in read_events(root) if e["batch"] > min(closing) and now - e["time"] < 0.15]
    return late[0] if late else None


def _closes_by_batch(root: Path) -> dict[int, list[str]]:
    """The users whose sessions each micro-batch closed (as its output file says)."""
    return {int(p.stem.split("-")[1]): [r["user"] for r in json.loads(p.read_text())]
            for p in (root / "output").glob("batch-*.json")}


def _output_of_this_run() -> Any:
    """The moment a micro-batch of the run started now handed over its output (a file
    written after this call): before or after Spark's commit log."""
    start = time.time()

    def moment(root: Path) -> dict[str, Any] | None:
        written = [(p.stat().st_mtime, p) for p in (root / "output").glob("batch-*.json")]
        new = sorted(p for t, p in written if t > start)
        if not new:
            return None
        return {"batch": int(new[0].stem.split("-")[1]), "closed": sum(map(len, _closes_by_batch(root).values()))}
    return moment


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the driver's processes through /proc")
def test_driver_sigkilled_between_ticks_and_mid_task_closes_every_session_exactly_once(tmp_path: Path) -> None:
    """The driver (its JVM and Python workers: the whole process group) is SIGKILLed
    while a tick micro-batch's task sleeps in ``window`` after a session closed, then
    right after the restarted driver's first micro-batch handed its output over (before
    or after Spark's commit log), and restarted from its checkpoint each time."""
    events = Counter({f"u{i}": 2 * i + 1 for i in range(6)})
    _write_events(tmp_path / "input", events)
    kills = [lambda: _mid_task_after_a_close, _output_of_this_run]
    moments = []
    for n, make_kill in enumerate([*kills, None]):
        kill = make_kill() if make_kill is not None else None
        code, moment, survivors = _run_driver(tmp_path, len(events), kill, n)
        log = (tmp_path / f"driver-{n}.log").read_text(errors="replace")[-3000:]
        assert not survivors, f"processes of driver run {n} survived: {survivors}"
        if kill is not None:
            assert moment is not None and code == -signal.SIGKILL, f"run {n} ended before its kill: {code}\n{log}"
            moments.append(moment)
        else:
            assert code == 0, log
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok", result
    config = session_config(tmp_path, partitions=3)
    rows = closed_sessions(tmp_path / "output")
    _check_exact(rows, events)
    # Rebuilt from the changelog alone: nothing left, every task at the last micro-batch.
    fresh = config.with_overrides({"job.state.dir": str(tmp_path / "verify-state")})
    assert _left_in_state(fresh) == {"sessions": [], "timers": []}
    assert _left_in_state(config) == {"sessions": [], "timers": []}
    assert set(committed_batches(config).values()) <= batches_tasks_may_be_at(tmp_path / "checkpoint",
                                                                              result["last_batch"])
    closes = {b: users for b, users in _closes_by_batch(tmp_path).items() if users}
    # Both kills landed in tick micro-batches (batch 0 read every event).
    assert moments[0]["batch"] > 0 and moments[1]["batch"] > 0, moments
    print(f"\nkills at {moments}; sessions closed per micro-batch {dict(sorted(closes.items()))}")


@pytest.mark.parametrize("interval", [0, -5, 1.5, "200", "1 second", True, 200.0])
def test_a_bad_interval_is_an_error_before_anything_is_written(spark: Any, tmp_path: Path, interval: Any) -> None:
    config = session_config(tmp_path, engine="memory")
    job = StatefulJob(config, gap_sessions_task(), key="user", output_schema=OUTPUT_SCHEMA)
    (tmp_path / "input").mkdir()
    with pytest.raises(ConfigError, match=r"timer_interval_ms must be an int >= 1") as e:
        job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(tmp_path / "checkpoint"),
                       timer_interval_ms=interval)
    assert repr(interval) in str(e.value) and "gap-sessions" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input"]
    assert not spark.streams.active


@pytest.mark.parametrize(("trigger", "named"), [
    ({"availableNow": True}, "processes the input available at the start and stops"),
    ({"once": True}, "runs one micro-batch and stops"),
    ({"continuous": "1 second"}, "continuous processing runs no micro-batches"),
    ({"processingTime": "5 seconds"}, "Give one of the two"),
])
def test_ticks_with_a_trigger_is_an_error_before_anything_is_written(spark: Any, tmp_path: Path,
                                                                     trigger: dict[str, Any], named: str) -> None:
    config = session_config(tmp_path, engine="memory")
    job = StatefulJob(config, gap_sessions_task(), key="user", output_schema=OUTPUT_SCHEMA)
    (tmp_path / "input").mkdir()
    with pytest.raises(ConfigError, match="cannot be combined with trigger") as e:
        job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(tmp_path / "checkpoint"),
                       trigger=trigger, timer_interval_ms=500)
    assert named in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input"]
    assert not spark.streams.active


def test_ticks_on_a_checkpoint_written_without_them_is_an_error_before_the_query_starts(
        spark: Any, tmp_path: Path) -> None:
    """Spark refuses a checkpoint whose source count changed only once the query runs; the
    runner says so first, naming the checkpoint and the way out, and changes nothing."""
    config = session_config(tmp_path, engine="memory")
    job = StatefulJob(config, gap_sessions_task(), key="user", output_schema=OUTPUT_SCHEMA)
    _write_events(tmp_path / "input", Counter({"u0": 1}))
    checkpoint = tmp_path / "checkpoint"
    query = job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(checkpoint),
                           trigger={"availableNow": True})
    query.awaitTermination()
    before = sorted((p.relative_to(checkpoint), p.stat().st_mtime_ns) for p in checkpoint.rglob("*"))
    committed = committed_batches(config)
    with pytest.raises(ConfigError, match="written by a query without ticks") as e:
        job.run_stream(_stream(spark, tmp_path / "input"), checkpoint_location=str(checkpoint),
                       timer_interval_ms=TICK_MS)
    assert str(checkpoint) in str(e.value) and "new checkpoint location" in str(e.value)
    assert sorted((p.relative_to(checkpoint), p.stat().st_mtime_ns) for p in checkpoint.rglob("*")) == before
    assert committed_batches(config) == committed and not spark.streams.active
