"""The Spark runner: StatefulJob batch runs on the shared local Spark session."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from localstate import Config, ConfigError, LocalStateError, TaskStorage
from localstate.contrib.spark import Emitter, StatefulJob, StreamTask, TaskContext
from localstate.contrib.spark.compat import dataframe_from_arrow, dataframe_to_arrow
from localstate.contrib.spark.runner import TaskRun, run_partition
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

pytestmark = pytest.mark.spark


def events(n: int, users: int, seed: int = 1) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, users, n)
    return pa.table({"user_id": pa.array([f"u{i}" for i in ids]), "ts": pa.array(np.arange(n, dtype=np.int64))})


def exact(table: pa.Table) -> dict[str, int]:
    return dict(Counter(table.column("user_id").to_pylist()))


def test_batch_run_counts_equal_exact_and_output_has_schema(spark: Any, tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=3)
    table = events(20_000, 500)
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    out = dataframe_to_arrow(job.run(dataframe_from_arrow(spark, table)))
    assert out.schema.names == ["key", "count"]
    assert dict(zip(out["key"].to_pylist(), out["count"].to_pylist())) == exact(table)
    assert read_counts(config) == exact(table)
    # One task per partition, each committed once, keys disjoint across partitions.
    seen: set[str] = set()
    for p in range(3):
        with TaskStorage(config, p) as storage:
            # a batch run commits version 0, then 1, ... (the streaming protocol's batch ids)
            assert storage.checkpoint is not None and storage.checkpoint.version == 0
            with storage.store("counts").all() as items:
                keys = {k for k, _ in items}
            assert keys and not keys & seen
            seen |= keys
            assert storage.checkpoint.input_position["rows"] == sum(exact(table)[k] for k in keys)


def test_per_record_path_equals_arrow_path_and_runs_continue_from_state(spark: Any, tmp_path: Path) -> None:
    first, second = events(6_000, 300, seed=2), events(4_000, 300, seed=3)
    results = []
    for per_record in (False, True):
        config = key_count_config(tmp_path / str(per_record), partitions=2, engine="rocksdb")
        job = StatefulJob(config, key_count_task(per_record=per_record), key="user_id",
                          output_schema=KeyCount.OUTPUT_SCHEMA)
        dataframe_to_arrow(job.run(dataframe_from_arrow(spark, first)))
        dataframe_to_arrow(job.run(dataframe_from_arrow(spark, second)))
        results.append(read_counts(config))
    both = Counter(exact(first)) + Counter(exact(second))
    assert results[0] == results[1] == dict(both)


def test_state_loss_restores_from_changelog_before_the_next_run(spark: Any, tmp_path: Path) -> None:
    """Deleting job.state.dir is what a task moving to a fresh executor sees."""
    config = key_count_config(tmp_path, partitions=2, engine="rocksdb")
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    a, b = events(5_000, 200, seed=4), events(5_000, 200, seed=5)
    dataframe_to_arrow(job.run(dataframe_from_arrow(spark, a)))
    shutil.rmtree(config.state_dir)
    out = dataframe_to_arrow(job.run(dataframe_from_arrow(spark, b)))
    total = dict(Counter(exact(a)) + Counter(exact(b)))
    assert dict(zip(out["key"].to_pylist(), out["count"].to_pylist())) == {k: total[k] for k in exact(b)}
    assert read_counts(config) == total


class _Echo(StreamTask):
    """Emits every row through all three Emitter forms (row, rows, arrow)."""

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        rows = batch.to_pylist()
        if rows:
            emit({"user_id": rows[0]["user_id"], "ts": rows[0]["ts"]})
            emit.rows([{"user_id": r["user_id"], "ts": r["ts"]} for r in rows[1:2]])
            emit.arrow(batch.slice(2))


def test_emitter_keeps_order_across_forms_and_casts_to_schema(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=1)
    table = events(10, 3)
    schema = pa.schema([("ts", pa.int64()), ("user_id", pa.string())])
    out = pa.Table.from_batches(list(run_partition(TaskRun(config, _Echo, schema), 0, iter(table.to_batches()))))
    assert out.schema == schema
    assert out.to_pylist() == table.select(["ts", "user_id"]).to_pylist()
    with TaskStorage(config, 0) as storage:
        assert storage.checkpoint is not None and storage.checkpoint.input_position == {"rows": 10}


def test_emitted_rows_that_do_not_fit_the_schema_are_a_clear_error(tmp_path: Path) -> None:
    emit = Emitter(pa.schema([("views", pa.int64())]))
    emit({"views": "many"})
    with pytest.raises(LocalStateError, match="output schema"):
        emit.drain()
    with pytest.raises(LocalStateError, match="does not fit"):
        emit.arrow(pa.RecordBatch.from_pydict({"other": [1]}))


def test_failed_task_commits_nothing_and_releases_the_partition(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=1)

    class Boom(StreamTask):
        def init(self, context: TaskContext) -> None:
            self.counts = context.store("counts")

        def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
            self.counts["x"] = 1
            raise RuntimeError("task failed")

    schema = pa.schema([("key", pa.string()), ("count", pa.int64())])
    with pytest.raises(RuntimeError, match="task failed"):
        list(run_partition(TaskRun(config, Boom, schema), 0, iter(events(5, 2).to_batches())))
    with TaskStorage(config, 0) as storage:
        assert storage.checkpoint is None
        assert storage.store("counts").get("x") is None


def test_bad_job_definitions_are_rejected_up_front(spark: Any, tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=2)
    task = key_count_task()
    with pytest.raises(ConfigError, match="num_tasks = 3 but job.partitions = 2"):
        StatefulJob(config, task, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA, num_tasks=3)
    with pytest.raises(TypeError, match="StreamTask subclass"):
        StatefulJob(config, dict, key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="localstate.Config"):
        StatefulJob({"job.name": "x"}, task, key="user_id", output_schema="a long")  # type: ignore[arg-type]
    df = dataframe_from_arrow(spark, events(10, 2))
    with pytest.raises(ConfigError, match="key column 'user' is not in the input"):
        StatefulJob(config, task, key="user", output_schema=KeyCount.OUTPUT_SCHEMA).run(df)
    with pytest.raises(ConfigError, match="not a valid Spark DDL schema"):
        StatefulJob(config, task, key="user_id", output_schema="key strin g,,").run(df)


def test_spark_session_defaults(spark: Any) -> None:
    import os

    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert isinstance(key_count_config("/tmp/x"), Config)
