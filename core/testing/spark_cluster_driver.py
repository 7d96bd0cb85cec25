"""A Spark driver for the ``local-cluster`` tests, run in its own process.

A process can hold only one SparkContext and the shared ``spark`` fixture is
``local[2]``, so tests that need several executor JVMs start this module::

    python -m localstate.testing.spark_cluster_driver stream --root DIR --input DIR

It runs the :class:`~localstate.testing.spark.KeyCount` job (rocksdb engine, file
changelog) over the JSON-lines files under ``--input`` (rows ``{"user_id": str}``):

* ``batch`` — one :meth:`StatefulJob.run` under ``ROOT/batch``; the emitted rows go
  to ``ROOT/batch/output.json``;
* ``stream`` — Structured Streaming under ``ROOT/stream``, one file per micro-batch
  (``availableNow``); batch ``B``'s emitted rows go to ``ROOT/stream/output/batch-B.json``;
* ``all`` — both in one Spark application (one session start instead of two).

Under each job root ``J``, ``job.state.dir`` is ``J/state/{executor}`` (one local
state dir per executor) while the changelog ``J/changelog`` is shared. Every task run
writes JSON events to ``J/events`` (:func:`read_events`): ``start`` after its storage
opened, with the executor id and what the restore did, and ``close`` with the
version it left committed. ``ROOT/result.json`` (status, Spark app id, timings) is
written last; the exit code is 0 on success.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localstate import Config
from localstate.contrib.spark.placement import Placement
from localstate.testing.processes import kill_tree
from localstate.testing.spark import KeyCount, key_count_config, key_count_task

__all__ = ["STANDBY_FOLLOWS", "ForgetfulPlacement", "MisplacingPlacement", "cluster_config", "read_events", "event_batch", "fresh_state", "kill_mid_task", "write_input", "RecordedKeyCount", "run_batch", "run_stream", "main"]

INPUT_SCHEMA = "user_id string"
EVENTS_KEY = "testing.events.dir"
SLEEP_KEY = "testing.task.sleep.s"
COMMIT_SLEEP_KEY = "testing.commit.sleep.s"
JOB_NAME = "cluster"
STANDBY_FOLLOWS = "standby-follows.json"
"""Under a stream's root: ``{version: {"seconds": S, "reports": [follow report, ...]}}`` of
the standby follows after each micro-batch (:attr:`StatefulJob.standby_follows`)."""
OBJECTSTORE_ENV = "LOCALSTATE_CLUSTER_OBJECTSTORE"
"""``{"endpoint": URL, "bucket": NAME}`` (JSON): keep the changelog and checkpoints on that
S3 endpoint (objectstore system, prefix = the job root's name) instead of the file changelog."""


def cluster_config(
    root: str | Path, *, partitions: int = 4, task_sleep_s: float = 0.0, commit_sleep_s: float = 0.0,
    standby_replicas: int = 0,
) -> Config:
    """The job's config: rocksdb ``counts``, state per executor, changelog shared.

    A task run sleeps ``task_sleep_s`` after its ``start`` event and
    ``commit_sleep_s`` after its ``close`` event (after its commit, before the Spark
    task ends), so a test can kill its executor in either window."""
    root = Path(root)
    base = key_count_config(root, partitions=partitions, engine="rocksdb", name=JOB_NAME)
    overrides: dict[str, Any] = {
        "job.state.dir": str(root / "state" / "{executor}"),
        EVENTS_KEY: str(root / "events"),
        SLEEP_KEY: task_sleep_s,
        COMMIT_SLEEP_KEY: commit_sleep_s,
        # A local snapshot at every commit. The tests' model of where state lives says a run
        # whose executor holds its starting state locally replays nothing, also when an
        # earlier run there ended without a clean close (a failed attempt after writes):
        # that is so when every commit left a snapshot. With the default interval such a
        # run replays the records since its newest snapshot instead (the clean-close claim
        # keeps the copy only after a clean close); the engine's own tests cover that.
        "stores.counts.rocksdb.snapshot.interval.records": 0,
        "job.standby.replicas": standby_replicas,
    }
    where = os.environ.get(OBJECTSTORE_ENV)
    if where:
        from localstate.testing.s3 import objectstore_options

        s3 = json.loads(where)
        overrides.update({
            "job.changelog.system": "s3",
            "job.checkpoint.system": "s3",
            "stores.counts.changelog": f"s3.{JOB_NAME}-counts",
            # no snapshot uploads: a moved task must restore from the changelog itself
            **objectstore_options(s3["endpoint"], s3["bucket"], root.name, **{"snapshot.every": 0}),
        })
    return base.with_overrides(overrides)


def event_batch(event: dict[str, Any]) -> int:
    """The micro-batch of a task run's event: the one after the version it started from."""
    prev = event["previous_version"]
    return (prev if prev is not None else -1) + 1


def fresh_state(config: Config, root: str | Path) -> Config:
    """``config`` with an empty local state dir under ``root``: reading it restores all
    from the changelog."""
    return config.with_overrides({"job.state.dir": str(Path(root) / "verify-state")})


def write_input(directory: str | Path, files: int, *, rows_per_file: int, keys: int, seed: int) -> list[Counter[str]]:
    """``files`` JSON-lines files of rows ``{"user_id": "user-NNNN"}`` (``keys`` distinct
    keys), oldest first by mtime (Spark's file source takes them in that order, one per
    micro-batch with ``maxFilesPerTrigger=1``); returns each file's exact key counts."""
    rng = random.Random(seed)
    directory = Path(directory)
    directory.mkdir(parents=True)
    counters = []
    base = time.time() - files - 10
    for i in range(files):
        names = [f"user-{rng.randrange(keys):04d}" for _ in range(rows_per_file)]
        path = directory / f"part-{i:04d}.json"
        path.write_text("".join(json.dumps({"user_id": k}) + "\n" for k in names), encoding="utf-8")
        os.utime(path, (base + i, base + i))
        counters.append(Counter(names))
    return counters


def _write_event(directory: Path, event: dict[str, Any]) -> None:
    # One file per event, renamed into place: the watching test never sees half of one.
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(event), encoding="utf-8")
    tmp.rename(directory / f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json")


def read_events(root: str | Path) -> list[dict[str, Any]]:
    """The events written so far, in the order they were written."""
    directory = Path(root) / "events"
    if not directory.is_dir():
        return []
    events = []
    for path in sorted(directory.glob("*.json"), key=lambda p: float(p.name.split("-")[0])):
        events.append(json.loads(path.read_text(encoding="utf-8")))
    return events


def kill_mid_task(root: str | Path, running: Callable[[], bool], executors: Callable[[], dict[str, int]], *,
                  from_batch: int, sleep_s: float, timeout_s: float) -> dict[str, Any] | None:
    """Wait for a run of micro-batch >= ``from_batch`` in the first half of its sleep and
    SIGKILL its executor with the executor's Python processes (as when its host is lost);
    that run's start event with ``kill_time``, or None if ``running()`` turned false or
    ``timeout_s`` passed first. ``executors()``: executor id -> JVM pid of the executors
    that may be killed now. The window is checked again just before the kill: finding the
    executors reads /proc, which can take a while on a loaded machine."""
    def fresh(event: dict[str, Any]) -> bool:
        return time.time() - event["time"] < sleep_s / 2

    deadline = time.monotonic() + timeout_s
    while running() and time.monotonic() < deadline:
        events = read_events(root)
        closed = {e["run"] for e in events if e["phase"] == "close"}
        jvms: dict[str, int] | None = None  # read once per scan, and only when a run qualifies
        for e in events:
            if e["phase"] == "start" and e["run"] not in closed and event_batch(e) >= from_batch and fresh(e):
                if jvms is None:
                    jvms = executors()
                if e["executor"] in jvms and fresh(e):
                    kill_tree(jvms[e["executor"]])
                    return {**e, "kill_time": time.time()}
        time.sleep(0.03)
    return None


class RecordedKeyCount(key_count_task("user_id")):  # type: ignore[misc]
    """The vectorised key count task, writing ``start``/``close`` events per run and
    sleeping after each (see :func:`cluster_config`)."""

    def init(self, context: Any) -> None:
        from localstate.contrib.spark.task_run import executor_id
        from pyspark import TaskContext as SparkTaskContext

        super().init(context)
        self.storage = context.storage
        self.events_dir = Path(context.config[EVENTS_KEY])
        spark_ctx = SparkTaskContext.get()
        previous = context.storage.checkpoint
        restore = context.storage.last_restore["counts"]
        self.event: dict[str, Any] = {
            "run": uuid.uuid4().hex,
            "partition": context.partition,
            "executor": executor_id(),
            "state_dir": str(context.config.state_dir),
            "pid": os.getpid(),
            "stage": spark_ctx.stageId() if spark_ctx else None,
            "attempt": spark_ctx.attemptNumber() if spark_ctx else None,
            "previous_version": previous.version if previous is not None else None,
            "restore_records": restore.records,
            "restore_start": restore.start_offset,
            "restore_committed": restore.stop_offset,
        }
        _write_event(self.events_dir, {**self.event, "phase": "start", "time": time.time()})
        sleep_s = float(context.config.get(SLEEP_KEY) or 0.0)
        if sleep_s:
            time.sleep(sleep_s)

    def close(self) -> None:
        # The runner calls close() after the commit, or after a failure (nothing committed).
        after = self.storage.checkpoint
        _write_event(self.events_dir, {
            **self.event,
            "phase": "close",
            "time": time.time(),
            "version": after.version if after is not None else None,
            "committed_offset": after.offsets.get("counts") if after is not None else None,
        })
        sleep_s = float(self.storage.config.get(COMMIT_SLEEP_KEY) or 0.0)
        if sleep_s:
            time.sleep(sleep_s)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value), encoding="utf-8")
    tmp.replace(path)


