"""The streaming shape: the windowed count as a Structured Streaming query.

The same page views as :mod:`localstate.benchmarks.spark_jobs` (5M events, 100k users,
6 hours; quick: 40k events, 1k users) are written in time order as Parquet files of
``events / (batches * FILES_PER_TRIGGER)`` rows and read by Spark's file source with
``maxFilesPerTrigger`` = :data:`FILES_PER_TRIGGER` and ``availableNow``: ``batches``
micro-batches of the same input (full size: 10 of 500k), on ``local[2]`` with 4 state
partitions. Windows stay open across micro-batches, so the state is carried from one
batch to the next — the shape a streaming user runs (the single-run rows of
``spark_jobs`` close most windows inside one run).

* ``localstate``: :meth:`StatefulJob.run_stream` with :class:`PageViewsPerHour`
  (rocksdb + the file changelog, or Kafka with ``--changelog kafka``; one exactly-once
  commit per task per micro-batch; the 4 tasks run in as many Spark tasks as the session
  has cores, ``--spark-tasks`` to change);
* ``spark``: ``groupBy(window(event_time, 1 hour), user_id).count()`` with a 60 s
  watermark, append mode, ``RocksDBStateStoreProvider`` with changelog checkpointing;
* the stateless floors, the same query with no state (:func:`floor_stream`):
  ``repartition(4, user_id)`` → ``mapInArrow`` (a pyarrow group-by per Arrow batch) —
  localstate's shuffle and Arrow hop into Python without the state — and
  ``groupBy(hour, user_id).count()`` inside ``foreachBatch`` (the JVM only);
* ``flink`` (when ``LOCALSTATE_FLINK_PYTHON`` names a Python with ``apache-flink==2.3.0``,
  see :mod:`localstate.benchmarks.peers`): Flink SQL's tumbling window count per
  ``(user, hour)`` with a 60 s watermark, RocksDB state backend, a checkpoint every
  second, parallelism 2 (:mod:`localstate.benchmarks.peers.flink_peer`), over the same
  events as CSV (converted untimed); one JVM serves every run, the first (checked) one
  warms it. Without the variable the row is left out and the localstate row says why.

They run interleaved (localstate, Spark, the mapInArrow floor, the JVM floor, Flink,
localstate, …) on one warm session. The warm-up round collects localstate's and Spark's
output and asserts it is identical (every ``(window_start, user_id, views)``), checks
that each floor counted every event, and compares Flink's windows with localstate's
(:func:`check_flink_output`); the timed runs write to the ``noop`` (Flink: ``blackhole``)
sink.

Rows: ``stream_e2e`` (events/s from ``start()`` to the end of the ``availableNow``
query — Flink: from submitting the ``INSERT`` to its job's end; the localstate row
carries the ratio to Spark's store), ``stream_e2e.vs_floor`` / ``.vs_jvm_floor`` /
``.vs_flink`` (localstate's rate over the other's, per interleaved round, unit ``x``),
``stream_batch_latency`` (median and p95 of the data micro-batches' ``triggerExecution``
in ms, from the query progress), and ``stream_breakdown``: where one micro-batch's time
goes for localstate, Spark's store and the mapInArrow floor (mean over the data
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.job_windowed import ALLOWED_LATENESS_S, PageViewsPerHour
from localstate.contrib.spark.jobs import job_config
from localstate.contrib.spark.runner import StatefulJob
from localstate.contrib.spark.workload import HOUR
from localstate.testing.spark import batch_stages

from .peers import FLINK_VERSION, ServedPeer, flink_python
from .runner import describe_error, error_row, make_row
from .spark_jobs import ENGINE, HOURS, SPARK_STATE_STORE, TASKS, Sizes, events, timed_task
from .stream_breakdown import (
    floor_breakdown,
    format_parts,
    latencies_ms,
    localstate_breakdown,
    percentile,
    spark_breakdown,
)
from .timing import Stopwatch

__all__ = ["StreamSizes", "STREAM_FULL", "STREAM_QUICK", "FILES_PER_TRIGGER", "write_stream_files",
           "localstate_stream", "spark_stream", "floor_stream", "hourly_counts", "spark_tasks_for", "StreamRun", "stream_rows", "finish_query",
           "format_parts", "latencies_ms", "localstate_breakdown", "spark_breakdown", "floor_breakdown",
           "write_csv_files", "check_flink_output", "run_shape", "main"]

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


JOB_OPTIONS: dict[str, Any] = {}
"""Extra :class:`StatefulJob` arguments of the suite's localstate jobs, set from the command
line (``--keep-open-s 0``: the same runs with every task's storage closed after each run)."""

CHANGELOG: dict[str, str] = {"name": "file"}
"""The localstate jobs' changelog: ``file`` (default), or with ``--changelog kafka`` an Apache Kafka
broker the run starts (``bootstrap``): the changelog and the checkpoints in Kafka."""


def changelog_overrides(task: type[Any], root: Path) -> dict[str, Any]:
    """The config keys putting ``task``'s stores and checkpoints on :data:`CHANGELOG`."""
    if CHANGELOG["name"] != "kafka":
        return {}
    topic = f"bench-{root.name}"
    return {"systems.kafka.bootstrap.servers": CHANGELOG["bootstrap"],
            "systems.kafka.checkpoint.topic": f"{topic}-checkpoints",
            **{f"stores.{store}.changelog": f"kafka.{topic}-{store}" for store in task.STORES}}


def spark_tasks_for(spark: Any, spark_tasks: int | None = None) -> int:
    """``spark_tasks`` if given, else the session's cores (``defaultParallelism``), at most
    the :data:`TASKS` state partitions: the Spark tasks localstate's 4 tasks run in, so a
    micro-batch's Python stage is one wave (``StatefulJob(spark_tasks=...)``)."""
    return spark_tasks if spark_tasks is not None else max(1, min(TASKS, spark.sparkContext.defaultParallelism))


def localstate_stream(spark: Any, input_dir: Path, root: Path, *, collect: bool = False,
                      timing_dir: Path | None = None, spark_tasks: int | None = None,
                      task: type[Any] = PageViewsPerHour) -> StreamRun:
    """``task`` (default :class:`PageViewsPerHour`) by :meth:`StatefulJob.run_stream` over
    ``input_dir`` with fresh state under ``root`` (rocksdb + the :data:`CHANGELOG`), its 4 tasks in
    :func:`spark_tasks_for` Spark tasks; with ``timing_dir``, the tasks' timers
    (:func:`timed_task`) are written there."""
    config = job_config(task, root, partitions=TASKS, engine=ENGINE).with_overrides(changelog_overrides(task, root))
    if timing_dir is not None:
        task = timed_task(task, str(timing_dir))
    job = StatefulJob(config, task, key=PageViewsPerHour.KEY, output_schema=PageViewsPerHour.OUTPUT_SCHEMA,
                      spark_tasks=spark_tasks_for(spark, spark_tasks), **JOB_OPTIONS)
    collected: list[pa.Table] = []
    output: Callable[[Any, int], None] | None = None
    if collect:
        def output(df: Any, _batch: int) -> None:
            collected.append(dataframe_to_arrow(df))

    def start() -> Any:
        return job.run_stream(_stream(spark, input_dir), checkpoint_location=str(root / "spark-checkpoint"),
                               trigger={"availableNow": True}, output=output)

    return finish_query(spark, start, collected if collect else None)


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

    def start() -> Any:
        return writer.trigger(availableNow=True).start()

    return finish_query(spark, start, collected if collect else None)


FLOOR_SCHEMA = "window_start long, user_id string, views long"


def hourly_counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The stateless floor's Python side: each Arrow batch's views per ``(hour, user)``, by
    one pyarrow group-by per batch (nothing kept between batches)."""
    for batch in batches:
        start = pc.multiply(pc.divide(batch.column("ts"), HOUR), HOUR)
        counts = (pa.table({"window_start": start, "user_id": batch.column("user_id")})
                  .group_by(["window_start", "user_id"]).aggregate([("user_id", "count")]))
        yield from counts.select(["window_start", "user_id", "user_id_count"]).rename_columns(
            ["window_start", "user_id", "views"]).to_batches()


def floor_stream(spark: Any, input_dir: Path, checkpoint: Path, *, jvm: bool = False,
                 totals: list[int] | None = None) -> StreamRun:
    """The same streaming query with no state: the input, ``foreachBatch``, and per
    micro-batch either (``jvm=False``) ``repartition(4, user_id)`` → ``mapInArrow``
    (:func:`hourly_counts`) — the shuffle and Arrow hop into Python of the localstate
    query — or (``jvm=True``) ``groupBy(hour, user_id).count()`` inside ``foreachBatch``,
    in the JVM only; written to the ``noop`` sink. With ``totals``, each micro-batch's
    sum of the counts is appended there instead (the warm-up's check that every event
    was counted)."""
    from pyspark.sql import functions as F

    stream = _stream(spark, input_dir)
    plan = stream if jvm else stream.repartition(TASKS, "user_id").mapInArrow(hourly_counts, FLOOR_SCHEMA)

    def sink(df: Any, _batch: int) -> None:
        if jvm:
            df = (df.groupBy((F.col("ts") - F.col("ts") % HOUR).alias("window_start"), "user_id").count()
                  .withColumnRenamed("count", "views"))
        if totals is None:
            df.write.format("noop").mode("overwrite").save()
        else:
            totals.append(int(df.agg(F.sum("views")).first()[0] or 0))

    def start() -> Any:
        return (plan.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())

    return finish_query(spark, start, None)


def finish_query(spark: Any, start: Callable[[], Any], collected: list[pa.Table] | None) -> StreamRun:
    """Start a query with ``start()``, wait for it to end and gather what it reported; the
    run's seconds are from the start to the end of the query."""
    with Stopwatch() as watch:
        query = start()
        query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"streaming query {query.name or query.id} failed: {query.exception()}")
    progress = [p if isinstance(p, dict) else p.jsonValue() for p in query.recentProgress]
    output = _sorted_output(collected) if collected is not None else None
    return StreamRun(watch.wall, progress, output, batch_stages(spark, str(query.runId)))


