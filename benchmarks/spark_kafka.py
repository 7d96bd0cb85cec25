"""Issue 17's Kafka end-to-end shape: a topic of JSON page views → count per user,
exactly once — localstate on Spark vs Quix Streams, on the same topic and broker.

A tansu broker (:class:`localstate.testing.kafka.TansuBroker`) is started on 127.0.0.1
and one topic of 1 partition is filled with ``events`` JSON page views
(``{"ts": …, "user_id": …}``, keyed by ``user_id``; quick: 20k, full: 1M).

* ``localstate``: the ``localstate-kafka`` source (``format=json``,
  ``maxOffsetsPerTrigger`` = events / 4, ``minPartitions`` = the session's cores, so the
  one topic partition is read and parsed on both cores) → :meth:`StatefulJob.run_stream`
  with the count-per-key task of :func:`localstate.testing.spark.key_count_task`
  (rocksdb + file changelog, no object cache, 4 tasks on ``local[2]`` run in as many
  Spark tasks as the session has cores, one exactly-once commit per task per micro-batch), ``availableNow``, warm session; timed from
  ``start()`` to the end of the query.
* ``quix``: Quix Streams 3.28 ``Application(processing_guarantee="exactly-once")``
  counting per key in its RocksDB state with its changelog topic
  (:mod:`localstate.benchmarks.peers.quix_peer`), in a subprocess; timed from its first
  message to ``run()`` returning (the consumer-group join is excluded).

quixstreams 3.28 pins ``confluent-kafka<2.13`` while localstate is tested with 2.16, so
the peer runs with the interpreter named by ``LOCALSTATE_QUIX_PYTHON`` (a separate
virtualenv: ``python -m venv /tmp/quix && /tmp/quix/bin/pip install quixstreams==3.28.1``),
else with this interpreter when it can import quixstreams. Without either, the Quix row
is left out and the localstate row says why.

The two alternate (localstate, Quix, localstate, …); the warm-up pair checks that both
end with the same count for every user (localstate's committed state vs the last count
Quix's state returned).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from localstate.contrib.spark.runner import StatefulJob

from .peers import quix_python
from .runner import make_row
from .spark_jobs import TASKS, Sizes, events
from .spark_streaming import (
    StreamRun,
    finish_query,
    format_parts,
    latencies_ms,
    localstate_breakdown,
    run_shape,
    spark_tasks_for,
)

__all__ = ["KAFKA_FULL", "KAFKA_QUICK", "kafka_rows", "produce_page_views", "main"]

KAFKA_FULL = Sizes(events=1_000_000, users=100_000, sample_every=1)
KAFKA_QUICK = Sizes(events=20_000, users=1_000, sample_every=1)
TRIGGERS = 4
"""Micro-batches the topic is read in (``maxOffsetsPerTrigger`` = events / TRIGGERS)."""
def produce_page_views(bootstrap: str, topic: str, sizes: Sizes) -> int:
    """Create ``topic`` (1 partition) and fill it with the page views as JSON, keyed by
    user; returns the number of messages."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # retention given explicitly: tansu describes only the configs a topic was created with,
    # and Quix derives its changelog topic's retention from the input topic's
    retention = {"retention.ms": "-1", "retention.bytes": "-1"}
    admin.create_topics([NewTopic(topic, 1, 1, config=retention)])[topic].result(timeout=30)
    table = events(sizes)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 20, "batch.num.messages": 10_000})
    users = table.column("user_id").to_pylist()
    for ts, user in zip(table.column("ts").to_pylist(), users):
        while True:
            try:
                producer.produce(topic, json.dumps({"ts": ts, "user_id": user}).encode(), user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError(f"could not deliver the page views to {topic!r} on {bootstrap}")
    return len(users)


def localstate_kafka_stream(spark: Any, bootstrap: str, topic: str, root: Path, per_trigger: int,
                            timing_dir: Path | None = None, spark_tasks: int | None = None) -> tuple[StreamRun, Any]:
    """Count per user of ``topic`` by :meth:`StatefulJob.run_stream` (its tasks in
    :func:`~localstate.benchmarks.spark_streaming.spark_tasks_for` Spark tasks); the run
    and its config."""
    from localstate.contrib.spark.jobs import default_kv_engine
    from localstate.contrib.spark.sources import register_sources
    from localstate.testing.spark import KeyCount, key_count_config, key_count_task

    from .spark_jobs import timed_task

    register_sources(spark)
    # Counts are written once per key per micro-batch (the task sums in Arrow first), so
    # an object cache would only add work (as PageViewsPerHour's store says).
    config = key_count_config(root, partitions=TASKS, engine=default_kv_engine()[0], name="kafka-e2e")
    config = config.with_overrides({"stores.counts.object.cache.size": 0})
    task = key_count_task("user_id")
    if timing_dir is not None:
        task = timed_task(task, str(timing_dir))
    job = StatefulJob(config, task, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                      spark_tasks=spark_tasks_for(spark, spark_tasks))
    stream = (spark.readStream.format("localstate-kafka").option("bootstrap.servers", bootstrap)
              .option("topic", topic).option("format", "json").option("maxOffsetsPerTrigger", per_trigger)
              .option("minPartitions", spark.sparkContext.defaultParallelism)
              .schema("ts long, user_id string").load())
    t0 = time.perf_counter()
    query = job.run_stream(stream, checkpoint_location=str(root / "spark-checkpoint"),
                           trigger={"availableNow": True})
    return finish_query(spark, query, t0, None), config


def quix_run(python: str, bootstrap: str, topic: str, n: int, root: Path) -> dict[str, Any]:
    """One run of :mod:`localstate.benchmarks.peers.quix_peer` with state under ``root``."""
    result = root / "quix.json"
    script = Path(__file__).parent / "peers" / "quix_peer.py"
    proc = subprocess.run([python, str(script), bootstrap, topic, str(n), str(root / "state"), str(result)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"the Quix peer failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(result.read_text())


def kafka_rows(spark: Any, work: Path, quick: bool, repeats: int, spark_tasks: int | None = None) -> list[dict[str, Any]]:
    """The Kafka end-to-end rows (see the module docstring); localstate's tasks in
    ``spark_tasks`` Spark tasks (default: the session's cores)."""
    from localstate.testing.kafka import TansuBroker
    from localstate.testing.spark import read_counts

    sizes = KAFKA_QUICK if quick else KAFKA_FULL
    python, how = quix_python()
    with TansuBroker() as broker:
        topic = "page-views"
        n = produce_page_views(broker.bootstrap, topic, sizes)
        per_trigger = -(-n // TRIGGERS)
        params = {"events": n, "users": sizes.users, "topic_partitions": 1, "maxOffsetsPerTrigger": per_trigger,
                  "tasks": TASKS, "master": spark.sparkContext.master, "broker": "tansu (memory)",
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
        checked = f"{len(counts):,} users, {n:,} messages"
        peer_runs: list[dict[str, Any]] = []
        if python is not None:
            peer = theirs()
            if peer["counts"] != counts:
                differ = sum(1 for k in counts.keys() | peer["counts"].keys()
                             if counts.get(k) != peer["counts"].get(k))
                raise RuntimeError(f"localstate and Quix counted differently for {differ:,} users")
            checked = "final count per user checked identical with Quix in the warm-up pair: " + checked
        our_runs: list[StreamRun] = []
        our_docs: list[list[dict[str, Any]]] = []
        for _ in range(repeats):
            run, docs, _ = ours()
            our_runs.append(run)
            our_docs.append(docs)
            if python is not None:
                peer_runs.append(theirs())

    ls_name = "localstate-kafka → run_stream (count per user, rocksdb + file changelog)"
    quix_name = "quix streams 3.28 Application (exactly-once, RocksDB state + changelog topic)"
    rows = []
    e2e = make_row("kafka_e2e", ls_name, params, "events/s", [n / r.seconds for r in our_runs],
                   baseline=quix_name if peer_runs else None,
                   notes=f"start() to end of the availableNow query, warm session; {checked}; "
                   f"{len(our_runs[0].data_batches)} data micro-batches per run"
                   + ("" if python is not None else f"; Quix not run: {how}"))
    rows.append(e2e)
    if peer_runs:
        base = make_row("kafka_e2e", quix_name, params, "events/s", [n / r["seconds"] for r in peer_runs],
                        notes=f"first message to run() returned, consumer-group join excluded; peer run by {how}")
        e2e["ratio"] = e2e["median"] / base["median"] if base["median"] else None
        # each localstate run is followed by its Quix run: on a shared machine the ratio
        # within a pair is steadier than the ratio of the medians (the load drifts)
        pairs = [p["seconds"] / r.seconds for r, p in zip(our_runs, peer_runs)]
        e2e["notes"] += f"; ratio per interleaved pair {[round(x, 2) for x in pairs]} (median {np.median(pairs):.2f})"
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
