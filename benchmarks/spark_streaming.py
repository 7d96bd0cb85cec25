"""Issue 17's streaming shape: the windowed count as a Structured Streaming query.

The same page views as :mod:`localstate.benchmarks.spark_jobs` (5M events, 100k users,
6 hours; quick: 40k events, 1k users) are written in time order as Parquet files of
``events / (batches * FILES_PER_TRIGGER)`` rows and read by Spark's file source with
``maxFilesPerTrigger`` = :data:`FILES_PER_TRIGGER` and ``availableNow``: ``batches``
micro-batches of the same input (full size: 10 of 500k), on ``local[2]`` with 4 state
partitions. Windows stay open across micro-batches, so the state is carried from one
batch to the next — the shape a streaming user runs (the single-run rows of
``spark_jobs`` close most windows inside one run).

* ``localstate``: :meth:`StatefulJob.run_stream` with :class:`PageViewsPerHour`
  (rocksdb + file changelog, one exactly-once commit per task per micro-batch; the 4
  tasks run in as many Spark tasks as the session has cores, ``--spark-tasks`` to change);
* ``spark``: ``groupBy(window(event_time, 1 hour), user_id).count()`` with a 60 s
  watermark, append mode, ``RocksDBStateStoreProvider`` with changelog checkpointing.

The two are run interleaved (localstate, Spark, localstate, …) on one warm session.
The warm-up pair collects both queries' output and asserts it is identical (every
``(window_start, user_id, views)``); the timed runs write to the ``noop`` sink.

Rows: ``stream_e2e`` (events/s from ``start()`` to the end of the ``availableNow``
query; the localstate row carries the ratio), ``stream_batch_latency`` (median and p95
of the data micro-batches' ``triggerExecution`` in ms, from the query progress), and
``stream_breakdown``: where one localstate micro-batch's time goes (mean over the data
batches of every timed run), from three sources — the query progress (``durationMs``:
the driver's offset/plan/log work vs ``addBatch``, the job), Spark's status store
(per stage: wall and summed task time, the Parquet-read/shuffle-write stage vs the
shuffle-read/Python stage) and timers inside the Python tasks (storage open, waiting
for input = shuffle read + Arrow transfer, ``process_batch``, ``window``, commit, and the
storage close with rocksdb's local snapshot, from the ``closeTimeMs`` the runner puts in
the query's observed metrics).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.job_windowed import ALLOWED_LATENESS_S, PageViewsPerHour
from localstate.contrib.spark.jobs import job_config
from localstate.contrib.spark.runner import StatefulJob
from localstate.testing.spark import batch_stages

from .runner import make_row
from .spark_jobs import ENGINE, HOURS, SPARK_STATE_STORE, TASKS, Sizes, events, timed_task

__all__ = ["StreamSizes", "STREAM_FULL", "STREAM_QUICK", "FILES_PER_TRIGGER", "write_stream_files",
           "localstate_stream", "spark_stream", "spark_tasks_for", "StreamRun", "stream_rows", "finish_query",
           "format_parts", "latencies_ms", "localstate_breakdown", "spark_breakdown", "run_shape", "main"]

FILES_PER_TRIGGER = 5
INPUT_SCHEMA = "ts long, user_id string"


@dataclass(frozen=True)
class StreamSizes:
    events: int
    users: int
    batches: int


STREAM_FULL = StreamSizes(events=5_000_000, users=100_000, batches=10)
STREAM_QUICK = StreamSizes(events=40_000, users=1_000, batches=4)


def write_stream_files(table: pa.Table, directory: Path, files: int) -> None:
    """``table`` (in time order) as ``files`` Parquet files of equal size under
    ``directory``, with modification times one second apart in the same order: the file
    source admits files oldest first, so every run sees the same micro-batches."""
    directory.mkdir(parents=True)
    per_file = -(-table.num_rows // files)
    base = time.time() - files - 10
    for i in range(files):
        path = directory / f"part-{i:04d}.parquet"
        pq.write_table(table.slice(i * per_file, per_file), path)
        os.utime(path, (base + i, base + i))


@dataclass
class StreamRun:
    """One query run: wall seconds, its progress reports, and (when collected) its output
    as ``window_start, user_id, views`` sorted."""

    seconds: float
    progress: list[dict[str, Any]]
    output: pa.Table | None = None
    stages: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    """Per micro-batch id: its Spark stages (see :func:`batch_stages`)."""

    @property
    def data_batches(self) -> list[dict[str, Any]]:
        return [p for p in self.progress if p["numInputRows"] > 0]

    @property
    def input_rows(self) -> int:
        return sum(p["numInputRows"] for p in self.progress)


def _sorted_output(parts: list[pa.Table]) -> pa.Table:
    table = pa.concat_tables(parts) if parts else pa.table(
        {"window_start": pa.array([], pa.int64()), "user_id": pa.array([], pa.string()),
         "views": pa.array([], pa.int64())})
    return table.sort_by([("window_start", "ascending"), ("user_id", "ascending")])


def _stream(spark: Any, input_dir: Path) -> Any:
    return (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", FILES_PER_TRIGGER)
            .parquet(str(input_dir)))


def spark_tasks_for(spark: Any, spark_tasks: int | None = None) -> int:
    """``spark_tasks`` if given, else the session's cores (``defaultParallelism``), at most
    the :data:`TASKS` state partitions: the Spark tasks localstate's 4 tasks run in, so a
    micro-batch's Python stage is one wave (``StatefulJob(spark_tasks=...)``)."""
    return spark_tasks if spark_tasks is not None else max(1, min(TASKS, spark.sparkContext.defaultParallelism))


