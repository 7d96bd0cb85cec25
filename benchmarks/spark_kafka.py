"""The Kafka end-to-end shape: a topic of JSON page views → count per user, exactly once —
localstate on Spark (three ways to read the topic) vs Quix Streams, on the same broker.

An Apache Kafka node (:class:`localstate.testing.apache_kafka.ApacheKafkaBroker`: Spark's
connector stops at the high watermark, which tansu understates) is started on 127.0.0.1
and two topics are filled with ``events`` JSON page views (``{"ts": …, "user_id": …}``,
keyed by ``user_id``; quick: 20k, full: 1M): ``page-views`` with 1 partition and
``page-views-by-task`` with 4, each record in partition ``task_for(user_id, 4)``
(:mod:`localstate.partitioning`: the task the job gives the key).

Every localstate row runs :meth:`StatefulJob.run_stream` with the count-per-key task of
:func:`localstate.testing.spark.key_count_task` (rocksdb + the file changelog, or with
``--changelog kafka`` the changelog and checkpoints on a tansu broker; no object cache,
4 tasks on ``local[2]``, one exactly-once commit per task per micro-batch), ``availableNow``,
``maxOffsetsPerTrigger`` = events / 4, warm session; timed from ``start()`` to the end of
the query:

* ``localstate-kafka``: localstate's own source (``format=json``, ``minPartitions`` = the
  session's cores, so the one topic partition is read and parsed on both cores), the tasks
  in as many Spark tasks as the session has cores;
* ``spark kafka connector``: Spark's ``format("kafka")`` (``minPartitions`` = cores) →
  :func:`~localstate.contrib.spark.kafka_input.kafka_json` → the same job (shuffled by key);
* ``co-partitioned``: the connector over ``page-views-by-task`` →
  ``run_stream(co_partitioned=True)``: each topic partition is one task, no shuffle.
* two floors, the same count per user with no state (``foreachBatch`` → ``noop``): our
  source → ``repartition(4, user_id)`` → a pyarrow group-by per Arrow batch in
  ``mapInArrow`` (the read, parse, shuffle and Python hop of the ``localstate-kafka`` row
  without its tasks), and Spark's connector → ``from_json`` → ``groupBy().count()`` in the
  JVM only (what Spark itself does with this input, no Python at all);
* ``quix``: Quix Streams 3.28 ``Application(processing_guarantee="exactly-once")``
  counting per key in its RocksDB state with its changelog topic
  (:mod:`localstate.benchmarks.peers.quix_peer`), over ``page-views``, in a subprocess;
  timed from its first message to ``run()`` returning (the consumer-group join is excluded).

quixstreams 3.28 pins ``confluent-kafka<2.13`` while localstate is tested with 2.16, so
the peer runs with the interpreter named by ``LOCALSTATE_QUIX_PYTHON`` (a separate
virtualenv: ``python -m venv /tmp/quix && /tmp/quix/bin/pip install quixstreams==3.28.1``),
else with this interpreter when it can import quixstreams. Without either, the Quix row
is left out and the localstate row says why.

The runs alternate (the three localstate ways, the two floors, Quix, …); the warm-up round
checks that every floor counted every message and that the others all
end with the same count for every user (localstate's committed state vs the last count
Quix's state returned).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from localstate.contrib.spark.runner import StatefulJob

from .peers import quix_python
from .runner import make_row
from .spark_jobs import TASKS, Sizes, events
from .spark_streaming import (
    CHANGELOG,
    JOB_OPTIONS,
    StreamRun,
    changelog_overrides,
    finish_query,
    format_parts,
    latencies_ms,
    localstate_breakdown,
    run_shape,
    spark_tasks_for,
)

__all__ = ["KAFKA_FULL", "KAFKA_QUICK", "kafka_rows", "produce_page_views", "connector_stream", "main"]

KAFKA_FULL = Sizes(events=1_000_000, users=100_000, sample_every=1)
KAFKA_QUICK = Sizes(events=20_000, users=1_000, sample_every=1)
TRIGGERS = 4
"""Micro-batches the topic is read in (``maxOffsetsPerTrigger`` = events / TRIGGERS)."""
def produce_page_views(bootstrap: str, topic: str, sizes: Sizes, partitions: int = 1) -> int:
    """Create ``topic`` and fill it with the page views as JSON, keyed by user, each in
    partition ``task_for(user, partitions)``; returns the number of messages."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from localstate.partitioning import task_for

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # retention given explicitly: tansu describes only the configs a topic was created with,
    # and Quix derives its changelog topic's retention from the input topic's
    retention = {"retention.ms": "-1", "retention.bytes": "-1"}
    admin.create_topics([NewTopic(topic, partitions, 1, config=retention)])[topic].result(timeout=30)
    table = events(sizes)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 20, "batch.num.messages": 10_000})
    users = table.column("user_id").to_pylist()
    for ts, user in zip(table.column("ts").to_pylist(), users):
        while True:
            try:
                producer.produce(topic, json.dumps({"ts": ts, "user_id": user}).encode(), user.encode(),
                                 partition=task_for(user, partitions) if partitions > 1 else -1)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError(f"could not deliver the page views to {topic!r} on {bootstrap}")
    return len(users)


