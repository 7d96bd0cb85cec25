"""The Spark figures: a localstate job against Spark's own RocksDB state store.

The suite also runs the streaming shapes on the same session: the windowed count
as a Structured Streaming query over micro-batches (:mod:`.spark_streaming`) and Kafka
end to end against Quix Streams (:mod:`.spark_kafka`); their rows are described there.

The job is the windowed count of the examples (:class:`PageViewsPerHour`: page views
per user per hour, emitted when the hour closes) over the synthetic page views of
:mod:`localstate.contrib.spark.workload`: 5M events, 100k users, 6 hours, 4 tasks on
``local[2]``, rocksdb engine + file changelog (``quick``: 20k events, 1k users).
The input is written once to Parquet (one file per hour) so every Spark run reads
the same files; output goes to Spark's ``noop`` sink.

Rows (``engine`` says which path / system):

* ``spark_session_start`` — seconds to start the ``local[2]`` session (once).
* ``windowed_e2e`` — events/s of one job run on a warm session: the Parquet read, the
  shuffle by user, the tasks, their commits (job scheduling and Python worker reuse
  included, session start excluded). Arrow path at full size; per-record path on a
  1-in-10 sample of the events (same hours and users) because it is ~20x slower. The
  Spark Structured Streaming row is the same count done by Spark itself
  (``groupBy(window(1 hour), user_id).count()`` with a 60 s watermark, append mode,
  ``RocksDBStateStoreProvider`` with changelog checkpointing, the Parquet files as a
  file source with ``availableNow`` — one micro-batch of data, then the no-data batch
  that evicts the closed windows — 4 shuffle/state partitions); it emits the same
  windows as the localstate job. The Arrow row's ``ratio`` is localstate / Spark.
* ``windowed_state_work`` — state work only. *In Spark tasks*: timers inside each task
  (``init`` + every ``process_batch`` + ``window`` + the runner's ``commit``, wall
  clock), summed over the 4 tasks: ``events / Σ task seconds`` is events/s **per
  core**; ``events / (Σ / 2)`` is the rate of the 2 cores together (unit ``events/s
  on 2 cores``). The tasks' own CPU time (``thread_time``) is in the notes: on 2 cores
  the tasks share the CPUs with Spark's JVM (Parquet, shuffle, Arrow transfer), so the
  wall figure includes waiting. *No Spark*: :func:`run_partition` driven directly with
  the same Arrow batches (50k rows, as ``maxRecordsPerBatch``) for the 4 partitions one
  after another in this process: one core, no JVM; storage open excluded.
  ``hourly runs``: the same without Spark, but the input fed as 6 runs of one hour
  each (commit per run), so every window goes through the store (put, then scan and
  delete when it closes) instead of closing within the run.
* ``windowed_restore`` — state loss: delete ``job.state.dir/<job>`` and reopen all 4
  partitions' TaskStorage (restore from the file changelog, its shipped snapshots not
  used), after a one-run job and after the 6 hourly runs; records/s of changelog records
  replayed, and seconds.

``python -m localstate.benchmarks.spark_jobs profile [--events N]`` prints a cProfile
of the Arrow-path task (no Spark) by cumulative and own time.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import shutil
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from localstate import Config
from localstate.contrib.spark.job_windowed import ALLOWED_LATENESS_S, PageViewsPerHour
from localstate.contrib.spark.jobs import job_config, restore_state
from localstate.contrib.spark.runner import (
    Emitter,
    StatefulJob,
    StreamTask,
    TaskContext,
    TaskRun,
    run_partition,
)
from localstate.contrib.spark.workload import HOUR, generate

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run", "Sizes", "FULL", "QUICK", "PerRecordPageViews", "timed_task", "profile_arrow", "main"]

MASTER = "local[2]"
CORES = 2
TASKS = 4
HOURS = 6
BATCH_ROWS = 50_000
"""Rows per Arrow batch handed to a task (the session's ``maxRecordsPerBatch``)."""
TARGET_PER_CORE = 1_000_000
ENGINE = "rocksdb"
SPARK_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT = pa.schema([("window_start", pa.int64()), ("user_id", pa.string()), ("views", pa.int64())])


@dataclass(frozen=True)
class Sizes:
    events: int
    users: int
    sample_every: int
    """The per-record path runs on every ``sample_every``-th event."""


FULL = Sizes(events=5_000_000, users=100_000, sample_every=10)
QUICK = Sizes(events=20_000, users=1_000, sample_every=4)


class PerRecordPageViews(PageViewsPerHour):
    """:class:`PageViewsPerHour` on the per-record path: every row becomes a dict and
    goes through :meth:`PageViewsPerHour.process` (same stores, same output)."""

    process_batch = StreamTask.process_batch


def timed_task(base: type[StreamTask], timing_dir: str) -> type[StreamTask]:
    """``base`` with timers: wall and thread CPU seconds of ``init``, every
    ``process_batch``, ``window`` and the runner's ``storage.commit``, written as one
    JSON file per task run under ``timing_dir`` when the task closes.

    Also recorded (not part of :attr:`TaskTimes.parts`): ``open``, the runner's storage
    open before ``init`` (:attr:`TaskContext.open_seconds`); ``input``, the wall time
    between the task's calls while the runner waits for the next input batch (shuffle
    read and Arrow transfer from the JVM) or hands output batches back; ``version``,
    the version the run committed (the micro-batch id when streaming).

    Built in a function so Spark pickles the class (and ``timing_dir``) by value.
    """

    class Timed(base):  # type: ignore[valid-type, misc]
        def init(self, context: TaskContext) -> None:
            self._timing: dict[str, Any] = {"partition": context.partition, "rows": 0,
                                            "open": context.open_seconds, "input": 0.0, "kept_open": context.kept_open}
            self._clock("init", super().init, context)
            self._storage = storage = context.storage
            commit = type(storage).commit.__get__(storage)  # the method, not an earlier run's wrapper of a kept storage

            def timed_commit(*args: Any, **kwargs: Any) -> Any:
                return self._clock("commit", commit, *args, **kwargs)

            storage.commit = timed_commit  # type: ignore[method-assign]
            self._idle_since = time.perf_counter()

        def _waited(self) -> None:
            self._timing["input"] += time.perf_counter() - self._idle_since

        def _clock(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            watch = Stopwatch(cpu=True)
            try:
                with watch:
                    return fn(*args, **kwargs)
            finally:
                t = self._timing
                t[what] = t.get(what, 0.0) + watch.wall
                t["cpu"] = t.get("cpu", 0.0) + watch.thread

        def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
            self._waited()
            self._timing["rows"] += batch.num_rows
            self._clock("process_batch", super().process_batch, batch, emit)
            self._idle_since = time.perf_counter()

        def window(self, emit: Emitter) -> None:
            self._waited()
            self._clock("window", super().window, emit)

        def close(self) -> None:
            super().close()
            checkpoint = self._storage.checkpoint if hasattr(self, "_storage") else None
            self._timing["version"] = checkpoint.version if checkpoint is not None else None
            path = Path(timing_dir) / f"{self._timing['partition']}-{uuid.uuid4().hex}.json"
            path.write_text(json.dumps(self._timing))

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


@dataclass
class TaskTimes:
    """Task timers of one job run, summed over its tasks."""

    tasks: int
    rows: int
    wall: float
    cpu: float
    parts: dict[str, float]

    @classmethod
    def read(cls, timing_dir: Path) -> TaskTimes:
        docs = [json.loads(p.read_text()) for p in timing_dir.glob("*.json")]
        parts = {k: sum(d.get(k, 0.0) for d in docs) for k in ("init", "process_batch", "window", "commit")}
        return cls(len(docs), sum(d["rows"] for d in docs), sum(parts.values()), sum(d["cpu"] for d in docs), parts)


# -- data ------------------------------------------------------------------------------------
def events(sizes: Sizes) -> pa.Table:
    """The page views (``ts``, ``user_id``) of the benchmark, in time order."""
    return PageViewsPerHour.input_table(generate(sizes.events, users=sizes.users, hours=HOURS, seed=7))


def write_hourly_parquet(table: pa.Table, directory: Path) -> None:
    """One Parquet file per hour of ``table`` under ``directory``."""
    directory.mkdir(parents=True)
    ts = table.column("ts").to_numpy()
    hour = (ts - ts.min() // HOUR * HOUR) // HOUR
    for h in np.unique(hour):
        pq.write_table(table.filter(pa.array(hour == h)), directory / f"hour-{int(h):02d}.parquet")


def split_by_key(table: pa.Table, key: str, partitions: int) -> list[pa.Table]:
    """``table`` split into ``partitions`` by a hash of ``key`` (order kept within each)."""
    encoded = pc.dictionary_encode(table.column(key)).combine_chunks()
    part_of = np.array([zlib.crc32(k.encode()) % partitions for k in encoded.dictionary.to_pylist()])
    part = part_of[encoded.indices.to_numpy()]
    return [table.filter(pa.array(part == p)) for p in range(partitions)]


# -- state work without Spark ---------------------------------------------------------------
def run_tasks(config: Config, task: type[StreamTask], parts: list[pa.Table]) -> int:
    """Run every partition's task over its table, in this process; returns emitted rows."""
    emitted = 0
    for p, part in enumerate(parts):
        for batch in run_partition(TaskRun(config, task, OUTPUT), p, iter(part.to_batches(BATCH_ROWS))):
            emitted += batch.num_rows
    return emitted


def hourly_slices(part: pa.Table) -> list[pa.Table]:
    """``part`` cut at hour boundaries (the input of one run per hour)."""
    ts = part.column("ts").to_numpy()
    hours = (ts - ts.min() // HOUR * HOUR) // HOUR
    cuts = np.searchsorted(hours, np.arange(1, hours.max() + 1), side="left")
    bounds = [0, *cuts.tolist(), part.num_rows]
    return [part.slice(a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]


def state_work_no_spark(
    parts: list[pa.Table], task: type[StreamTask], root: Path, *, hourly_runs: bool = False
) -> tuple[float, Config, int]:
    """Seconds of state work for all partitions on one core (storage open excluded: the
    task's timers), with fresh state under ``root``; returns them, the job config and
    the number of windows emitted."""
    timing = root / "timing"
    timing.mkdir(parents=True)
    config = job_config(PageViewsPerHour, root, partitions=len(parts), engine=ENGINE)
    timed = timed_task(task, str(timing))
    if hourly_runs:
        slices = [hourly_slices(p) for p in parts]
        emitted = sum(run_tasks(config, timed, [s[h] if h < len(s) else s[0].slice(0, 0) for s in slices])
                      for h in range(max(len(s) for s in slices)))
    else:
        emitted = run_tasks(config, timed, parts)
    return TaskTimes.read(timing).wall, config, emitted


# -- Spark -----------------------------------------------------------------------------------
SESSION_CONF = {
    "spark.sql.shuffle.partitions": str(TASKS),
    "spark.sql.streaming.stateStore.providerClass": SPARK_STATE_STORE,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
"""SQL settings of the suite (4 shuffle and state-store partitions, Spark's RocksDB store)."""


def start_session(quick: bool) -> tuple[Any, bool]:
    """The Spark session of the suite and whether the suite started it (and must stop it).

    An active session in this process (e.g. a test's) is reused with :data:`SESSION_CONF`
    set on it, since a second one cannot be started beside it.
    """
    from localstate.contrib.spark import spark_session
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in SESSION_CONF.items():
            active.conf.set(key, value)
        return active, False
    from localstate.testing.kafka_connector import kafka_connector_conf

    # Spark's Kafka connector for the Kafka rows (:mod:`.spark_kafka`): local jars, fetched once
    # (without Maven the session starts without it and those rows report the error)
    try:
        connector = kafka_connector_conf()
    except RuntimeError:
        connector = {}
    return spark_session(MASTER, app_name="localstate-bench-spark", **SESSION_CONF, **connector,
                         **{"spark.driver.memory": "2g" if quick else "4g"}), True


def localstate_job(spark: Any, input_dir: Path, task: type[StreamTask], root: Path) -> tuple[float, TaskTimes, Config]:
    """One batch run of the job over ``input_dir`` with fresh state under ``root``:
    wall seconds of the run, the task timers, the config."""
    timing = root / "timing"
    timing.mkdir(parents=True)
    config = job_config(PageViewsPerHour, root, partitions=TASKS, engine=ENGINE)
    job = StatefulJob(config, timed_task(task, str(timing)), key=PageViewsPerHour.KEY,
                      output_schema=PageViewsPerHour.OUTPUT_SCHEMA)
    with Stopwatch() as watch:
        job.run(spark.read.parquet(str(input_dir))).write.format("noop").mode("overwrite").save()
    return watch.wall, TaskTimes.read(timing), config


def spark_state_store_job(spark: Any, input_dir: Path, checkpoint: Path) -> tuple[float, dict[str, int]]:
    """Spark Structured Streaming's own windowed count over ``input_dir`` (RocksDB state
    store): wall seconds until the ``availableNow`` query ends, and what its progress
    reports say (micro-batches, input rows, emitted windows, state rows left)."""
    from pyspark.sql import functions as F

    stream = spark.readStream.schema("ts long, user_id string").parquet(str(input_dir))
    counts = (
        stream.withColumn("event_time", F.timestamp_seconds("ts"))
        .withWatermark("event_time", f"{ALLOWED_LATENESS_S} seconds")
        .groupBy(F.window("event_time", "1 hour"), "user_id")
        .count()
    )
    with Stopwatch() as watch:
        query = (counts.writeStream.format("noop").outputMode("append")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination()
    seconds = watch.wall
    if query.exception() is not None:
        raise RuntimeError(f"Spark state-store query failed: {query.exception()}")
    progress = query.recentProgress
    state = progress[-1]["stateOperators"][0] if progress and progress[-1]["stateOperators"] else {}
    return seconds, {
        "batches": len(progress),
        "input_rows": sum(p["numInputRows"] for p in progress),
        "emitted": sum(p["sink"].get("numOutputRows", 0) for p in progress),
        "state_rows": state.get("numRowsTotal", -1),
    }


# -- the suite -------------------------------------------------------------------------------
def _fresh(work: Path, name: str) -> Path:
    path = work / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Every row of the suite (see the module docstring); warm-up + ``repeats`` runs each."""
    sizes = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        return _run(sizes, repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(sizes: Sizes, repeats: int, work: Path) -> list[dict[str, Any]]:
    table = events(sizes)
    sample = table.take(pa.array(np.arange(0, table.num_rows, sizes.sample_every)))
    n, n_sample = table.num_rows, sample.num_rows
    params = {"events": n, "users": sizes.users, "hours": HOURS, "tasks": TASKS, "master": MASTER,
              "engine": ENGINE, "changelog": "file", "batch_rows": BATCH_ROWS}
    sample_params = params | {"events": n_sample, "sample": f"every {sizes.sample_every}th event"}
    rows: list[dict[str, Any]] = []

    def repeat(trial: Callable[[], float]) -> list[float]:
        trial()  # warm-up
        return [trial() for _ in range(repeats)]

    # -- no Spark: state work on one core, profile-free ------------------------------------
    parts = split_by_key(table, PageViewsPerHour.KEY, TASKS)
    sample_parts = split_by_key(sample, PageViewsPerHour.KEY, TASKS)
    no_spark = "run_partition, no Spark, 1 core"
    emitted: dict[str, int] = {}
    for engine, task, ps, count, prm, hourly in (
        (f"localstate arrow ({no_spark})", PageViewsPerHour, parts, n, params, False),
        (f"localstate arrow ({no_spark}, hourly runs)", PageViewsPerHour, parts, n, params, True),
        (f"localstate arrow ({no_spark}, sample)", PageViewsPerHour, sample_parts, n_sample, sample_params, False),
        (f"localstate per-record ({no_spark}, sample)", PerRecordPageViews, sample_parts, n_sample,
         sample_params, False),
    ):
        def trial(task: type[StreamTask] = task, ps: list[pa.Table] = ps, count: int = count,
                  hourly: bool = hourly) -> float:
            root = _fresh(work, "nospark")
            try:
                seconds, _config, emitted["windows"] = state_work_no_spark(ps, task, root, hourly_runs=hourly)
                return count / seconds
            finally:
                shutil.rmtree(root, ignore_errors=True)

        runs = repeat(trial)
        notes = f"{emitted['windows']:,} windows emitted" + (
            f"; target >= {TARGET_PER_CORE:,}/s per core" if task is PageViewsPerHour else "")
        rows.append(make_row("windowed_state_work", engine, prm, "events/s per core", runs, notes=notes))

    # -- restore after state loss ----------------------------------------------------------
    for label, hourly in (("after one run", False), ("after 6 hourly runs", True)):
        root = _fresh(work, "restore")
        config = state_work_no_spark(parts, PageViewsPerHour, root, hourly_runs=hourly)[1]
        # the replay from the changelog (a move that fetches a shipped snapshot is `--suite moves`)
        config = config.with_overrides({"systems.file.snapshots": False})
        reports = [restore_state(config) for _ in range(repeats + 1)][1:]
        records = reports[0].records
        restore_params = params | {"restored_records": records, "restored_bytes": reports[0].bytes,
                                   "state_keys": sum(len(s) for s in reports[0].snapshot.values())}
        engine = f"localstate {ENGINE}+file, 4 partitions {label}"
        rows.append(make_row("windowed_restore", engine, restore_params, "records/s",
                             [r.records_per_second for r in reports],
                             notes="delete job.state.dir/<job>, reopen 4 TaskStorages in one process"))
        rows.append(make_row("windowed_restore", engine, restore_params, "s", [r.seconds for r in reports]))
        shutil.rmtree(root, ignore_errors=True)
    del parts, sample_parts

    # -- Spark -----------------------------------------------------------------------------
    full_dir, sample_dir = work / "input", work / "input-sample"
    write_hourly_parquet(table, full_dir)
    write_hourly_parquet(sample, sample_dir)
    del table, sample
    with Stopwatch() as session_start:
        spark, owned = start_session(quick=sizes is QUICK)
    master = spark.sparkContext.master
    if owned:
        rows.append(make_row("spark_session_start", master, {"master": master}, "s", [session_start.wall],
                             notes="one start, not repeated"))
    try:
        rows += _spark_rows(spark, full_dir, sample_dir, n, n_sample, params | {"master": master},
                            sample_params | {"master": master}, repeat, work)
        rows += _streaming_shapes(spark, work, sizes is QUICK, repeats)
    finally:
        if owned:
            spark.stop()
    return rows


def _streaming_shapes(spark: Any, work: Path, quick: bool, repeats: int) -> list[dict[str, Any]]:
    """The streaming shapes on the same session (:mod:`.spark_streaming`,
    :mod:`.spark_kafka`); a shape that fails becomes one error row, the others stay."""
    from .runner import describe_error, error_row
    from .spark_kafka import kafka_rows
    from .spark_streaming import stream_rows

    rows: list[dict[str, Any]] = []
    for workload, shape in (("stream_e2e", stream_rows), ("kafka_e2e", kafka_rows)):
        try:
            rows += shape(spark, work, quick, repeats)
        except Exception as e:
            rows.append(error_row(workload, "-", {}, "events/s", describe_error(e)))
    return rows


def _spark_rows(spark: Any, full_dir: Path, sample_dir: Path, n: int, n_sample: int, params: dict[str, Any],
                sample_params: dict[str, Any], repeat: Callable[[Callable[[], float]], list[float]],
                work: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    spark_rows: dict[str, int] = {}

    def spark_trial() -> float:
        checkpoint = _fresh(work, "spark-checkpoint")
        try:
            seconds, stats = spark_state_store_job(spark, full_dir, checkpoint)
            spark_rows.update(stats)
            return n / seconds
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    baseline = "spark structured streaming (RocksDBStateStoreProvider)"
    base = make_row("windowed_e2e", baseline, params | {"state_store": SPARK_STATE_STORE}, "events/s",
                    repeat(spark_trial), notes="groupBy(window 1h, user).count(), watermark 60 s, append, "
                    "availableNow file source, noop sink, changelog checkpointing on")
    base["notes"] += (f"; last run: {spark_rows['batches']} micro-batches, {spark_rows['emitted']:,} windows "
                      f"emitted, {spark_rows['state_rows']:,} state rows left")
    if spark_rows["input_rows"] != n:
        base["notes"] += f"; WARNING: the query read {spark_rows['input_rows']} rows, not {n}"

    for label, task, directory, count, prm in (
        ("arrow", PageViewsPerHour, full_dir, n, params),
        ("per-record", PerRecordPageViews, sample_dir, n_sample, sample_params),
    ):
        times: list[TaskTimes] = []

        def trial(task: type[StreamTask] = task, directory: Path = directory, count: int = count,
                  times: list[TaskTimes] = times) -> float:
            root = _fresh(work, "job")
            try:
                seconds, timers, _config = localstate_job(spark, directory, task, root)
                if timers.rows != count or timers.tasks != TASKS:
                    raise RuntimeError(f"{timers.tasks} task runs saw {timers.rows} rows, expected {TASKS} / {count}")
                times.append(timers)
                return count / seconds
            finally:
                shutil.rmtree(root, ignore_errors=True)

        e2e = make_row("windowed_e2e", f"localstate {label} (StatefulJob on Spark)", prm, "events/s",
                       repeat(trial), baseline=baseline if label == "arrow" else None,
                       notes="Parquet read + shuffle by user + 4 tasks + commits, warm session, noop sink")
        if label == "arrow" and base["median"]:
            e2e["ratio"] = e2e["median"] / base["median"]
        measured = times[1:]  # the first entry is the warm-up
        per_core = [count / t.wall for t in measured]
        split = {k: round(sum(t.parts[k] for t in measured) / len(measured), 3) for k in measured[0].parts}
        cpu = sorted(count / t.cpu for t in measured)[len(measured) // 2]
        rows += [
            e2e,
            make_row("windowed_state_work", f"localstate {label} (in Spark tasks)", prm, "events/s per core",
                     per_core, notes=f"events / Σ task wall s (init+process_batch+window+commit); s per part, "
                     f"Σ over the 4 tasks, mean of the runs: {split}; by task CPU time: {cpu:,.0f}/s per core"
                     + (f"; target >= {TARGET_PER_CORE:,}/s per core" if label == "arrow" else "")),
            make_row("windowed_state_work", f"localstate {label} (in Spark tasks)", prm, f"events/s on {CORES} cores",
                     [r * CORES for r in per_core], notes=f"events / (Σ task wall s / {CORES} cores)"),
        ]
    rows.append(base)
    return rows


# -- profile ---------------------------------------------------------------------------------
def profile_arrow(sizes: Sizes = FULL, top: int = 25) -> str:
    """cProfile of the Arrow-path task over every partition (no Spark): the report sorted by
    cumulative and by own time, with the unprofiled rate first."""
    table = events(sizes)
    parts = split_by_key(table, PageViewsPerHour.KEY, TASKS)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-profile-"))
    try:
        seconds = state_work_no_spark(parts, PageViewsPerHour, work / "plain")[0]
        config = job_config(PageViewsPerHour, work / "profiled", partitions=TASKS, engine=ENGINE)
        profiler = cProfile.Profile()
        profiler.enable()
        run_tasks(config, PageViewsPerHour, parts)
        profiler.disable()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = io.StringIO()
    out.write(f"{table.num_rows:,} events, {TASKS} partitions, unprofiled task time {seconds:.2f} s "
              f"= {table.num_rows / seconds:,.0f} events/s per core\n")
    for order in ("cumulative", "tottime"):
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.spark_jobs profile [--events N] [--users N]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localstate.benchmarks.spark_jobs")
    parser.add_argument("command", choices=["profile"])
    parser.add_argument("--events", type=int, default=FULL.events)
    parser.add_argument("--users", type=int, default=FULL.users)
    args = parser.parse_args(argv)
    print(profile_arrow(Sizes(args.events, args.users, FULL.sample_every)))


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
