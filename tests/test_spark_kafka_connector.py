"""Kafka through Spark's own connector (``format("kafka")``) as a StatefulJob's input, on the
real Apache Kafka broker (tansu understates the high watermark, where the connector stops
reading): the shuffled path and the co-partitioned path (one topic partition = one task, no
shuffle) count exactly, equal each other, stay exactly once across driver SIGKILLs, and
refuse what they cannot do exactly before anything is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate import ConfigError
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.kafka_input import kafka_json, kafka_stream
from localstate.contrib.spark.streaming import committed_batches
from localstate.partitioning import task_for
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 3
KEYS = 40


def produce(bootstrap: str, topic: str, n: int, *, partitions: int = PARTITIONS, by_task: bool = True,
            seed: int = 0) -> Counter[str]:
    """Create ``topic`` and produce ``n`` JSON values ``{"user_id": key}``, each to partition
    ``task_for(key, partitions)`` (``by_task``) or to Kafka's default partitioner's choice;
    returns the exact count per key."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    counts: Counter[str] = Counter()
    for i in range(n):
        key = f"user-{(i * 7 + seed) % KEYS:03d}"
        counts[key] += 1
        extra = {"partition": task_for(key, partitions)} if by_task else {}
        producer.produce(topic, json.dumps({"user_id": key}).encode(), key.encode(), **extra)
    assert producer.flush(30) == 0
    return counts


def run_job(spark: Any, root: Path, bootstrap: str, topic: str, *, co_partitioned: bool,
            partitions: int = PARTITIONS, **source: Any) -> tuple[Any, list[Any]]:
    """The key count over ``topic`` read by the connector, ``availableNow``; its config and
    every emitted (key, count) row."""
    config = key_count_config(root, partitions=partitions, engine="rocksdb", name="conn")
    job = StatefulJob(config, key_count_task("user_id"), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    stream = kafka_json(kafka_stream(spark, bootstrap, topic, **{"maxOffsetsPerTrigger": 150, **source}),
                        "user_id string")
    rows: list[Any] = []
    query = job.run_stream(stream, checkpoint_location=str(root / "checkpoint"), trigger={"availableNow": True},
                           output=lambda df, _b: rows.extend(map(tuple, df.collect())),
                           co_partitioned=co_partitioned)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return config, rows


def test_both_paths_count_exactly_and_equal_each_other(spark: Any, apache_kafka_broker: str, tmp_path: Path) -> None:
    expected = produce(apache_kafka_broker, "views-equal", 600)
    results = {}
    for co in (False, True):
        config, rows = run_job(spark, tmp_path / f"co-{co}", apache_kafka_broker, "views-equal", co_partitioned=co)
        assert read_counts(config) == expected
        assert set(committed_batches(config).values()) - {None}
        results[co] = (read_counts(config), {k: max(c for kk, c in rows if kk == k) for k, _ in rows})
    assert results[True] == results[False]
    # more input continues exactly from Spark's checkpoint on the co-partitioned path
    more = produce_more(apache_kafka_broker, "views-equal", 90)
    config, _ = run_job(spark, tmp_path / "co-True", apache_kafka_broker, "views-equal", co_partitioned=True)
    assert read_counts(config) == expected + more


BAD_VALUES: list[bytes | None] = [
    b'{"ts": 1, "user_id": "a"}', b'{"ts": "x", "user_id": "b"}', b"[1, 2]", b"5", b"", None, b"not json",
    b'{"ts": 1.5, "user_id": "e"}', b'{"user_id": "f"}',
]
"""Connector values: good, a string for a long, not objects, empty, a tombstone, not JSON, a
float for a long, a missing field."""


def test_kafka_json_modes_keep_skip_or_name_each_bad_record(spark: Any) -> None:
    rows = [(v, "views", 2, 100 + i) for i, v in enumerate(BAD_VALUES)]
    df = spark.createDataFrame(rows, "value binary, topic string, partition int, offset long").coalesce(1)
    good = [(1, "a", 2), (None, "f", 2)]
    dropped = kafka_json(df, "ts long, user_id string", mode="DROPMALFORMED").collect()
    assert [tuple(r) for r in dropped] == good
    kept = kafka_json(df, "ts long, user_id string, _corrupt_record string", mode="PERMISSIVE").collect()
    texts = [v.decode() for v in BAD_VALUES if v is not None]
    assert [tuple(r) for r in kept] == [
        (1, "a", None, 2) if t.startswith('{"ts": 1,') else (None, "f", None, 2) if t == '{"user_id": "f"}'
        else (None, None, t, 2) for t in texts]
    # FAILFAST (the default) names the first bad record's topic, partition and offset
    with pytest.raises(Exception, match=r"malformed record at topic 'views' partition 2 offset 101"):
        kafka_json(df, "ts long, user_id string").collect()
    with pytest.raises(ConfigError, match="mode = 'LENIENT'"):
        kafka_json(df, "ts long, user_id string", mode="LENIENT")


def produce_more(bootstrap: str, topic: str, n: int) -> Counter[str]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    counts: Counter[str] = Counter()
    for i in range(n):
        key = f"user-{i % 5:03d}"
        counts[key] += 1
        producer.produce(topic, json.dumps({"user_id": key}).encode(), key.encode(),
                         partition=task_for(key, PARTITIONS))
    assert producer.flush(30) == 0
    return counts


def _nothing_written(root: Path) -> None:
    config = key_count_config(root, partitions=PARTITIONS, engine="rocksdb", name="conn")
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS))