def _count_job(spark: Any, root: Path, timing_dir: Path | None, spark_tasks: int | None) -> StatefulJob:
    """The count-per-user job with fresh state under ``root`` (its tasks in ``spark_tasks``
    Spark tasks; None: one per task)."""
    from localstate.contrib.spark.jobs import default_kv_engine
    from localstate.testing.spark import KeyCount, key_count_config, key_count_task

    from .spark_jobs import timed_task

    # Counts are written once per key per micro-batch (the task sums in Arrow first), so
    # an object cache would only add work (as PageViewsPerHour's store says).
    config = key_count_config(root, partitions=TASKS, engine=default_kv_engine()[0], name="kafka-e2e")
    config = config.with_overrides({"stores.counts.object.cache.size": 0, **changelog_overrides(KeyCount, root)})
    task = key_count_task("user_id")
    if timing_dir is not None:
        task = timed_task(task, str(timing_dir))
    return StatefulJob(config, task, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA, spark_tasks=spark_tasks,
                       **JOB_OPTIONS)


def our_source(spark: Any, bootstrap: str, topic: str, per_trigger: int) -> Any:
    """``topic``'s JSON page views read by localstate's own source, ``per_trigger`` messages
    per micro-batch, split over the session's cores (``minPartitions``)."""
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    return (spark.readStream.format("localstate-kafka").option("bootstrap.servers", bootstrap)
            .option("topic", topic).option("format", "json").option("maxOffsetsPerTrigger", per_trigger)
            .option("minPartitions", spark.sparkContext.defaultParallelism)
            .schema("ts long, user_id string").load())


def localstate_kafka_stream(spark: Any, bootstrap: str, topic: str, root: Path, per_trigger: int,
                            timing_dir: Path | None = None, spark_tasks: int | None = None) -> tuple[StreamRun, Any]:
    """Count per user of ``topic`` by :meth:`StatefulJob.run_stream` (its tasks in
    :func:`~localstate.benchmarks.spark_streaming.spark_tasks_for` Spark tasks); the run
    and its config."""
    job = _count_job(spark, root, timing_dir, spark_tasks_for(spark, spark_tasks))
    stream = our_source(spark, bootstrap, topic, per_trigger)

    def start() -> Any:
        return job.run_stream(stream, checkpoint_location=str(root / "spark-checkpoint"),
                               trigger={"availableNow": True})

    return finish_query(spark, start, None), job.config