def localstate_stream(spark: Any, input_dir: Path, root: Path, *, collect: bool = False,
                      timing_dir: Path | None = None, spark_tasks: int | None = None,
                      task: type[Any] = PageViewsPerHour) -> StreamRun:
    """``task`` (default :class:`PageViewsPerHour`) by :meth:`StatefulJob.run_stream` over
    ``input_dir`` with fresh state under ``root`` (rocksdb + file changelog), its 4 tasks in
    :func:`spark_tasks_for` Spark tasks; with ``timing_dir``, the tasks' timers
    (:func:`timed_task`) are written there."""
    config = job_config(task, root, partitions=TASKS, engine=ENGINE)
    if timing_dir is not None:
        task = timed_task(task, str(timing_dir))
    job = StatefulJob(config, task, key=PageViewsPerHour.KEY, output_schema=PageViewsPerHour.OUTPUT_SCHEMA,
                      spark_tasks=spark_tasks_for(spark, spark_tasks))
    collected: list[pa.Table] = []
    output: Callable[[Any, int], None] | None = None
    if collect:
        def output(df: Any, _batch: int) -> None:
            collected.append(dataframe_to_arrow(df))
    t0 = time.perf_counter()
    query = job.run_stream(_stream(spark, input_dir), checkpoint_location=str(root / "spark-checkpoint"),
                           trigger={"availableNow": True}, output=output)
    return finish_query(spark, query, t0, collected if collect else None)


def spark_stream(spark: Any, input_dir: Path, checkpoint: Path, *, collect: bool = False) -> StreamRun:
    """Spark's own windowed count over ``input_dir`` (RocksDB state store, changelog
    checkpointing as set on the session by :data:`spark_jobs.SESSION_CONF`)."""
    from pyspark.sql import functions as F

    counts = (
        _stream(spark, input_dir).withColumn("event_time", F.timestamp_seconds("ts"))
        .withWatermark("event_time", f"{ALLOWED_LATENESS_S} seconds")
        .groupBy(F.window("event_time", "1 hour"), "user_id")
        .count()
    )
    writer = counts.writeStream.outputMode("append").option("checkpointLocation", str(checkpoint))
    collected: list[pa.Table] = []
    if collect:
        def output(df: Any, _batch: int) -> None:
            collected.append(dataframe_to_arrow(df.select(
                F.unix_seconds(F.col("window.start")).alias("window_start"), "user_id",
                F.col("count").alias("views"))))
        writer = writer.foreachBatch(output)
    else:
        writer = writer.format("noop")
    t0 = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    return finish_query(spark, query, t0, collected if collect else None)