def test_co_partitioned_refuses_what_it_cannot_do_exactly(spark: Any, apache_kafka_broker: str,
                                                          tmp_path: Path) -> None:
    produce(apache_kafka_broker, "views-bad", 60)
    cases = {
        "minpartitions": ({"minPartitions": 6}, PARTITIONS, "minPartitions = 6"),
        "count": ({}, PARTITIONS + 1, r"has 3 partition\(s\) but the job has 4 tasks"),
    }
    for name, (source, tasks, message) in cases.items():
        root = tmp_path / name
        with pytest.raises(ConfigError, match=message):
            run_job(spark, root, apache_kafka_broker, "views-bad", co_partitioned=True, partitions=tasks, **source)
        assert not (root / "checkpoint").exists() and not (root / "changelog").exists()
    # a step that moves rows between Spark partitions
    config = key_count_config(tmp_path / "shuffle", partitions=PARTITIONS, engine="rocksdb", name="conn")
    job = StatefulJob(config, key_count_task("user_id"), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    stream = kafka_json(kafka_stream(spark, apache_kafka_broker, "views-bad"), "user_id string").repartition(2)
    with pytest.raises(ConfigError, match="Repartition step between the source and the job"):
        job.run_stream(stream, checkpoint_location=str(tmp_path / "shuffle" / "cp"), co_partitioned=True)
    # a topic that does not exist: refused, and the check does not create it (Apache Kafka
    # auto-creates a topic that a metadata request names)
    with pytest.raises(ConfigError, match="no such topic.*create topic 'views-missing'"):
        run_job(spark, tmp_path / "missing", apache_kafka_broker, "views-missing", co_partitioned=True)
    assert not (tmp_path / "missing" / "checkpoint").exists()
    from confluent_kafka.admin import AdminClient

    listed = AdminClient({"bootstrap.servers": apache_kafka_broker}).list_topics(timeout=30).topics
    assert "views-missing" not in listed


def test_co_partitioned_refuses_keys_in_the_wrong_partition_and_commits_nothing(
        spark: Any, apache_kafka_broker: str, tmp_path: Path) -> None:
    produce(apache_kafka_broker, "views-murmur2", 120, by_task=False)  # Kafka's default partitioner
    with pytest.raises(Exception, match=r"produce each record to partition localstate.partitioning.task_for"):
        run_job(spark, tmp_path, apache_kafka_broker, "views-murmur2", co_partitioned=True)
    _nothing_written(tmp_path)


def test_missing_connector_names_the_fix(tmp_path: Path) -> None:
    script = ("from localstate.contrib.spark import spark_session\n"
              "from localstate.contrib.spark.kafka_input import kafka_stream\n"
              "spark = spark_session('local[1]')\n"
              "try:\n    kafka_stream(spark, '127.0.0.1:1', 't')\n"
              "except Exception as e:\n    print(type(e).__name__, e)\n"
              "spark.stop()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, cwd=tmp_path)
    assert "KafkaConnectorMissing" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("co_partitioned", [False, True], ids=["shuffled", "co-partitioned"])
def test_driver_sigkilled_mid_stream_stays_exactly_once(apache_kafka_broker: str, tmp_path: Path,
                                                       co_partitioned: bool) -> None:
    """The driver of :mod:`localstate.testing.spark_cluster_driver` over the topic, SIGKILLed
    (with its JVM and Python workers) while a task of a micro-batch runs and after a task
    committed but before Spark did, then restarted until the topic is consumed."""
    from localstate.testing.processes import run_process_group
    from localstate.testing.spark_cluster_driver import (
        cluster_config,
        event_batch,
        fresh_state,
        read_events,
    )

    topic = f"views-kill-{int(co_partitioned)}"
    expected = produce(apache_kafka_broker, topic, 1500, seed=3)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "LOCALSTATE_DRIVER_KAFKA": json.dumps({"bootstrap": apache_kafka_broker, "topic": topic,
                                                  "per_trigger": 150})}
    cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream", "--root", str(tmp_path),
           "--input", str(tmp_path / "none"), "--partitions", str(PARTITIONS), "--master", "local[2]",
           "--input-format", "kafka", "--task-sleep", "0.5", "--commit-sleep", "0.5",
           *(["--co-partitioned"] if co_partitioned else [])]
    stream = tmp_path / "stream"

    def after(phase: str, batch: int) -> Any:
        found = [e for e in read_events(stream) if e["phase"] == phase and event_batch(e) >= batch
                 and (phase == "start" or e["version"] == event_batch(e))]
        return found[0] if found else None

    kills = [("start", 1), ("close", 3)]
    for n, (phase, batch) in enumerate([*kills, (None, 0)]):
        kill_when = None if phase is None else (lambda phase=phase, batch=batch: after(phase, batch))
        run = run_process_group(cmd, env, tmp_path / f"driver-{n}.log", timeout_s=300, poll_s=0.02, scan_s=0.5,
                                kill_when=kill_when)
        log = (tmp_path / f"driver-{n}.log").read_text(errors="replace")[-3000:]
        assert not run.timed_out and not run.survivors, log
        if phase is not None:
            assert run.returncode == -signal.SIGKILL and run.moment is not None, f"no kill moment: {log}"
    assert run.returncode == 0, log
    config = cluster_config(stream, partitions=PARTITIONS)
    assert read_counts(fresh_state(config, tmp_path)) == expected
    assert read_counts(config.with_overrides({"job.state.dir": str(stream / "state" / "driver")})) == expected