# -- the Flink peer --------------------------------------------------------------------------
FLINK_NAME = f"flink {FLINK_VERSION} SQL tumble window count (RocksDB, checkpoint 1 s, p=2, warm JVM)"


FLINK_PARALLELISM = 2


def write_csv_files(parquet_dir: Path, csv_dir: Path, files: int = FLINK_PARALLELISM) -> None:
    """The Parquet files of ``parquet_dir`` (read in name order: time order) as ``files``
    header-less CSV files (``ts,user_id``) under ``csv_dir``, row ``i`` in file ``i % files``:
    the Flink peer's input (untimed). One file per source subtask, each in time order over
    the whole time range: Flink's file source reads its files in no particular order, and
    a file taken up after a later one would have its events dropped as late by the
    watermark (the 50 files of the Spark input lost most of the first hours)."""
    import pyarrow.csv as pcsv

    csv_dir.mkdir(parents=True)
    table = pa.concat_tables(pq.read_table(path) for path in sorted(parquet_dir.glob("*.parquet")))
    for i in range(files):
        part = table.take(pa.array(np.arange(i, table.num_rows, files)))
        pcsv.write_csv(part, csv_dir / f"part-{i}.csv", pcsv.WriteOptions(include_header=False, quoting_style="none"))


def check_flink_output(output_dir: Path, ours: pa.Table, events: int) -> str:
    """Compare the Flink peer's windows (CSV files under ``output_dir``) with localstate's
    (``ours``: ``window_start, user_id, views`` sorted): every window localstate emitted is
    in Flink's output with the same count, Flink's other windows are later ones (the
    windows localstate's query still holds open when the input ends, which Flink's final
    watermark closes), and Flink counted every event. Returns what was checked; raises
    naming the first difference."""
    import pyarrow.csv as pcsv

    files = [f for f in sorted(output_dir.rglob("*")) if f.is_file() and not f.name.startswith((".", "_"))]
    if not files:
        raise RuntimeError(f"the Flink peer wrote no output under {output_dir}")
    columns = pcsv.ConvertOptions(column_types={"window_start": pa.int64(), "user_id": pa.string(),
                                                "views": pa.int64()})
    theirs = pa.concat_tables([pcsv.read_csv(f, pcsv.ReadOptions(column_names=["window_start", "user_id", "views"]),
                                             convert_options=columns) for f in files])
    total = int(pc.sum(theirs["views"]).as_py() or 0)
    if total != events:
        raise RuntimeError(f"the Flink peer counted {total:,} events, not {events:,}")
    last = pc.max(ours["window_start"]).as_py() if ours.num_rows else None
    closed = theirs.filter(pc.less_equal(theirs["window_start"], last)) if last is not None else theirs.slice(0, 0)
    closed = closed.sort_by([("window_start", "ascending"), ("user_id", "ascending")])
    if not closed.equals(ours):
        raise RuntimeError(
            f"Flink and localstate counted different windows: {closed.num_rows:,} vs {ours.num_rows:,} rows up to "
            f"window {last}, {pc.sum(closed['views'])} vs {pc.sum(ours['views'])} views")
    return (f"Flink's output checked in its warm-up run: the same {ours.num_rows:,} windows and counts as "
            f"localstate's, {theirs.num_rows - closed.num_rows:,} later windows that only Flink's end of input "
            f"closes, {total:,} events counted")


