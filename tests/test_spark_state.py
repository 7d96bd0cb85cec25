"""Spark: the ``localstate-state`` data source on a real local session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage

pytestmark = pytest.mark.spark


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "job.properties"
    path.write_text(
        "\n".join([
            "job.name = st",
            "job.partitions = 2",
            f"job.state.dir = {tmp_path / 'state'}",
            f"systems.file.path = {tmp_path / 'changelog'}",
            "stores.counts.factory = rocksdb",
            "stores.counts.changelog = file.st-counts",
            "stores.counts.key.serde = string",
            "stores.counts.msg.serde = long",
            "stores.profiles.factory = memory",
            "stores.profiles.changelog = file.st-profiles",
            "stores.profiles.key.serde = tuple",
            "stores.profiles.msg.serde = json",
            "stores.scratch.factory = memory",
            "stores.scratch.changelog = none",
        ])
        + "\n"
    )
    return path


@pytest.fixture
def state_job(tmp_path: Path) -> Path:
    path = _job(tmp_path)
    config = Config.load(path)
    for p in range(2):
        with TaskStorage(config, p) as storage:
            storage.store("counts").update({f"u{p}{i}": p * 100 + i for i in range(3)})
            storage.store("profiles").update({(p, f"user{i}"): {"age": 20 + i, "city": f"c{p}", "tags": [i]}
                                              for i in range(2)})
            storage.commit()
            storage.store("counts")["u00"] = -1  # not committed
            storage.store("counts").flush()
    return path


def test_state_source_reads_decoded_committed_state(spark, state_job: Path) -> None:
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    counts = spark.read.format("localstate-state").option("config", str(state_job)).option("store", "counts").load()
    assert counts.schema.simpleString() == "struct<partition:int,key:string,value:bigint>"
    assert sorted(tuple(r) for r in counts.collect()) == [
        (0, "u00", 0), (0, "u01", 1), (0, "u02", 2), (1, "u10", 100), (1, "u11", 101), (1, "u12", 102),
    ]
    profiles = spark.read.format("localstate-state").option("config", str(state_job)).option("store", "profiles").load()
    assert profiles.schema.simpleString() == (
        "struct<partition:int,key_0:bigint,key_1:string,age:bigint,city:string,tags:string>"
    )
    rows = sorted(tuple(r) for r in profiles.where("age > 20").collect())
    assert rows == [(0, 0, "user1", 21, "c0", "[1]"), (1, 1, "user1", 21, "c1", "[1]")]
    whole = (spark.read.format("localstate-state").option("config", str(state_job)).option("store", "profiles")
             .option("flatten", "false").option("partitions", "1").load())
    assert [tuple(r) for r in whole.orderBy("key").collect()][0] == (
        1, '[1, "user0"]', '{"age": 20, "city": "c1", "tags": [0]}'
    )
    typed = (spark.read.format("localstate-state").schema("key string, value double")
             .option("config", str(state_job)).option("store", "counts").option("inMemory", "false").load())
    assert sorted(r.value for r in typed.collect())[:2] == [0.0, 1.0]


def test_state_source_bad_options_are_clear(spark, state_job: Path) -> None:
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)

    def load(**options: str):
        reader = spark.read.format("localstate-state")
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load().collect()

    with pytest.raises(Exception, match="needs options 'config'"):
        load(store="counts")
    with pytest.raises(Exception, match="no store named 'count'"):
        load(config=str(state_job), store="count")
    with pytest.raises(Exception, match="no changelog"):
        load(config=str(state_job), store="scratch")
    with pytest.raises(Exception, match=r"partitions \[7\] out of range"):
        load(config=str(state_job), store="counts", partitions="0,7")
    with pytest.raises(Exception, match="column 'value' is bigint"):
        (spark.read.format("localstate-state").schema("key string, value long")
         .option("config", str(state_job)).option("store", "profiles").option("flatten", "false").load().collect())


def test_streaming_progress_carries_state_metrics(spark, tmp_path: Path) -> None:
    """Every micro-batch's state metrics (summed over its tasks) sit beside the query's
    progress, shaped like Spark's stateOperators; and the state source reads the result."""
    from localstate.contrib.spark import StatefulJob
    from localstate.contrib.spark.metrics import state_progress
    from localstate.contrib.spark.sources import register_sources
    from localstate.testing.spark import KeyCount, key_count_config, key_count_task

    register_sources(spark)
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(f'{{"user_id": "u{i % 5}"}}\n' for i in range(40)))
    config = key_count_config(tmp_path, partitions=2, engine="rocksdb", name="kcm")
    # every task closes after its run (keep_open_s=0), so its close time is a real close's;
    # a task kept open for the worker's next run parks in well under a millisecond
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA, keep_open_s=0)
    from pyspark.sql.streaming import StreamingQueryListener

    heard: list[Any] = []

    class Listener(StreamingQueryListener):  # what a monitoring system sees: no localstate code
        def onQueryStarted(self, event: Any) -> None: ...
        def onQueryIdle(self, event: Any) -> None: ...
        def onQueryTerminated(self, event: Any) -> None: ...

        def onQueryProgress(self, event: Any) -> None:
            heard.append(event.progress.observedMetrics.get("localstate.counts"))

    listener = Listener()
    spark.streams.addListener(listener)
    stream = spark.readStream.format("localstate-jsonl").schema("user_id string").load(str(src))
    query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(180)
    deadline = time.monotonic() + 30  # listener events arrive asynchronously
    while not any(heard) and time.monotonic() < deadline:
        time.sleep(0.2)
    spark.streams.removeListener(listener)
    assert any(row is not None and row["numRowsUpdated"] == 5 for row in heard), heard
    assert query.exception() is None, query.exception()
    progress = state_progress(job, query)
    assert progress is not None and progress["numInputRows"] == 40
    counts = progress["localstateStores"]["counts"]
    assert counts["numTasks"] == 2
    assert counts["numRowsUpdated"] == 5  # five distinct users, one put_all entry each
    assert counts["numRowsTotal"] == 5  # RocksDB's estimate, summed over the partitions
    assert counts["customMetrics"]["records_logged"] == 5
    assert counts["customMetrics"]["commits"] == 2
    assert counts["commitTimeMs"] >= 0
    # the close (rocksdb's local snapshot) is timed too: each task closes before its
    # figures leave it, so a close of 0 ms in both tasks would mean it was not counted
    assert counts["closeTimeMs"] > 0 and "close_time_ms" not in counts["customMetrics"]
    # the same figures inside Spark's own StreamingQueryProgress, as observed metrics
    observed = query.lastProgress["observedMetrics"]
    assert set(observed) == {"localstate.counts"}
    row = observed["localstate.counts"]
    assert (row["numRowsUpdated"], row["numRowsTotal"], row["numTasks"]) == (5, 5, 2)
    assert (row["records_logged"], row["commits"], row["numRowsRemoved"]) == (5, 2, 0)
    assert row["commitTimeMs"] >= 0 and abs(row["closeTimeMs"] - counts["closeTimeMs"]) <= 1  # rounding of a float sum
    # a batch run (an action) gathers the same per-store figures under its version
    batch = spark.createDataFrame([(f"u{i % 5}",) for i in range(10)], "user_id string")
    job.run(batch)
    version = max(job.batch_metrics)
    assert job.batch_metrics[version]["counts"]["numRowsUpdated"] == 5
    assert job.batch_metrics[version]["counts"]["numTasks"] == 2
    job_file = tmp_path / "kcm.properties"
    job_file.write_text("\n".join(f"{k} = {v}" for k, v in config.to_dict().items()) + "\n")
    state = spark.read.format("localstate-state").option("config", str(job_file)).option("store", "counts").load()
    assert {r.key: r.value for r in state.collect()} == {f"u{i}": 10 for i in range(5)}