def _rows(df: Any) -> list[list[Any]]:
    table = df.toArrow()
    return [[k, c] for k, c in zip(table.column("key").to_pylist(), table.column("count").to_pylist())]


def run_batch(spark: Any, root: Path, input_dir: Path, config: Config) -> None:
    """One :meth:`StatefulJob.run` over every input file; rows to ``root/output.json``."""
    from localstate.contrib.spark import StatefulJob

    job = StatefulJob(config, RecordedKeyCount, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    rows = _rows(job.run(spark.read.schema(INPUT_SCHEMA).json(str(input_dir))))
    _write_json(root / "output.json", rows)


KAFKA_ENV = "LOCALSTATE_DRIVER_KAFKA"
"""``{"bootstrap": ..., "topic": ..., "per_trigger": N}`` (JSON): with ``--input-format kafka``
the stream is that topic of JSON values read by Spark's Kafka connector, N records per
micro-batch (:mod:`localstate.contrib.spark.kafka_input`)."""


def _input_stream(spark: Any, input_dir: Path, input_format: str) -> Any:
    """The files under ``input_dir`` as a stream, one file per micro-batch (or the topic
    of :data:`KAFKA_ENV`)."""
    if input_format == "kafka":
        from localstate.contrib.spark.kafka_input import kafka_json, kafka_stream

        kafka = json.loads(os.environ[KAFKA_ENV])
        stream = kafka_stream(spark, kafka["bootstrap"], kafka["topic"], maxOffsetsPerTrigger=kafka["per_trigger"])
        return kafka_json(stream, INPUT_SCHEMA)
    reader = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
    return reader.parquet(str(input_dir)) if input_format == "parquet" else reader.json(str(input_dir))


class ForgetfulPlacement(Placement):
    """A placement registry that can be told to forget everything before its next
    proposal, as the registry of a new driver knows nothing."""

    forget_at_next_assign = False

    def assign(self, executors: Iterable[str], *, wait_for_standby: bool = True) -> list[str | None]:
        if self.forget_at_next_assign:
            self.forget()
            self.forget_at_next_assign = False
        return super().assign(executors, wait_for_standby=wait_for_standby)


class MisplacingPlacement(ForgetfulPlacement):
    """A placement registry that proposes, for every partition, the executor after the
    one it ran on last (in id order): each run goes where a stale copy or none is. A
    test double for a registry whose claims are wrong (two executors each holding a copy
    of a partition, the registry naming the stale one), which a working registry never
    produces on its own."""

    def assign(self, executors: Iterable[str], *, wait_for_standby: bool = True) -> list[str | None]:
        alive = sorted(set(executors), key=lambda e: (len(e), e))
        out = super().assign(alive, wait_for_standby=wait_for_standby)
        if len(alive) < 2:
            return out
        return [alive[(alive.index(e) + 1) % len(alive)] if e is not None else None for e in out]


def run_stream(spark: Any, root: Path, input_dir: Path, config: Config, spark_tasks: int | None = None,
               *, forget_placement_at: int | None = None, misplace: bool = False, input_format: str = "json",
               progress: list[dict[str, Any]] | None = None, affinity: bool = True,
               co_partitioned: bool = False) -> int | None:
    """The streaming job, one input file per micro-batch, until the input is consumed;
    batch ``B``'s rows to ``root/output/batch-B.json``. Returns the last batch id.
    ``spark_tasks``: see :class:`StatefulJob` (None: one Spark task per task).
    ``forget_placement_at``: the job's placement registry is replaced by an empty one
    after that micro-batch (as a new driver starts with none); ``misplace``: the
    registry is a :class:`MisplacingPlacement`. ``input_format``: ``json`` (lines) or
    ``parquet`` files. ``progress``: receives the query's progress of every micro-batch.
    ``affinity``, ``co_partitioned``: see :class:`StatefulJob` and its ``run_stream``."""
    from localstate.contrib.spark import StatefulJob

    job = StatefulJob(config, RecordedKeyCount, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                      spark_tasks=spark_tasks, affinity=affinity)
    job.placement = (MisplacingPlacement if misplace else ForgetfulPlacement)(job.spark_tasks)
    out_dir = root / "output"

    def output(df: Any, batch_id: int) -> None:
        _write_json(out_dir / f"batch-{batch_id}.json", _rows(df))
        if batch_id == forget_placement_at:
            job.placement.forget_at_next_assign = True

    stream = _input_stream(spark, input_dir, input_format)
    query = job.run_stream(
        stream,
        checkpoint_location=str(root / "spark-checkpoint"),
        trigger={"availableNow": True},
        output=output,
        co_partitioned=co_partitioned,
    )
    query.awaitTermination()
    if job.standby_follows:
        _write_json(root / STANDBY_FOLLOWS, {str(v): follow for v, follow in job.standby_follows.items()})
    if progress is not None:
        progress.extend(query.recentProgress)
    last = query.lastProgress
    return last["batchId"] if last else None


def _floor_counts(batches: Iterable[Any]) -> Iterable[Any]:
    import pyarrow as pa

    for batch in batches:
        counts = pa.Table.from_batches([batch]).group_by("user_id").aggregate([("user_id", "count")])
        yield from pa.table({"key": counts["user_id"], "count": counts["user_id_count"]}).to_batches()


def run_floor(spark: Any, root: Path, input_dir: Path, partitions: int, *, input_format: str = "json",
              progress: list[dict[str, Any]] | None = None) -> int | None:
    """The stream of :func:`run_stream` with no state at all: each micro-batch's rows are
    shuffled by key onto ``partitions`` Spark tasks and counted per Arrow batch in Python
    (``mapInArrow``, the same shuffle and Arrow hop as the stateful job), the counts
    written as :func:`run_stream` writes its rows. What a micro-batch costs without
    state, on the same master."""
    from pyspark import StorageLevel

    out_dir = root / "output"

    def output(df: Any, batch_id: int) -> None:
        result = df.repartition(partitions, "user_id").mapInArrow(_floor_counts, KeyCount.OUTPUT_SCHEMA)
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result.count()
            _write_json(out_dir / f"batch-{batch_id}.json", _rows(result))
        finally:
            result.unpersist()

    stream = _input_stream(spark, input_dir, input_format)
    query = (stream.writeStream.foreachBatch(output).option("checkpointLocation", str(root / "spark-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if progress is not None:
        progress.extend(query.recentProgress)
    last = query.lastProgress
    return last["batchId"] if last else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["batch", "stream", "all"], help="all: batch, then stream")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--task-sleep", type=float, default=0.0, help="stream: seconds a task run sleeps after start")
    parser.add_argument("--commit-sleep", type=float, default=0.0, help="stream: seconds a task run sleeps after commit")
    parser.add_argument("--locality-wait", default="0",
                        help="spark.locality.wait (default 0: a task goes to any free executor at once, as "
                             "after a failure; Spark's own default is 3s)")
    parser.add_argument("--forget-placement-at", type=int, default=None,
                        help="stream: replace the placement registry by an empty one after this micro-batch")
    parser.add_argument("--misplace", action="store_true",
                        help="stream: a registry that sends every run to another executor")
    parser.add_argument("--state-dir", default=None,
                        help="job.state.dir template (default: ROOT/<job>/state/{executor})")
    parser.add_argument("--executors", type=int, default=None,
                        help="wait until this many executors registered (a spark:// master)")
    parser.add_argument("--no-affinity", action="store_true", help="stream: StatefulJob(affinity=False)")
    parser.add_argument("--input-format", choices=["json", "parquet", "kafka"], default="json",
                        help="stream: the input files' format (kafka: the topic of $" + KAFKA_ENV + ")")
    parser.add_argument("--co-partitioned", action="store_true",
                        help="stream: run_stream(co_partitioned=True) (--input-format kafka)")
    parser.add_argument("--standby-replicas", type=int, default=0,
                        help="stream: job.standby.replicas (a warm copy of each task on another executor)")
    parser.add_argument("--floor", action="store_true",
                        help="stream: the same stream with no state (run_floor), for the price of state")
    parser.add_argument("--spark-tasks", type=int, default=None,
                        help="stream: Spark tasks the tasks run in (default: one per task)")
    args = parser.parse_args(argv)

    from localstate.contrib.spark import spark_session

    def config(root: Path, sleep: bool) -> Config:
        config = cluster_config(
            root,
            partitions=args.partitions,
            task_sleep_s=args.task_sleep if sleep else 0.0,
            commit_sleep_s=args.commit_sleep if sleep else 0.0,
            standby_replicas=args.standby_replicas if sleep else 0,
        )
        return config.with_overrides({"job.state.dir": args.state_dir}) if args.state_dir else config

    t0 = time.monotonic()
    conf = {"spark.sql.shuffle.partitions": str(args.partitions), "spark.locality.wait": args.locality_wait}
    if args.executors:  # a standalone master whose workers all run on this host
        from localstate.contrib.spark.session import one_host_exclusion

        conf.update(one_host_exclusion(args.executors))
    if args.input_format == "kafka":
        from localstate.testing.kafka_connector import kafka_connector_conf

        conf.update(kafka_connector_conf())
    spark = spark_session(args.master, app_name=f"localstate-cluster-{args.mode}", **conf)
    if args.executors:
        from localstate.contrib.spark.session import wait_for_executors

        wait_for_executors(spark, args.executors)
    result: dict[str, Any] = {
        "mode": args.mode,
        "app_id": spark.sparkContext.applicationId,
        "session_s": time.monotonic() - t0,
    }
    try:
        if args.mode in ("batch", "all"):
            root = args.root / "batch"
            run_batch(spark, root, args.input, config(root, False))
            result["batch_s"] = time.monotonic() - t0
        if args.mode in ("stream", "all"):
            _write_json(args.root / "stream-started.json", {"time": time.time()})
            root = args.root / "stream"
            progress: list[dict[str, Any]] = []
            if args.floor:
                result["last_batch"] = run_floor(spark, root, args.input, args.partitions,
                                                 input_format=args.input_format, progress=progress)
            else:
                result["last_batch"] = run_stream(spark, root, args.input, config(root, True), args.spark_tasks,
                                                  forget_placement_at=args.forget_placement_at,
                                                  misplace=args.misplace, input_format=args.input_format,
                                                  progress=progress, affinity=not args.no_affinity,
                                                  co_partitioned=args.co_partitioned)
            result["batch_ms"] = [p["durationMs"].get("triggerExecution") for p in progress]
            result["batch_add_ms"] = [p["durationMs"].get("addBatch") for p in progress]
            result["batch_ids"] = [p["batchId"] for p in progress]
            if progress:
                from localstate.testing.spark import batch_stages

                stages = batch_stages(spark, str(progress[0]["runId"]))
                result["stages"] = {str(b): s for b, s in stages.items()}
            result["batch_rows"] = [p.get("numInputRows") for p in progress]
        result["status"] = "ok"
    except Exception as e:
        result["status"] = "failed"
        result["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        result["seconds"] = time.monotonic() - t0
        _write_json(args.root / "result.json", result)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