def finish_query(spark: Any, query: Any, t0: float, collected: list[pa.Table] | None) -> StreamRun:
    """Wait for ``query`` (started at ``t0``) to end and gather what it reported."""
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"streaming query {query.name or query.id} failed: {query.exception()}")
    progress = [p if isinstance(p, dict) else p.jsonValue() for p in query.recentProgress]
    output = _sorted_output(collected) if collected is not None else None
    return StreamRun(seconds, progress, output, batch_stages(spark, str(query.runId)))


# -- the breakdown -----------------------------------------------------------------------------
def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values, dtype=float), q)) if values else 0.0


def latencies_ms(run: StreamRun) -> list[float]:
    """``triggerExecution`` of every data micro-batch of ``run`` (ms)."""
    return [float(p["durationMs"].get("triggerExecution", 0)) for p in run.data_batches]


def localstate_breakdown(runs: list[StreamRun], task_docs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Mean seconds per data micro-batch of the localstate query: driver, scheduling,
    the read/shuffle-write stage, and per-task sums of the Python stage's parts: open,
    input, the task's own work (init + process_batch + window, and each of them),
    commit, close."""
    parts: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        parts.setdefault(name, []).append(value)

    for run, docs in zip(runs, task_docs):
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for doc in docs:
            if doc.get("version") is not None:
                by_batch.setdefault(int(doc["version"]), []).append(doc)
        for p in run.data_batches:
            batch = int(p["batchId"])
            durations = p["durationMs"]
            trigger = durations.get("triggerExecution", 0) / 1000
            add_batch = durations.get("addBatch", 0) / 1000
            add("micro-batch (triggerExecution)", trigger)
            add("driver: offsets, planning, offset/commit logs", trigger - add_batch)
            stages = run.stages.get(batch, [])
            read = [s for s in stages if s["shuffle_read"] == 0]
            python = [s for s in stages if s["shuffle_read"] > 0]
            stage_wall = sum(s["wall"] for s in read + python)
            add("addBatch: job scheduling and gaps between stages", add_batch - stage_wall)
            add("stage 1 wall: read input + shuffle write", sum(s["wall"] for s in read))
            add("stage 2 wall: shuffle read + Python tasks", sum(s["wall"] for s in python))
            add("stage 1 task-s", sum(s["task_s"] for s in read))
            add("stage 2 task-s", sum(s["task_s"] for s in python))
            tasks = by_batch.get(batch, [])
            task_s = {key: sum(d.get(key, 0.0) for d in tasks)
                      for key in ("open", "input", "init", "process_batch", "window", "commit")}
            add("python task-s: open storage", task_s["open"])
            add("python task-s: wait for input (shuffle read, Arrow)", task_s["input"])
            add("python task-s: state work (init + process_batch + window)",
                task_s["init"] + task_s["process_batch"] + task_s["window"])
            for key in ("init", "process_batch", "window", "commit"):
                add(f"python task-s: {key}", task_s[key])
            add("python task-s: close (memtable flush, clean-close claim)", _close_seconds(p))
    return {k: statistics.mean(v) for k, v in parts.items()}


def _close_seconds(progress: dict[str, Any]) -> float:
    """The tasks' storage close time (summed) of one micro-batch: ``closeTimeMs`` of the
    runner's observed metrics. Every store's observation repeats its task's figure, so
    one store's is the answer (the largest, should a store be missing from a task)."""
    observed = progress.get("observedMetrics") or {}
    closes = []
    for name, metrics in observed.items():
        if name.startswith("localstate."):
            fields = metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)  # a pyspark Row
            closes.append(fields.get("closeTimeMs") or 0)
    return max(closes, default=0) / 1000