def test_a_stream_plan_evaluated_outside_its_query_is_refused_and_commits_nothing(spark, tmp_path: Path) -> None:
    """The tasks of run_stream's plan take their commit version from Spark's micro-batch;
    evaluated as a plain batch DataFrame they have none: a clear error, no state written."""
    from localstate import TaskStorage
    from localstate.contrib.spark import StatefulJob
    from localstate.testing.spark import KeyCount, key_count_config, key_count_task

    config = key_count_config(tmp_path, partitions=2, engine="memory", name="kcx")
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    df = spark.createDataFrame([("u1",), ("u2",)], "user_id string")
    with pytest.raises(Exception, match="streaming.sql.batchId"):
        job.transform(df, in_stream_plan=True).collect()
    for p in range(2):
        with TaskStorage(config, p) as st:
            assert st.checkpoint is None and dict(st.store("counts")) == {}


def test_an_output_column_named_like_the_metrics_column_is_refused_before_the_stream_starts(tmp_path: Path) -> None:
    from localstate import ConfigError
    from localstate.contrib.spark.metrics import METRICS_COLUMN, with_metrics_column
    from pyspark.sql.types import LongType, StructField, StructType

    struct = StructType([StructField("user_id", LongType(), False), StructField(METRICS_COLUMN, LongType())])
    with pytest.raises(ConfigError, match="rename it"):
        with_metrics_column(struct)
    widened = with_metrics_column(StructType([StructField("user_id", LongType(), False)]))
    assert widened.names == ["user_id", METRICS_COLUMN] and widened["user_id"].nullable


def test_a_tasks_metrics_row_carries_each_store_field_and_nulls_elsewhere(tmp_path: Path) -> None:
    import pyarrow as pa
    from localstate.contrib.spark.metrics import (
        METRICS_COLUMN,
        OBSERVED_FIELDS,
        metrics_batch,
        task_snapshot,
        with_close_time,
        with_null_metrics,
    )

    config = Config.from_dict({"job.name": "mrow", "job.state.dir": str(tmp_path / "s"),
                               "systems.file.path": str(tmp_path / "c"),
                               "stores.counts.factory": "rocksdb", "stores.counts.key.serde": "string",
                               "stores.counts.msg.serde": "long"})
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    with TaskStorage(config) as st:
        st.store("counts").update({"a": 1, "b": 2})
        st.store("counts").delete("a")
        st.commit()
        row = metrics_batch(with_close_time(task_snapshot(st), 0.0125), schema)
    assert row.num_rows == 1 and row.schema.names == ["user", "n", METRICS_COLUMN]
    assert row.column("user").null_count == 1 and row.column("n").null_count == 1
    entries = dict(row.column(METRICS_COLUMN).to_pylist()[0])
    assert {k.split(".", 1)[1] for k in entries} <= set(OBSERVED_FIELDS)
    assert (entries["counts.numRowsUpdated"], entries["counts.numRowsRemoved"], entries["counts.numTasks"]) == (2, 1, 1)
    assert entries["counts.commits"] == 1 and entries["counts.numRowsTotal"] >= 0
    assert entries["counts.closeTimeMs"] == 12  # the close time given, in whole ms as Spark's own fields
    out = with_null_metrics(pa.record_batch({"user": ["x"], "n": [3]}, schema=schema))
    assert out.column(METRICS_COLUMN).null_count == 1 and out.column("n").to_pylist() == [3]