def connector_stream(spark: Any, bootstrap: str, topic: str, root: Path, per_trigger: int, *,
                     co_partitioned: bool, spark_tasks: int | None = None) -> tuple[StreamRun, Any]:
    """Count per user of ``topic`` read by Spark's Kafka connector and parsed by
    :func:`~localstate.contrib.spark.kafka_input.kafka_json`: shuffled by key (the source
    split over the session's cores by ``minPartitions``), or ``co_partitioned`` (one task
    per topic partition, no shuffle); the run and its config."""
    from localstate.contrib.spark.kafka_input import kafka_json, kafka_stream

    job = _count_job(spark, root, None, None if co_partitioned else spark_tasks_for(spark, spark_tasks))
    options: dict[str, Any] = {"maxOffsetsPerTrigger": per_trigger}
    if not co_partitioned:
        options["minPartitions"] = spark.sparkContext.defaultParallelism
    stream = kafka_json(kafka_stream(spark, bootstrap, topic, **options), "ts long, user_id string")

    def start() -> Any:
        return job.run_stream(stream, checkpoint_location=str(root / "spark-checkpoint"),
                               trigger={"availableNow": True}, co_partitioned=co_partitioned)

    return finish_query(spark, start, None), job.config


def user_counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The stateless floor's Python side: each Arrow batch's count per user, by one pyarrow
    group-by per batch (nothing kept between batches)."""
    for batch in batches:
        counts = pa.table({"user_id": batch.column("user_id")}).group_by("user_id").aggregate([("user_id", "count")])
        yield from counts.select(["user_id", "user_id_count"]).rename_columns(["user_id", "n"]).to_batches()


def floor_stream(spark: Any, bootstrap: str, topic: str, root: Path, per_trigger: int, *, jvm: bool,
                 totals: list[int] | None = None) -> StreamRun:
    """The count per user with no state, in ``foreachBatch`` to the ``noop`` sink: either
    (``jvm=False``) localstate's source as :func:`localstate_kafka_stream` reads it →
    ``repartition(4, user_id)`` → ``mapInArrow`` (:func:`user_counts`) — the read, parse,
    shuffle and Arrow hop of the localstate query without its tasks — or (``jvm=True``)
    Spark's connector → ``from_json`` → ``groupBy(user_id).count()``, in the JVM only. With
    ``totals``, each micro-batch's sum of the counts is appended there instead (the
    warm-up's check that every message was counted)."""
    from localstate.contrib.spark.kafka_input import kafka_stream
    from pyspark.sql import functions as F

    if jvm:
        raw = kafka_stream(spark, bootstrap, topic, maxOffsetsPerTrigger=per_trigger,
                           minPartitions=spark.sparkContext.defaultParallelism)
        plan = raw.select(F.from_json(F.col("value").cast("string"), "ts long, user_id string").alias("v")).select("v.*")
    else:
        plan = (our_source(spark, bootstrap, topic, per_trigger)
                .repartition(TASKS, "user_id").mapInArrow(user_counts, "user_id string, n long"))

    def sink(df: Any, _batch: int) -> None:
        if jvm:
            df = df.groupBy("user_id").agg(F.count(F.lit(1)).alias("n"))
        if totals is None:
            df.write.format("noop").mode("overwrite").save()
        else:
            totals.append(int(df.agg(F.sum("n")).first()[0] or 0))

    def start() -> Any:
        return (plan.writeStream.foreachBatch(sink).option("checkpointLocation", str(root / "spark-checkpoint"))
                .trigger(availableNow=True).start())

    return finish_query(spark, start, None)


