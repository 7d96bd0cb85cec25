"""Exactly-once Kafka output (:class:`~localstate.contrib.spark.sinks.KafkaSink`) on the
real Apache Kafka broker (transactions need it: tansu lets aborted records reach
read_committed readers) and the shared Spark session: one transaction per batch with its
marker, a re-run batch skipped after a restart, a zombie writer fenced, bad settings
refused before anything is written."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from localstate import ConfigError, LocalStateError
from localstate.contrib.spark.sinks import KafkaSink
from localstate.errors import FencedError
from localstate.testing.sink_driver import create_topic, read_topic
from localstate.testing.spark import KeyCount

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _counts(records: list[tuple[str | None, Any]]) -> Counter[tuple[str, int]]:
    return Counter((v["key"], v["count"]) for _, v in records)


@pytest.fixture
def topic(apache_kafka_broker: str) -> str:
    return create_topic(apache_kafka_broker)


def _sink(bootstrap: str, topic: str, tid: str, **kw: Any) -> KafkaSink:
    return KafkaSink(bootstrap, topic, transactional_id=tid, key="key", marker_topic=f"{topic}-markers", **kw)


def test_batches_are_delivered_once_and_a_restarted_sink_skips_a_delivered_batch(
    spark: Any, apache_kafka_broker: str, topic: str,
) -> None:
    tid = f"job-{topic}"
    sink = _sink(apache_kafka_broker, topic, tid)
    try:
        assert sink.delivered() is None
        assert sink.write(spark.createDataFrame([("a", 1), ("b", 2)], KeyCount.OUTPUT_SCHEMA), 0)
        assert sink.write(spark.createDataFrame([("a", 3)], KeyCount.OUTPUT_SCHEMA), 1)
    finally:
        sink.close()
    # a new driver: the last micro-batch runs again; its marker says it was delivered
    again = _sink(apache_kafka_broker, topic, tid)
    try:
        assert again.delivered() == 1
        assert not again.write(spark.createDataFrame([("a", 99)], KeyCount.OUTPUT_SCHEMA), 1)
        with pytest.raises(LocalStateError, match=r"batch 0 comes after batch 1 was delivered"):
            again.write(spark.createDataFrame([("a", 1)], KeyCount.OUTPUT_SCHEMA), 0)
        assert again.write(spark.createDataFrame([], KeyCount.OUTPUT_SCHEMA), 2)  # an empty batch: marker only
    finally:
        again.close()
    got = read_topic(apache_kafka_broker, topic)
    assert _counts(got) == Counter({("a", 1): 1, ("b", 2): 1, ("a", 3): 1})
    assert {k for k, _ in got} == {"a", "b"}
    markers = read_topic(apache_kafka_broker, f"{topic}-markers")
    assert [(k, v["batch_id"], v["rows"]) for k, v in markers] == [(tid, 0, 2), (tid, 1, 1), (tid, 2, 0)]


def test_a_second_writer_with_the_same_transactional_id_fences_the_first(
    apache_kafka_broker: str, topic: str,
) -> None:
    tid = f"job-{topic}"
    first = _sink(apache_kafka_broker, topic, tid)
    second = _sink(apache_kafka_broker, topic, tid)
    row = json.dumps({"key": "k", "count": 1})
    try:
        assert first.deliver([("k", row)], 0)

        def rows_while_a_second_driver_starts() -> Any:
            yield "k", json.dumps({"key": "k", "count": 2})
            assert second.open() == 0  # fences ``first`` and aborts its open transaction
            yield "k", json.dumps({"key": "k", "count": 3})

        with pytest.raises(FencedError, match=rf"another writer with transactional id '{tid}' took over"):
            first.deliver(rows_while_a_second_driver_starts(), 1)
        with pytest.raises(FencedError):
            first.deliver([("k", row)], 1)  # a zombie stays fenced
        assert second.deliver([("k", json.dumps({"key": "k", "count": 4}))], 1)
    finally:
        first.close()
        second.close()
    assert _counts(read_topic(apache_kafka_broker, topic)) == Counter({("k", 1): 1, ("k", 4): 1})
    uncommitted = _counts(read_topic(apache_kafka_broker, topic, isolation="read_uncommitted"))
    assert uncommitted[("k", 2)] == 1  # the zombie's rows reached the log, in an aborted transaction


def test_batch_run_output_to_kafka(spark: Any, apache_kafka_broker: str, topic: str, tmp_path: Any) -> None:
    from localstate.contrib.spark import StatefulJob
    from localstate.testing.spark import key_count_config, key_count_task

    job = StatefulJob(key_count_config(tmp_path / "job", partitions=2), key_count_task("user_id"), key="user_id",
                      output_schema=KeyCount.OUTPUT_SCHEMA)
    sink = _sink(apache_kafka_broker, topic, f"job-{topic}")
    try:
        job.run(spark.createDataFrame([("a",), ("b",), ("a",)], "user_id string"), output=sink)
        job.run(spark.createDataFrame([("b",)], "user_id string"), output=sink)
    finally:
        sink.close()
    got = read_topic(apache_kafka_broker, topic)
    assert _counts(got) == Counter({("a", 2): 1, ("b", 1): 1, ("b", 2): 1})


def test_bad_settings_are_refused_before_anything_is_written(spark: Any, apache_kafka_broker: str, topic: str) -> None:
    df = spark.createDataFrame([("a", 1)], KeyCount.OUTPUT_SCHEMA)
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    sink = _sink(apache_kafka_broker, missing, "bad-1")
    with pytest.raises(ConfigError, match=rf"kafka topic '{missing}' does not exist on brokers .* create it first"):
        sink.write(df, 0)
    with pytest.raises(ConfigError, match=r"transactional_id must be a non-empty string"):
        KafkaSink(apache_kafka_broker, topic, transactional_id="")
    with pytest.raises(ConfigError, match=r"marker topic 'localstate-markers.job/1' is not a valid topic name"):
        KafkaSink(apache_kafka_broker, topic, transactional_id="job/1")
    with pytest.raises(ConfigError, match=r"marker_topic must differ from the output topic"):
        KafkaSink(apache_kafka_broker, topic, transactional_id="x", marker_topic=topic)
    with pytest.raises(ConfigError, match=r"\['enable.idempotence', 'transactional.id'\]: the sink sets these"):
        KafkaSink(apache_kafka_broker, topic, transactional_id="x",
                  producer={"transactional.id": "y", "enable.idempotence": False})
    three = create_topic(apache_kafka_broker)
    with pytest.raises(ConfigError, match=rf"marker topic '{three}' has 3 partitions; it must have one"):
        KafkaSink(apache_kafka_broker, topic, transactional_id="bad-3", marker_topic=three).write(df, 0)
    no_column = _sink(apache_kafka_broker, topic, "bad-2")
    no_column.key = "user"
    try:
        with pytest.raises(ConfigError, match=r"column 'user' is not in the output \(columns: key, count\)"):
            no_column.write(df, 0)
    finally:
        no_column.close()
    assert read_topic(apache_kafka_broker, topic, isolation="read_uncommitted") == []