def spark_breakdown(runs: list[StreamRun]) -> dict[str, float]:
    """Mean seconds per data micro-batch of Spark's own query (progress and stages)."""
    parts: dict[str, list[float]] = {}
    for run in runs:
        for p in run.data_batches:
            durations = p["durationMs"]
            trigger = durations.get("triggerExecution", 0) / 1000
            add_batch = durations.get("addBatch", 0) / 1000
            stages = run.stages.get(int(p["batchId"]), [])
            state = p["stateOperators"][0] if p.get("stateOperators") else {}
            for name, value in (
                ("micro-batch (triggerExecution)", trigger),
                ("driver: offsets, planning, offset/commit logs", trigger - add_batch),
                ("stage 1 wall: Parquet read + partial aggregate + shuffle write",
                 sum(s["wall"] for s in stages if s["shuffle_read"] == 0)),
                ("stage 2 wall: shuffle read + aggregate + state store",
                 sum(s["wall"] for s in stages if s["shuffle_read"] > 0)),
                ("state store: updates (task-s)", state.get("allUpdatesTimeMs", 0) / 1000),
                ("state store: removals (task-s)", state.get("allRemovalsTimeMs", 0) / 1000),
                ("state store: commit (task-s)", state.get("commitTimeMs", 0) / 1000),
            ):
                parts.setdefault(name, []).append(value)
    return {k: statistics.mean(v) for k, v in parts.items()}


def format_parts(parts: dict[str, float]) -> str:
    return "; ".join(f"{k} {v * 1000:,.0f} ms" for k, v in parts.items())


# -- the rows --------------------------------------------------------------------------------
def stream_rows(spark: Any, work: Path, quick: bool, repeats: int, spark_tasks: int | None = None) -> list[dict[str, Any]]:
    """The streaming rows (see the module docstring) on ``spark``, with scratch space under
    ``work``; ``repeats`` timed pairs after one verified warm-up pair; localstate's tasks
    in ``spark_tasks`` Spark tasks (:func:`spark_tasks_for`)."""
    import json

    sizes = STREAM_QUICK if quick else STREAM_FULL
    table = events(Sizes(sizes.events, sizes.users, sample_every=1))
    n = table.num_rows
    input_dir = work / "stream-input"
    write_stream_files(table, input_dir, sizes.batches * FILES_PER_TRIGGER)
    del table
    params = {"events": n, "users": sizes.users, "hours": HOURS, "micro_batches": sizes.batches,
              "maxFilesPerTrigger": FILES_PER_TRIGGER, "trigger": "availableNow", "tasks": TASKS,
              "master": spark.sparkContext.master, "engine": ENGINE, "changelog": "file",
              "spark_tasks": spark_tasks_for(spark, spark_tasks)}

    def fresh(name: str) -> Path:
        path = work / f"{name}-{time.time_ns()}"
        path.mkdir()
        return path

    def ours(collect: bool) -> tuple[StreamRun, list[dict[str, Any]]]:
        root = fresh("stream-ls")
        timing = root / "timing"
        timing.mkdir()
        try:
            run = localstate_stream(spark, input_dir, root, collect=collect, timing_dir=timing,
                                    spark_tasks=spark_tasks)
            docs = [json.loads(p.read_text()) for p in timing.glob("*.json")]
            return run, docs
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def theirs(collect: bool) -> StreamRun:
        checkpoint = fresh("stream-spark")
        try:
            return spark_stream(spark, input_dir, checkpoint, collect=collect)
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    # warm-up pair, collected and compared
    mine, _ = ours(True)
    peer = theirs(True)
    for who, run in (("localstate", mine), ("spark", peer)):
        if run.input_rows != n:
            raise RuntimeError(f"the {who} query read {run.input_rows:,} rows, not {n:,}")
    assert mine.output is not None and peer.output is not None
    if not mine.output.equals(peer.output):
        raise RuntimeError(
            f"localstate and Spark emitted different windows: {mine.output.num_rows:,} vs "
            f"{peer.output.num_rows:,} rows, {pa.compute.sum(mine.output['views'])} vs "
            f"{pa.compute.sum(peer.output['views'])} views")
    windows = mine.output.num_rows
    views = int(pa.compute.sum(mine.output["views"]).as_py() or 0)

    our_runs: list[StreamRun] = []
    our_docs: list[list[dict[str, Any]]] = []
    peer_runs: list[StreamRun] = []
    for _ in range(repeats):
        run, docs = ours(False)
        our_runs.append(run)
        our_docs.append(docs)
        peer_runs.append(theirs(False))

    baseline = "spark structured streaming (RocksDBStateStoreProvider)"
    ls_name = "localstate run_stream (PageViewsPerHour, rocksdb + file changelog)"
    same = (f"output checked identical in the warm-up pair: {windows:,} windows, {views:,} views; "
            f"{len(mine.data_batches)} data micro-batches per run")
    base = make_row("stream_e2e", baseline, params | {"state_store": SPARK_STATE_STORE}, "events/s",
                    [n / r.seconds for r in peer_runs],
                    notes="groupBy(window 1h, user).count(), watermark 60 s, append, noop sink, "
                    "changelog checkpointing on; " + same)
    e2e = make_row("stream_e2e", ls_name, params, "events/s", [n / r.seconds for r in our_runs],
                   baseline=baseline, notes="interleaved with the Spark runs; " + same)
    e2e["ratio"] = e2e["median"] / base["median"] if base["median"] else None
    rows = [e2e, base]
    for name, runs in ((ls_name, our_runs), (baseline, peer_runs)):
        lat = [ms for r in runs for ms in latencies_ms(r)]
        rows.append(make_row("stream_batch_latency", name, params, "ms (median)", [statistics.median(lat)],
                             notes=f"triggerExecution of {len(lat)} data micro-batches over {len(runs)} runs"))
        rows.append(make_row("stream_batch_latency", name, params, "ms (p95)", [_percentile(lat, 95)]))
    ours_parts = localstate_breakdown(our_runs, our_docs)
    peer_parts = spark_breakdown(peer_runs)
    rows.append(make_row("stream_breakdown", ls_name, params, "ms per micro-batch",
                         [ours_parts["micro-batch (triggerExecution)"] * 1000], notes=format_parts(ours_parts)))
    rows.append(make_row("stream_breakdown", baseline, params, "ms per micro-batch",
                         [peer_parts["micro-batch (triggerExecution)"] * 1000], notes=format_parts(peer_parts)))
    return rows


