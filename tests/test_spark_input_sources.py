"""The PySpark data sources of :mod:`localstate.contrib.spark.sources`, batch and streaming.

Real parts only: a local Spark session, a tansu broker on 127.0.0.1 (confluent-kafka
producer), JSON-lines files and a localstate file changelog on disk. Streaming reads
use ``availableNow`` and a checkpoint location; a second query on the same checkpoint
must continue exactly where the first stopped (no record lost or read twice).
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def sources(spark: Any) -> Any:
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    return spark


def _drain(spark: Any, stream: Any, checkpoint: Path) -> list[list[dict[str, Any]]]:
    """Run ``stream`` with ``availableNow`` to the end; the rows of each micro-batch."""
    batches: dict[int, list[dict[str, Any]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        batches[batch_id] = df.toArrow().to_pylist()

    query = stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)) \
        .trigger(availableNow=True).start()
    query.awaitTermination(180)
    if query.exception() is not None:
        raise AssertionError(f"streaming query failed: {query.exception()}")
    return [batches[b] for b in sorted(batches)]


def _error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """An error raised inside a Spark task or data source arrives wrapped: its whole text."""
    return str(excinfo.value)


# -- JSON lines ------------------------------------------------------------------------------------
def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_jsonl_batch_reads_complete_lines_in_file_name_order(sources: Any, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "b.jsonl").write_text(_lines([{"ts": 3, "user_id": "c"}]) + '{"ts": 4, "user_')  # a line being written
    (d / "a.jsonl").write_text(_lines([{"ts": 1, "user_id": "a"}, {"ts": 2, "user_id": "b", "extra": 1}]))
    (d / ".hidden").write_text("not json\n")
    df = sources.read.format("localstate-jsonl").schema("ts long, user_id string").load(str(d))
    assert df.toArrow().to_pylist() == [
        {"ts": 1, "user_id": "a"}, {"ts": 2, "user_id": "b"}, {"ts": 3, "user_id": "c"}
    ]
    # without a schema it is inferred from the first file
    inferred = sources.read.format("localstate-jsonl").load(str(d))
    assert set(inferred.columns) >= {"ts", "user_id"}


def test_jsonl_stream_picks_up_appends_and_new_files_exactly_once_across_restarts(
    sources: Any, tmp_path: Path
) -> None:
    d = tmp_path / "in"
    d.mkdir()
    ckpt = tmp_path / "ckpt"
    (d / "a.jsonl").write_text(_lines([{"n": i} for i in range(5)]) + '{"n": ')

    def stream() -> Any:
        return sources.readStream.format("localstate-jsonl").schema("n long").load(str(d))

    first = [r["n"] for b in _drain(sources, stream(), ckpt) for r in b]
    assert sorted(first) == list(range(5))  # the partial line waits

    with (d / "a.jsonl").open("a") as f:
        f.write("5}\n" + _lines([{"n": 6}]))
    (d / "b.jsonl").write_text(_lines([{"n": i} for i in range(7, 10)]))
    second = [r["n"] for b in _drain(sources, stream(), ckpt) for r in b]
    assert sorted(second) == list(range(5, 10))

    assert _drain(sources, stream(), ckpt) == []  # nothing new: no rows


def test_jsonl_bad_input_names_the_path_and_the_fix(sources: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-jsonl").schema("n long").load().collect()
    assert "needs option 'path'" in _error_text(e)
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-jsonl").schema("n long").load(str(tmp_path / "nope")).collect()
    assert "does not exist" in _error_text(e) and "nope" in _error_text(e)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-jsonl").load(str(empty)).collect()
    assert "give one with .schema" in _error_text(e)
    d = tmp_path / "bad"
    d.mkdir()
    (d / "x.jsonl").write_text('{"n": 1}\n{"n": oops}\n')
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-jsonl").schema("n long").load(str(d)).collect()
    assert "x.jsonl:2" in _error_text(e) and "malformed record" in _error_text(e)


# -- the file changelog -------------------------------------------------------------------------------
def _changelog_config(root: Path) -> Config:
    return Config.from_dict({
        "job.name": "src",
        "job.partitions": 2,
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.kv.factory": "memory",
        "stores.kv.changelog": "file.src-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "string",
        "stores.kv.write.batch.size": 2,
        "stores.kv.object.cache.size": 10,
    })


def _changelog_df(spark: Any, root: Path, committed: bool, stream: bool = False) -> Any:
    reader = (spark.readStream if stream else spark.read).format("localstate-changelog") \
        .option("path", str(root / "changelog")).option("stream", "src-kv")
    if committed:
        reader = reader.option("job", "src").option("store", "kv")
    return reader.load()


def _kv(rows: list[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    return [(r["partition"], r["key"].decode(), None if r["value"] is None else r["value"].decode())
            for r in sorted(rows, key=lambda r: (r["partition"], r["offset"]))]


def test_changelog_source_reads_committed_records_only_with_job_and_store(sources: Any, tmp_path: Path) -> None:
    config = _changelog_config(tmp_path)
    for p in range(2):
        with TaskStorage(config, p) as s:
            kv = s.store("kv")
            kv.put_all([(f"p{p}-a", "1"), (f"p{p}-b", "2")])
            kv.delete(f"p{p}-a")
            kv.put(f"p{p}-c", "3")
            s.commit()
    # Partition 0 writes past its commit: two records reach the changelog (a write
    # batch of 2), then the task dies before committing them.
    s = TaskStorage(config, 0)
    s.store("kv").put_all([("p0-x", "9"), ("p0-y", "9")])
    s.changelog("kv").flush()  # type: ignore[union-attr]  # on disk, as a task mid-commit leaves them
    assert s.changelog("kv").end_offset() > s.checkpoint.offsets["kv"]  # type: ignore[union-attr]

    committed = _kv(_changelog_df(sources, tmp_path, True).toArrow().to_pylist())
    # (the object cache sends a flush's puts before its deletes: compare in any order
    # within a partition, but the tombstone of "a" must follow its put)
    assert sorted(committed, key=str) == sorted([
        (0, "p0-a", "1"), (0, "p0-b", "2"), (0, "p0-a", None), (0, "p0-c", "3"),
        (1, "p1-a", "1"), (1, "p1-b", "2"), (1, "p1-a", None), (1, "p1-c", "3"),
    ], key=str)
    assert committed.index((0, "p0-a", None)) > committed.index((0, "p0-a", "1"))
    everything = _kv(_changelog_df(sources, tmp_path, False).toArrow().to_pylist())
    assert everything == committed[:4] + [(0, "p0-x", "9"), (0, "p0-y", "9")] + committed[4:]
    s.close()

    # The stream of committed records: new commits are picked up, each record once.
    ckpt = tmp_path / "ckpt"
    first = [r for b in _drain(sources, _changelog_df(sources, tmp_path, True, stream=True), ckpt) for r in b]
    assert _kv(first) == committed
    with TaskStorage(config, 1) as s:
        s.store("kv").put("p1-d", "4")
        s.commit()
    second = [r for b in _drain(sources, _changelog_df(sources, tmp_path, True, stream=True), ckpt) for r in b]
    assert _kv(second) == [(1, "p1-d", "4")]


def test_changelog_source_bad_options_are_clear(sources: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-changelog").option("path", str(tmp_path)).load().collect()
    assert "needs option 'stream'" in _error_text(e)
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-changelog").option("path", str(tmp_path)).option("stream", "nope") \
            .load().collect()
    assert "stream.json" in _error_text(e) and "is missing or unreadable" in _error_text(e)
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-changelog").option("path", str(tmp_path)).option("stream", "s") \
            .option("job", "j").load().collect()
    assert "give both 'job' and 'store'" in _error_text(e)


# -- Kafka -------------------------------------------------------------------------------------------
def _topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"src-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the topic exists
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)
    return topic


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, key, value in records:
        producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def _kafka(spark: Any, bootstrap: str, topic: str, stream: bool = False, **options: Any) -> Any:
    reader = (spark.readStream if stream else spark.read).format("localstate-kafka") \
        .option("bootstrap.servers", bootstrap).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader


def _views(n: int, start: int = 0) -> list[tuple[int, bytes, bytes]]:
    return [(i % 3, f"k{i}".encode(), json.dumps({"user_id": f"user-{i % 17}", "ts": i}).encode())
            for i in range(start, start + n)]


@pytest.mark.kafka
def test_kafka_batch_reads_every_record_with_offsets_and_parses_json(sources: Any, kafka_broker: str) -> None:
    topic = _topic(kafka_broker, 3)
    records = _views(90)
    _produce(kafka_broker, topic, records)
    rows = _kafka(sources, kafka_broker, topic).load().toArrow().to_pylist()
    assert len(rows) == 90
    assert {(r["partition"], r["key"], r["value"]) for r in rows} == set(records)
    assert all(r["topic"] == topic and r["timestamp"] > 0 for r in rows)
    for p in range(3):
        assert sorted(r["offset"] for r in rows if r["partition"] == p) == list(range(30))

    parsed = _kafka(sources, kafka_broker, topic, format="json").schema("user_id string, ts long").load()
    assert sorted(r["ts"] for r in parsed.toArrow().to_pylist()) == list(range(90))

    # minPartitions cuts the offset ranges: more reading tasks, the same records once each
    split = _kafka(sources, kafka_broker, topic, minPartitions=7).load()
    assert split.rdd.getNumPartitions() >= 7
    assert sorted((r["partition"], r["offset"]) for r in split.toArrow().to_pylist()) == sorted(
        (r["partition"], r["offset"]) for r in rows)

    window = _kafka(sources, kafka_broker, topic, startingOffsets='{"0": 10, "1": 0, "2": 30}',
                    endingOffsets='{"0": 20, "1": 5, "2": 30}').load().toArrow().to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in window) == (
        [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)]
    )


@pytest.mark.kafka
def test_kafka_reads_over_many_fetch_batches_keep_every_field_and_name_a_bad_record_by_offset(
    kafka_broker: str,
) -> None:
    """The reader takes fetched batches apart into columns as they come (no Message kept):
    across many consume batches and Arrow batches every key, value, offset and timestamp
    stays with its record; tombstones are skipped for JSON and a malformed record deep in
    the range is named by its own offset (the tombstones before it shift the positions)."""
    from localstate.contrib.spark.sources import kafka as source
    from localstate.contrib.spark.sources._base import _Range
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    n, bad = 2_345, 1_999
    topic = _topic(kafka_broker, 1)
    records = [(0, f"k{i}".encode(), None if i % 97 == 5 else
                b"{oops" if i == bad else json.dumps({"user_id": f"u{i}", "ts": i}).encode()) for i in range(n)]
    _produce(kafka_broker, topic, records)  # type: ignore[arg-type]
    options = {"bootstrap.servers": kafka_broker, "topic": topic}
    raw = source._KafkaReader(options, StructType([]))
    old_rows = source._BATCH_ROWS
    source._BATCH_ROWS = 1_000  # several Arrow batches, each from several consume batches
    try:
        batches = list(raw.read(_Range(0, 0, n)))
        assert len(batches) >= 2
        rows = [r for b in batches for r in b.to_pylist()]
        assert [(r["key"], r["value"], r["offset"]) for r in rows] == [(k, v, i) for i, (_, k, v) in enumerate(records)]
        assert all(r["topic"] == topic and r["partition"] == 0 and r["timestamp"] > 0 for r in rows)

        schema = StructType([StructField("user_id", StringType()), StructField("ts", LongType())])
        good = source._KafkaReader({**options, "format": "json"}, schema)
        parsed = [r for b in good.read(_Range(0, 0, bad)) for r in b.to_pylist()]
        assert [r["ts"] for r in parsed] == [i for i in range(bad) if i % 97 != 5]
        with pytest.raises(Exception) as e:
            list(good.read(_Range(0, 0, n)))
        assert f"offset {bad}" in str(e.value) and "malformed record" in str(e.value)
    finally:
        source._BATCH_ROWS = old_rows


@pytest.mark.kafka
def test_kafka_stream_respects_the_read_limit_and_continues_exactly_after_restart(
    sources: Any, kafka_broker: str, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker, 3)
    _produce(kafka_broker, topic, _views(120))
    ckpt = tmp_path / "ckpt"
    first = _drain(sources, _kafka(sources, kafka_broker, topic, stream=True, maxOffsetsPerTrigger=50).load(), ckpt)
    assert len(first) >= 3 and all(len(b) <= 50 for b in first)
    seen = Counter((r["partition"], r["offset"]) for b in first for r in b)
    assert len(seen) == 120 and max(seen.values()) == 1

    _produce(kafka_broker, topic, _views(30, start=120))
    second = _drain(sources, _kafka(sources, kafka_broker, topic, stream=True, maxOffsetsPerTrigger=50).load(), ckpt)
    keys = sorted(int(r["key"][1:]) for b in second for r in b)
    assert keys == list(range(120, 150))


@pytest.mark.kafka
def test_kafka_reads_in_one_worker_reuse_one_consumer_and_a_broken_off_read_closes_it(
    sources: Any, kafka_broker: str
) -> None:
    """A Python worker keeps one idle consumer between input partitions (and micro-batches);
    each read still returns exactly its range, and a read stopped early does not hand its
    consumer on (it may hold a half-read fetch)."""
    from localstate.contrib.spark.sources import kafka as kafka_source
    from localstate.contrib.spark.sources._base import _Range
    from pyspark.sql.types import StructType

    topic = _topic(kafka_broker, 3)
    records = _views(90)
    _produce(kafka_broker, topic, records)
    reader = kafka_source._KafkaReader({"bootstrap.servers": kafka_broker, "topic": topic},
                                       StructType.fromDDL(kafka_source.KAFKA_SCHEMA))
    kafka_source._IDLE_CONSUMERS.clear()

    def read(partition: int, start: int, stop: int) -> list[tuple[int, bytes]]:
        return [(r["offset"], r["value"]) for b in reader.read(_Range(partition, start, stop)) for r in b.to_pylist()]

    values = {p: [v for q, _k, v in records if q == p] for p in range(3)}
    assert read(0, 0, 30) == list(enumerate(values[0]))
    (idle,) = kafka_source._IDLE_CONSUMERS.values()
    assert read(2, 5, 12) == list(enumerate(values[2]))[5:12]
    assert list(kafka_source._IDLE_CONSUMERS.values()) == [idle]  # the same consumer, handed on
    assert read(1, 0, 30) == list(enumerate(values[1]))

    broken_off = reader.read(_Range(0, 0, 30))
    next(broken_off)
    assert kafka_source._IDLE_CONSUMERS == {}  # borrowed
    broken_off.close()
    assert kafka_source._IDLE_CONSUMERS == {}  # closed, not handed on
    assert read(0, 28, 30) == list(enumerate(values[0]))[28:30]


@pytest.mark.kafka
def test_the_sources_consumers_wait_1_ms_per_empty_fetch_and_find_the_same_ends(
    kafka_broker: str,
) -> None:
    """Finding a partition's end reads its last batch to EOF, and the broker holds that
    empty fetch for ``fetch.wait.max.ms``: the client's consumers ask for 1 ms, the user's
    ``kafka.fetch.wait.max.ms`` wins. The ends are the ones a patient consumer finds: after
    plain records, and after a committed transaction, whose marker is part of the partition."""
    from confluent_kafka import Producer
    from localstate.contrib.spark.sources import kafka as source
    from pyspark.sql.types import StructType

    topic = _topic(kafka_broker, 3)
    _produce(kafka_broker, topic, _views(40))
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(7):
        producer.produce(topic, f"v{i}".encode(), f"k{i}".encode(), partition=1)
    producer.commit_transaction(30)

    reader = source._KafkaReader({"bootstrap.servers": kafka_broker, "topic": topic}, StructType([]))
    assert reader.client.consumer_config()["fetch.wait.max.ms"] == 1
    patient = source._KafkaReader({"bootstrap.servers": kafka_broker, "topic": topic,
                                   "kafka.fetch.wait.max.ms": "50"}, StructType([]))
    assert patient.client.consumer_config()["fetch.wait.max.ms"] == "50"
    expected = patient.ends()
    assert reader.ends() == expected
    assert expected["1"] > 7 + sum(1 for p, _k, _v in _views(40) if p == 1)  # the marker counts


@pytest.mark.kafka
def test_kafka_available_now_ends_at_the_trigger_snapshot_while_the_topic_grows(
    sources: Any, kafka_broker: str
) -> None:
    """``availableNow`` reads what the topic held when the trigger started: later records
    are left for the next query, however many micro-batches the first one takes (its
    end is the snapshot, not asked again per micro-batch); without it the end moves."""
    from localstate.contrib.spark.sources import KafkaSource
    from localstate.contrib.spark.sources._base import ReadAllAvailable, ReadMaxRows

    topic = _topic(kafka_broker, 3)
    _produce(kafka_broker, topic, _views(60))
    options = {"bootstrap.servers": kafka_broker, "topic": topic}
    source = KafkaSource(options)
    bounded, open_ended = source.streamReader(None), source.streamReader(None)
    bounded.prepareForTriggerAvailableNow()
    start = bounded.initialOffset()
    first = bounded.latestOffset(start, ReadMaxRows(30))
    assert sum(first.values()) == 30
    _produce(kafka_broker, topic, _views(30, start=60))
    assert bounded.latestOffset(first, ReadAllAvailable()) == {"0": 20, "1": 20, "2": 20}
    assert open_ended.latestOffset(start, ReadAllAvailable()) == {"0": 30, "1": 30, "2": 30}


@pytest.mark.kafka
def test_kafka_bad_input_is_clear(sources: Any, kafka_broker: str) -> None:
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-kafka").option("topic", "t").load().collect()
    assert "needs option 'kafka.bootstrap.servers'" in _error_text(e)
    with pytest.raises(Exception) as e:
        sources.read.format("localstate-kafka").option("bootstrap.servers", kafka_broker).load().collect()
    assert "needs option 'topic'" in _error_text(e)
    with pytest.raises(Exception) as e:
        _kafka(sources, kafka_broker, f"missing-{uuid.uuid4().hex[:8]}", **{"timeout.s": 5}).load().collect()
    assert "is not readable" in _error_text(e) and "fix option 'topic'" in _error_text(e)
    with pytest.raises(Exception) as e:
        _kafka(sources, kafka_broker, "t", format="json").load()
    assert "needs the value schema" in _error_text(e)
    topic = _topic(kafka_broker, 1)
    with pytest.raises(Exception) as e:
        _kafka(sources, kafka_broker, topic, startingOffsets="first").load().collect()
    assert "startingOffsets = 'first'" in _error_text(e)
    with pytest.raises(Exception) as e:
        _kafka(sources, kafka_broker, topic, endingOffsets="[1]").load().collect()
    assert "endingOffsets = '[1]'" in _error_text(e)
    for bad in ("0", "two"):
        with pytest.raises(Exception) as e:
            _kafka(sources, kafka_broker, topic, minPartitions=bad).load().collect()
        assert "'minPartitions'" in _error_text(e) and bad in _error_text(e)
    _produce(kafka_broker, topic, [(0, b"k", b"{not json")])
    with pytest.raises(Exception) as e:
        _kafka(sources, kafka_broker, topic, format="json").schema("user_id string").load().collect()
    assert topic in _error_text(e) and "malformed record" in _error_text(e) and "offset 0" in _error_text(e)
    # the same error policy as localstate-jsonl
    dropped = _kafka(sources, kafka_broker, topic, format="json", mode="DROPMALFORMED").schema("user_id string")
    assert dropped.load().collect() == []
    kept = _kafka(sources, kafka_broker, topic, format="json", mode="PERMISSIVE") \
        .schema("user_id string, _corrupt_record string").load().collect()
    assert [tuple(r) for r in kept] == [(None, "{not json")]


# -- end to end: a stateful streaming job over the sources ------------------------------------------------
@pytest.mark.kafka
def test_stateful_stream_over_kafka_counts_exactly_across_restarts(
    sources: Any, kafka_broker: str, tmp_path: Path
) -> None:
    from localstate.contrib.spark import StatefulJob

    topic = _topic(kafka_broker, 3)
    config = key_count_config(tmp_path, partitions=2, name=f"kc-{uuid.uuid4().hex[:6]}")
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    expected: Counter[str] = Counter()
    for start, n in ((0, 200), (200, 150)):
        records = _views(n, start)
        _produce(kafka_broker, topic, records)
        expected.update(json.loads(v)["user_id"] for _, _, v in records)
        stream = _kafka(sources, kafka_broker, topic, stream=True, format="json", maxOffsetsPerTrigger=120) \
            .schema("user_id string, ts long").load()
        query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True})
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        assert read_counts(config) == expected


def test_stateful_stream_over_jsonl_counts_exactly(sources: Any, tmp_path: Path) -> None:
    from localstate.contrib.spark import StatefulJob

    d = tmp_path / "in"
    d.mkdir()
    config = key_count_config(tmp_path, partitions=2, name="kc-jsonl")
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    expected: Counter[str] = Counter()
    for i in range(2):
        users = [f"u{(i * 7 + j) % 11}" for j in range(40)]
        (d / f"part-{i}.jsonl").write_text(_lines([{"user_id": u} for u in users]))
        os.sync()
        expected.update(users)
        stream = sources.readStream.format("localstate-jsonl").schema("user_id string").load(str(d))
        query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True})
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        assert read_counts(config) == expected
