"""What a tick costs: the micro-batches ``run_stream(timer_interval_ms=T)`` runs without input.

A :mod:`localstate.testing.spark_ticks` session job (4 tasks, rocksdb + file changelog)
over an input directory with one file of ``users`` events, on ``local[2]`` with a
``timer_interval_ms`` of :data:`INTERVAL_MS`. After the data micro-batch every
micro-batch is a tick: no input rows, every task opens its storage, fires its due
timers (the sessions close over the first seconds), calls ``window`` and commits.

Rows, each the median over ``repeats`` runs of the run's median:

* ``tick_batch`` (ms): a tick micro-batch's ``triggerExecution`` from the query
  progress — the wall time Spark spends on it, driver and tasks;
* ``tick_batch_addBatch`` (ms): the part of it in ``foreachBatch`` (the tasks' stage);
* both also for the **floor**: the same query shape (input united with the tick source,
  repartitioned into 2 Spark tasks, a Python ``mapInArrow``) keeping no state, so the
  ratio is what localstate's tasks add to an empty micro-batch;
* ``tick_changelog_bytes`` (bytes per tick): how much the changelog directory grows per
  tick micro-batch once the sessions have closed (a commit without writes rewrites the
  task's checkpoint in place: about 0).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .runner import make_row

__all__ = ["INTERVAL_MS", "run", "tick_run"]

INTERVAL_MS = 100
TASKS = 4
FULL_TICKS, QUICK_TICKS = 40, 8
"""Tick micro-batches timed per run (after :data:`SKIP` warm-up batches)."""
SKIP = 3


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tick_run(spark: Any, root: Path, ticks: int, users: int = 100) -> dict[str, float]:
    """One query with ticks until ``ticks`` tick micro-batches past the warm-up ran; the
    medians of their ``triggerExecution`` and ``addBatch`` (ms) and the changelog bytes
    per tick of the second half (after the sessions closed)."""
    from localstate.contrib.spark import StatefulJob
    from localstate.testing.spark_ticks import OUTPUT_SCHEMA, gap_sessions_task, session_config

    (root / "input").mkdir(parents=True)
    (root / "input" / "events.json").write_text("".join(json.dumps({"user": f"u{i % 10}"}) + "\n"
                                                         for i in range(users)))
    config = session_config(root, partitions=TASKS)
    job = StatefulJob(config, gap_sessions_task(gap_step_ms=50), key="user", output_schema=OUTPUT_SCHEMA,
                      spark_tasks=2)
    stream = spark.readStream.schema("user string").json(str(root / "input"))
    query = job.run_stream(stream, checkpoint_location=str(root / "checkpoint"), timer_interval_ms=INTERVAL_MS)
    half = SKIP + ticks // 2
    sizes: dict[int, int] = {}
    try:
        while True:
            if query.exception() is not None:
                raise RuntimeError(f"the ticking query failed: {query.exception()}")
            last = query.lastProgress
            done = last["batchId"] if last else -1
            if done >= half and half not in sizes:
                sizes[half] = _dir_bytes(root / "changelog")
            if done >= SKIP + ticks:
                sizes[done] = _dir_bytes(root / "changelog")
                break
            time.sleep(0.02)
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if SKIP < p["batchId"] <= SKIP + ticks]
    # sources[0] is the job's input; the last one the tick source, one row per micro-batch
    assert progress and all(p["sources"][0]["numInputRows"] == 0 for p in progress), "a timed micro-batch had input"
    (first, a), (last_batch, b) = sorted(sizes.items())[0], sorted(sizes.items())[-1]
    return {
        "trigger": statistics.median(p["durationMs"]["triggerExecution"] for p in progress),
        "add_batch": statistics.median(p["durationMs"]["addBatch"] for p in progress),
        "bytes": (b - a) / max(1, last_batch - first),
    }


def floor_run(spark: Any, root: Path, ticks: int, users: int = 100) -> dict[str, float]:
    """The same query without localstate: the input and tick source united as
    ``run_stream`` does, repartitioned by user into 2 Spark tasks, a Python ``mapInArrow``
    that emits nothing, ``foreachBatch`` writing to ``noop``. The medians of its tick
    micro-batches' ``triggerExecution`` and ``addBatch`` (ms)."""
    from localstate.contrib.spark.ticks import tick_trigger, with_ticks

    (root / "input").mkdir(parents=True)
    (root / "input" / "events.json").write_text("".join(json.dumps({"user": f"u{i % 10}"}) + "\n"
                                                         for i in range(users)))
    stream = with_ticks(spark.readStream.schema("user string").json(str(root / "input")))

    def nothing(batches: Any) -> Any:
        for _ in batches:
            pass
        return iter(())

    plan = stream.repartition(2, "user").mapInArrow(nothing, "user string")

    def write(df: Any, _batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    query = (plan.writeStream.foreachBatch(write).option("checkpointLocation", str(root / "checkpoint"))
             .trigger(**tick_trigger("floor", INTERVAL_MS, None)).start())
    try:
        while True:
            if query.exception() is not None:
                raise RuntimeError(f"the floor query failed: {query.exception()}")
            last = query.lastProgress
            if last and last["batchId"] >= SKIP + ticks:
                break
            time.sleep(0.02)
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if SKIP < p["batchId"] <= SKIP + ticks]
    return {"trigger": statistics.median(p["durationMs"]["triggerExecution"] for p in progress),
            "add_batch": statistics.median(p["durationMs"]["addBatch"] for p in progress)}


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    from localstate.contrib.spark import spark_session

    ticks = QUICK_TICKS if quick else FULL_TICKS
    repeats = max(1, repeats)
    from pyspark.sql import SparkSession

    # An active session in this process (a test's) is reused and left running: a second one
    # cannot start beside it, and stopping it would stop the test session's context.
    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        spark = spark_session("local[2]", app_name="localstate-bench-ticks", **{"spark.sql.shuffle.partitions": "2"})
    scratch = Path(tempfile.mkdtemp(prefix="localstate-bench-ticks-"))
    try:
        tick_run(spark, scratch / "warm-up", min(ticks, 4))
        floor_run(spark, scratch / "warm-up-floor", min(ticks, 4))
        runs, floors = [], []
        for i in range(repeats):  # interleaved, so load changes hit both alike
            runs.append(tick_run(spark, scratch / f"run-{i}", ticks))
            floors.append(floor_run(spark, scratch / f"floor-{i}", ticks))
    finally:
        if owned:
            spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    params = {"tasks": TASKS, "spark_tasks": 2, "interval_ms": INTERVAL_MS, "ticks": ticks, "master": "local[2]"}
    engine, floor = "rocksdb + file changelog", "spark floor (no localstate)"
    rows = []
    for name, part, what in (("tick_batch", "trigger", "median triggerExecution of a micro-batch with no input "
                              "(timers fire, every task commits)"),
                             ("tick_batch_addBatch", "add_batch", "the foreachBatch part of it: the tasks' stage")):
        rows.append(make_row(name, floor, params, "ms", [f[part] for f in floors],
                             notes="the same query shape with a Python mapInArrow that keeps no state"))
        row = make_row(name, engine, params, "ms", [r[part] for r in runs], baseline=floor,
                       notes=what + "; ratio = localstate / floor")
        row["ratio"] = row["median"] / rows[-1]["median"]
        rows.append(row)
    return [
        *rows,
        make_row("tick_changelog_bytes", engine, params, "bytes", [r["bytes"] for r in runs],
                 notes="changelog growth per tick micro-batch once every session closed (all tasks)"),
    ]