# -- command line ------------------------------------------------------------------------------
def run_shape(shape: Callable[..., list[dict[str, Any]]], argv: list[str] | None,
              prog: str) -> list[dict[str, Any]]:
    """Run one streaming shape on its own ``local[2]`` session: ``[--quick] [--repeats N]
    [--spark-tasks S] [--json PATH]``; prints one line per row (and the load average) and
    returns the rows."""
    import argparse
    import json
    import tempfile

    from .spark_jobs import start_session

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--quick", action="store_true", help="the CI size")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (default 3)")
    parser.add_argument("--spark-tasks", type=int, default=None,
                        help=f"Spark tasks localstate's {TASKS} tasks run in (default: the session's cores)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    load = os.getloadavg()
    spark, owned = start_session(args.quick)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    try:
        rows = shape(spark, work, args.quick, args.repeats, spark_tasks=args.spark_tasks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owned:
            spark.stop()
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for r in rows:
        ratio = f"  ratio {r['ratio']:.2f}" if r["ratio"] is not None else ""
        print(f"{r['workload']:22} {r['engine'][:70]:70} {r['median']:>12,.0f} {r['unit']}"
              f"  runs {[round(x) for x in r['runs']]}{ratio}\n    {r['notes']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average_start": load, "rows": rows}, indent=1, default=str))
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.spark_streaming [--quick] [--repeats N] [--json PATH]``."""
    run_shape(stream_rows, argv, "python -m localstate.benchmarks.spark_streaming")


if __name__ == "__main__":
    main()