# -- the rows --------------------------------------------------------------------------------
def stream_rows(spark: Any, work: Path, quick: bool, repeats: int, spark_tasks: int | None = None) -> list[dict[str, Any]]:
    """The streaming rows (see the module docstring) on ``spark``, with scratch space under
    ``work``; ``repeats`` timed rounds (localstate, Spark's store, the two floors, Flink)
    after one verified warm-up round; localstate's tasks in ``spark_tasks`` Spark tasks
    (:func:`spark_tasks_for`)."""
    import contextlib
    import json

    from .peers.flink_peer import RESULT_PREFIX

    sizes = STREAM_QUICK if quick else STREAM_FULL
    table = events(Sizes(sizes.events, sizes.users, sample_every=1))
    n = table.num_rows
    input_dir = work / "stream-input"
    write_stream_files(table, input_dir, sizes.batches * FILES_PER_TRIGGER)
    del table
    params = {"events": n, "users": sizes.users, "hours": HOURS, "micro_batches": sizes.batches,
              "maxFilesPerTrigger": FILES_PER_TRIGGER, "trigger": "availableNow", "tasks": TASKS,
              "master": spark.sparkContext.master, "engine": ENGINE, "changelog": CHANGELOG["name"],
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

    def floor(jvm: bool, totals: list[int] | None = None) -> StreamRun:
        checkpoint = fresh("stream-floor")
        try:
            return floor_stream(spark, input_dir, checkpoint, jvm=jvm, totals=totals)
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    flink_python_path, flink_how = flink_python()
    flink_error: str | None = None  # a failing Flink peer becomes an error cell; the other rows stay
    with contextlib.ExitStack() as stack:
        flink: ServedPeer | None = None
        if flink_python_path is not None:
            csv_dir = work / "stream-input-csv"
            write_csv_files(input_dir, csv_dir)
            flink_work = fresh("flink")
            try:
                flink = stack.enter_context(ServedPeer(
                    flink_python_path, "flink_peer.py",
                    [str(csv_dir), str(flink_work), "--parallelism", str(FLINK_PARALLELISM)], RESULT_PREFIX,
                    work / "flink-peer.stderr"))
            except Exception as e:
                flink_error = describe_error(e)

        # warm-up round, collected and compared
        mine, _ = ours(True)
        peer = theirs(True)
        floor_totals: dict[str, list[int]] = {"py": [], "jvm": []}
        floor_runs = {"py": floor(False, floor_totals["py"]), "jvm": floor(True, floor_totals["jvm"])}
        for who, run in (("localstate", mine), ("spark", peer), *(
                (f"{k} floor", r) for k, r in floor_runs.items())):
            if run.input_rows != n:
                raise RuntimeError(f"the {who} query read {run.input_rows:,} rows, not {n:,}")
        for who, totals in floor_totals.items():
            if sum(totals) != n:
                raise RuntimeError(f"the {who} floor counted {sum(totals):,} views, not {n:,}")
        assert mine.output is not None and peer.output is not None
        if not mine.output.equals(peer.output):
            raise RuntimeError(
                f"localstate and Spark emitted different windows: {mine.output.num_rows:,} vs "
                f"{peer.output.num_rows:,} rows, {pa.compute.sum(mine.output['views'])} vs "
                f"{pa.compute.sum(peer.output['views'])} views")
        flink_checked = ""
        if flink is not None:
            flink_out = fresh("flink-out")
            try:
                flink.ask({"run": "warmup", "output": str(flink_out)})
                flink_checked = check_flink_output(flink_out, mine.output, n)
            except Exception as e:
                flink, flink_error = None, describe_error(e)
            shutil.rmtree(flink_out, ignore_errors=True)
        windows = mine.output.num_rows
        views = int(pa.compute.sum(mine.output["views"]).as_py() or 0)

        our_runs: list[StreamRun] = []
        our_docs: list[list[dict[str, Any]]] = []
        peer_runs: list[StreamRun] = []
        py_floor: list[StreamRun] = []
        jvm_floor: list[StreamRun] = []
        flink_s: list[float] = []
        for i in range(repeats):
            run, docs = ours(False)
            our_runs.append(run)
            our_docs.append(docs)
            peer_runs.append(theirs(False))
            py_floor.append(floor(False))
            jvm_floor.append(floor(True))
            if flink is not None:
                try:
                    flink_s.append(float(flink.ask({"run": f"timed{i}"})["seconds"]))
                except Exception as e:
                    flink, flink_error, flink_s = None, describe_error(e), []

    baseline = "spark structured streaming (RocksDBStateStoreProvider)"
    ls_name = f"localstate run_stream (PageViewsPerHour, rocksdb + {CHANGELOG['name']} changelog)"
    py_name = "spark, no state: repartition(4, user) -> mapInArrow (pyarrow group-by per batch)"
    jvm_name = "spark, no state: groupBy(hour, user).count() in foreachBatch (JVM only)"
    same = (f"output checked identical in the warm-up round: {windows:,} windows, {views:,} views; "
            f"{len(mine.data_batches)} data micro-batches per run")
    interleaved = "interleaved with localstate, Spark's store, the two floors" + (" and Flink" if flink_s else "")
    base = make_row("stream_e2e", baseline, params | {"state_store": SPARK_STATE_STORE}, "events/s",
                    [n / r.seconds for r in peer_runs],
                    notes="groupBy(window 1h, user).count(), watermark 60 s, append, noop sink, "
                    "changelog checkpointing on; " + same)
    e2e = make_row("stream_e2e", ls_name, params, "events/s", [n / r.seconds for r in our_runs],
                   baseline=baseline, notes=f"{interleaved}; " + same
                   + ("" if flink_s else f"; Flink not run: {flink_error or flink_how}"))
    e2e["ratio"] = e2e["median"] / base["median"] if base["median"] else None
    floor_notes = (f"the same query shape with no state (every view counted per micro-batch, checked in the "
                   f"warm-up round), foreachBatch, noop sink; {interleaved}")
    rows = [e2e, base,
            make_row("stream_e2e", py_name, params, "events/s", [n / r.seconds for r in py_floor],
                     notes=f"{TASKS} Spark tasks, one pyarrow group-by per Arrow batch; {floor_notes}"),
            make_row("stream_e2e", jvm_name, params, "events/s", [n / r.seconds for r in jvm_floor],
                     notes=floor_notes)]
    versus: list[tuple[str, str, list[Any]]] = [("stream_e2e.vs_floor", py_name, py_floor),
                                                ("stream_e2e.vs_jvm_floor", jvm_name, jvm_floor)]
    if flink_error is not None:
        rows.append(error_row("stream_e2e", FLINK_NAME, params, "events/s", flink_error))
    if flink_s:
        rows.append(make_row("stream_e2e", FLINK_NAME, params | {"parallelism": FLINK_PARALLELISM, "checkpoint_ms": 1000},
                             "events/s", [n / x for x in flink_s],
                             notes=f"submit INSERT to job finished, blackhole sink, JVM warmed by the checked "
                             f"run; the Parquet input as {FLINK_PARALLELISM} CSV files, one per source subtask (untimed); "
                             f"peer run by {flink_how}; {flink_checked}"))
    if flink_s:
        versus.append(("stream_e2e.vs_flink", FLINK_NAME, flink_s))
    for workload, name, runs in versus:
        other = [r if isinstance(r, float) else r.seconds for r in runs]
        pairs = [theirs_s / mine_run.seconds for mine_run, theirs_s in zip(our_runs, other)]
        ratio = make_row(workload, ls_name, params, "x", pairs, baseline=name,
                         notes=f"localstate events/s / {name}'s, per interleaved round (same input, same run)")
        ratio["ratio"] = ratio["median"]
        rows.append(ratio)
    for name, runs in ((ls_name, our_runs), (baseline, peer_runs), (py_name, py_floor)):
        lat = [ms for r in runs for ms in latencies_ms(r)]
        rows.append(make_row("stream_batch_latency", name, params, "ms (median)", [statistics.median(lat)],
                             notes=f"triggerExecution of {len(lat)} data micro-batches over {len(runs)} runs"))
        rows.append(make_row("stream_batch_latency", name, params, "ms (p95)", [percentile(lat, 95)]))
    ours_parts = localstate_breakdown(our_runs, our_docs)
    peer_parts = spark_breakdown(peer_runs)
    floor_parts = floor_breakdown(py_floor)
    for name, parts in ((ls_name, ours_parts), (baseline, peer_parts), (py_name, floor_parts)):
        rows.append(make_row("stream_breakdown", name, params, "ms per micro-batch",
                             [parts["micro-batch (triggerExecution)"] * 1000], notes=format_parts(parts)))
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
    parser.add_argument("--keep-open-s", type=float, default=None,
                        help="StatefulJob(keep_open_s=...) of localstate's jobs (default: the job's own)")
    parser.add_argument("--changelog", choices=["file", "kafka"], default="file",
                        help="localstate's changelog: file (default) or kafka (an Apache Kafka node started here)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.keep_open_s is not None:
        JOB_OPTIONS["keep_open_s"] = args.keep_open_s
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    load = os.getloadavg()
    spark, owned = start_session(args.quick)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    broker = None
    try:
        if args.changelog == "kafka":
            # Apache Kafka, not tansu: tansu 0.6.0 can leave one of the tasks' overlapping
            # transactions on the shared checkpoint partition unresolved, which stops a
            # streaming run (docs/changelogs.md, Kafka)
            from localstate.testing.apache_kafka import ApacheKafkaBroker

            broker = ApacheKafkaBroker().start()
            CHANGELOG.update(name="kafka", bootstrap=broker.bootstrap)
        rows = shape(spark, work, args.quick, args.repeats, spark_tasks=args.spark_tasks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if broker is not None:
            broker.close()
        if owned:
            spark.stop()
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for r in rows:
        ratio = f"  ratio {r['ratio']:.2f}" if r["ratio"] is not None else ""
        digits = 2 if r["unit"] == "x" else 0
        print(f"{r['workload']:22} {r['engine'][:70]:70} {r['median']:>12,.{digits}f} {r['unit']}"
              f"  runs {[round(x, digits) for x in r['runs']]}{ratio}\n    {r['notes']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average_start": load, "rows": rows}, indent=1, default=str))
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.spark_streaming [--quick] [--repeats N] [--json PATH]``."""
    run_shape(stream_rows, argv, "python -m localstate.benchmarks.spark_streaming")


if __name__ == "__main__":
    main()