def quix_run(python: str, bootstrap: str, topic: str, n: int, root: Path) -> dict[str, Any]:
    """One run of :mod:`localstate.benchmarks.peers.quix_peer` with state under ``root``."""
    result = root / "quix.json"
    script = Path(__file__).parent / "peers" / "quix_peer.py"
    proc = subprocess.run([python, str(script), bootstrap, topic, str(n), str(root / "state"), str(result)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"the Quix peer failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(result.read_text())


CONNECTOR = "spark kafka connector → kafka_json → run_stream (count per user, shuffled by key)"
FLOOR = "floor, no state: localstate-kafka → repartition(4, user_id) → mapInArrow count per batch → noop"
FLOOR_JVM = "floor, no state, JVM only: spark kafka connector → from_json → groupBy(user_id).count() → noop"
CO_PARTITIONED = "spark kafka connector, co-partitioned (4 topic partitions = 4 tasks, no shuffle) → run_stream"


def kafka_rows(spark: Any, work: Path, quick: bool, repeats: int, spark_tasks: int | None = None) -> list[dict[str, Any]]:
    """The Kafka end-to-end rows (see the module docstring); localstate's tasks in
    ``spark_tasks`` Spark tasks (default: the session's cores)."""
    from localstate.testing.apache_kafka import KAFKA_VERSION, ApacheKafkaBroker
    from localstate.testing.spark import read_counts

    sizes = KAFKA_QUICK if quick else KAFKA_FULL
    python, how = quix_python()
    with ApacheKafkaBroker() as broker:
        topic, by_task = "page-views", "page-views-by-task"
        n = produce_page_views(broker.bootstrap, topic, sizes)
        produce_page_views(broker.bootstrap, by_task, sizes, partitions=TASKS)
        per_trigger = -(-n // TRIGGERS)
        params = {"events": n, "users": sizes.users, "topic_partitions": 1, "maxOffsetsPerTrigger": per_trigger,
                  "tasks": TASKS, "master": spark.sparkContext.master,
                  "broker": f"Apache Kafka {KAFKA_VERSION} (one KRaft node)",
                  "spark_tasks": spark_tasks_for(spark, spark_tasks)}

        def fresh(name: str) -> Path:
            path = work / f"{name}-{time.time_ns()}"
            path.mkdir()
            return path

        def ours(check: bool = False) -> tuple[StreamRun, list[dict[str, Any]], dict[str, int] | None]:
            root = fresh("kafka-ls")
            timing = root / "timing"
            timing.mkdir()
            try:
                run, config = localstate_kafka_stream(spark, broker.bootstrap, topic, root, per_trigger, timing,
                                                      spark_tasks)
                docs = [json.loads(p.read_text()) for p in timing.glob("*.json")]
                return run, docs, read_counts(config) if check else None
            finally:
                shutil.rmtree(root, ignore_errors=True)

        def connector(co: bool, check: bool = False) -> tuple[StreamRun, dict[str, int] | None]:
            root = fresh("kafka-conn")
            try:
                run, config = connector_stream(spark, broker.bootstrap, by_task if co else topic, root, per_trigger,
                                               co_partitioned=co, spark_tasks=spark_tasks)
                return run, read_counts(config) if check else None
            finally:
                shutil.rmtree(root, ignore_errors=True)

        def floor(jvm: bool, totals: list[int] | None = None) -> StreamRun:
            root = fresh("kafka-floor")
            try:
                return floor_stream(spark, broker.bootstrap, topic, root, per_trigger, jvm=jvm, totals=totals)
            finally:
                shutil.rmtree(root, ignore_errors=True)

        def theirs() -> dict[str, Any]:
            assert python is not None
            root = fresh("kafka-quix")
            try:
                return quix_run(python, broker.bootstrap, topic, n, root)
            finally:
                shutil.rmtree(root, ignore_errors=True)

        mine, _, counts = ours(check=True)
        if mine.input_rows != n or counts is None or sum(counts.values()) != n:
            raise RuntimeError(f"localstate read {mine.input_rows:,} of {n:,} messages and counted "
                               f"{sum((counts or {}).values()):,}")
        for co in (False, True):
            run, other = connector(co, check=True)
            if run.input_rows != n or other != counts:
                raise RuntimeError(f"{CO_PARTITIONED if co else CONNECTOR} read {run.input_rows:,} of {n:,} "
                                   "messages or counted differently from localstate-kafka")
        for jvm in (False, True):
            totals: list[int] = []
            floor(jvm, totals)
            if sum(totals) != n:
                raise RuntimeError(f"{FLOOR_JVM if jvm else FLOOR} counted {sum(totals):,} of {n:,} messages")
        checked = f"{len(counts):,} users, {n:,} messages, the same counts on all three localstate paths"
        peer_runs: list[dict[str, Any]] = []
        if python is not None:
            peer = theirs()
            if peer["counts"] != counts:
                differ = sum(1 for k in counts.keys() | peer["counts"].keys()
                             if counts.get(k) != peer["counts"].get(k))
                raise RuntimeError(f"localstate and Quix counted differently for {differ:,} users")
            checked = "final count per user checked identical with Quix in the warm-up round: " + checked
        our_runs: list[StreamRun] = []
        our_docs: list[list[dict[str, Any]]] = []
        conn_runs: dict[bool, list[StreamRun]] = {False: [], True: []}
        floor_runs: dict[bool, list[StreamRun]] = {False: [], True: []}
        for _ in range(repeats):
            run, docs, _ = ours()
            our_runs.append(run)
            our_docs.append(docs)
            for co in (False, True):
                conn_runs[co].append(connector(co)[0])
            for jvm in (False, True):
                floor_runs[jvm].append(floor(jvm))
            if python is not None:
                peer_runs.append(theirs())

    ls_name = f"localstate-kafka → run_stream (count per user, rocksdb + {CHANGELOG['name']} changelog)"
    quix_name = "quix streams 3.28 Application (exactly-once, RocksDB state + changelog topic)"
    rows = []
    notes = "start() to end of the availableNow query, warm session; "
    for name, runs, extra, prm in (
        (ls_name, our_runs, f"{checked}; ", params),
        (CONNECTOR, conn_runs[False], "", params),
        (CO_PARTITIONED, conn_runs[True], "", params | {"topic_partitions": TASKS, "spark_tasks": TASKS}),
    ):
        row = make_row("kafka_e2e", name, prm, "events/s", [n / r.seconds for r in runs],
                       baseline=quix_name if peer_runs else None,
                       notes=notes + extra + f"{len(runs[0].data_batches)} data micro-batches per run"
                       + ("" if python is not None else f"; Quix not run: {how}"))
        rows.append(row)
    for jvm, name in ((False, FLOOR), (True, FLOOR_JVM)):
        runs = floor_runs[jvm]
        row = make_row("kafka_e2e", name, params, "events/s", [n / r.seconds for r in runs],
                       notes=notes + "every message counted in the warm-up round")
        # ours over the floor per interleaved round: what keeping the counts costs
        pairs = [f.seconds / r.seconds for r, f in zip(our_runs, runs)]
        row["notes"] += f"; localstate-kafka / this floor per round {[round(x, 2) for x in pairs]}"
        rows.append(row)
    if peer_runs:
        base = make_row("kafka_e2e", quix_name, params, "events/s", [n / r["seconds"] for r in peer_runs],
                        notes=f"first message to run() returned, consumer-group join excluded; peer run by {how}")
        for row, runs in zip(rows, (our_runs, conn_runs[False], conn_runs[True])):
            row["ratio"] = row["median"] / base["median"] if base["median"] else None
            # each localstate run is followed by its Quix run: on a shared machine the ratio
            # within a round is steadier than the ratio of the medians (the load drifts)
            pairs = [p["seconds"] / r.seconds for r, p in zip(runs, peer_runs)]
            row["notes"] += (f"; ratio per interleaved round {[round(x, 2) for x in pairs]} "
                             f"(median {np.median(pairs):.2f})")
        rows.append(base)
    lat = [ms for r in our_runs for ms in latencies_ms(r)]
    rows.append(make_row("kafka_batch_latency", ls_name, params, "ms (median)", [float(np.median(lat))],
                         notes=f"triggerExecution of {len(lat)} data micro-batches over {len(our_runs)} runs"))
    parts = localstate_breakdown(our_runs, our_docs)
    rows.append(make_row("kafka_breakdown", ls_name, params, "ms per micro-batch",
                         [parts["micro-batch (triggerExecution)"] * 1000], notes=format_parts(parts)))
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.spark_kafka [--quick] [--repeats N] [--json PATH]``
    (the Quix peer needs ``LOCALSTATE_QUIX_PYTHON``, see the module docstring)."""
    run_shape(kafka_rows, argv, "python -m localstate.benchmarks.spark_kafka")


if __name__ == "__main__":
    main()
