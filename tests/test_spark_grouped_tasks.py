"""Several tasks in one Spark task (``StatefulJob(spark_tasks=...)``).

The key → task mapping must stay ``repartition(N, key)``'s, every task must run (and
commit) each version even without rows, and a failure between two tasks' commits in one
Spark task must still apply the batch exactly once when it is run again.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from localstate import ConfigError, LocalStateError, TaskStorage
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.runner import (
    PARTITION_COLUMN,
    TaskRun,
    run_partitions,
    spark_task_keys,
    task_groups,
)
from localstate.contrib.spark.streaming import committed_batches
from localstate.partitioning import task_for
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

PARTITIONS = 4


def _job(root: Path, spark_tasks: int | None, task: type | None = None) -> StatefulJob:
    config = key_count_config(root, partitions=PARTITIONS, name="grouped")
    return StatefulJob(config, task or key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                       spark_tasks=spark_tasks)


def _input(spark: Any, users: list[str]) -> Any:
    return spark.createDataFrame([(u,) for u in users], "user_id string")


def _run(job: StatefulJob, df: Any, batch_id: int) -> dict[str, int]:
    rows = dataframe_to_arrow(job.transform(df, batch_id=batch_id)).to_pylist()
    return {r["key"]: r["count"] for r in rows}


def _keys_per_partition(config: Any) -> dict[int, set[str]]:
    out = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage, storage.store("counts").all() as items:
            out[p] = {k for k, _ in items}
    return out


def test_task_groups_and_spark_task_keys() -> None:
    assert task_groups(4, 2) == [[0, 2], [1, 3]]
    assert task_groups(5, 3) == [[0, 3], [1, 4], [2]]
    assert task_groups(3, 3) == [[0], [1], [2]]
    for spark_tasks in (1, 2, 3, 7):
        keys = spark_task_keys(spark_tasks)
        assert [task_for(v, spark_tasks, as_int32=True) for v in keys] == list(range(spark_tasks))


@pytest.mark.spark
def test_spark_places_each_key_value_on_its_spark_task(spark: Any) -> None:
    from pyspark.sql import functions as F

    for spark_tasks in (2, 3):
        keys = spark_task_keys(spark_tasks)
        df = spark.createDataFrame([(i,) for i in range(spark_tasks)], "slot int")
        placed = (df.repartition(spark_tasks, F.element_at(F.array(*map(F.lit, keys)), F.col("slot") + 1))
                  .select("slot", F.spark_partition_id().alias("spark_task")).collect())
        assert {r["slot"]: r["spark_task"] for r in placed} == {i: i for i in range(spark_tasks)}


@pytest.mark.spark
def test_grouped_runs_keep_each_key_in_its_task_and_count_exactly(spark: Any, tmp_path: Path) -> None:
    b0 = [f"u{i % 23}" for i in range(300)]
    b1 = [f"u{i % 11}" for i in range(120)]
    results = {}
    for spark_tasks in (PARTITIONS, 2, 1):
        job = _job(tmp_path / str(spark_tasks), spark_tasks)
        out0 = _run(job, _input(spark, b0), 0)
        out1 = _run(job, _input(spark, b1), 1)
        assert out0 == Counter(b0)
        assert out1 == {k: (Counter(b0) + Counter(b1))[k] for k in set(b1)}
        assert read_counts(job.config) == Counter(b0) + Counter(b1)
        # every task committed both versions, rows or not
        assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)
        results[spark_tasks] = _keys_per_partition(job.config)
    assert results[2] == results[1] == results[PARTITIONS]
    assert all(task_for(k, PARTITIONS) == p for p, ks in results[2].items() for k in ks)


@pytest.mark.spark
def test_a_task_without_rows_still_commits_the_version(spark: Any, tmp_path: Path) -> None:
    job = _job(tmp_path, 2)
    one_key = next(f"u{i}" for i in range(100) if task_for(f"u{i}", PARTITIONS) == 3)
    assert _run(job, _input(spark, [one_key] * 5), 0) == {one_key: 5}
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 0)


def _fail_once_task(marker: str, partition: int) -> type:
    """The key count task, failing in ``window`` of task ``partition`` while ``marker``
    exists (it removes it): a crash after the Spark task's other task has committed."""
    base = key_count_task()

    class FailOnce(base):  # type: ignore[valid-type, misc]
        def init(self, context: Any) -> None:
            super().init(context)
            self._partition = context.partition

        def window(self, emit: Any) -> None:
            marker_path = Path(marker)
            if self._partition == partition and marker_path.exists():
                marker_path.unlink()
                raise RuntimeError("injected failure between two commits of one Spark task")
            super().window(emit)

    return FailOnce


@pytest.mark.spark
def test_failure_between_two_commits_of_one_spark_task_reruns_exactly_once(spark: Any, tmp_path: Path) -> None:
    marker = tmp_path / "fail-once"
    # groups [0, 2] and [1, 3]: task 2 fails after task 0, in the same Spark task, committed
    job = _job(tmp_path / "job", 2, _fail_once_task(str(marker), 2))
    b0 = [f"u{i % 17}" for i in range(200)]
    b1 = [f"u{i % 13}" for i in range(90)]
    _run(job, _input(spark, b0), 0)
    marker.touch()
    with pytest.raises(Exception, match="injected failure"):
        _run(job, _input(spark, b1), 1)
    committed = committed_batches(job.config)
    assert committed[0] == 1 and committed[2] == 0, committed
    # the query runs batch 1 again with the same input: task 0 rolls back, every task applies it once
    out1 = _run(job, _input(spark, b1), 1)
    assert out1 == {k: (Counter(b0) + Counter(b1))[k] for k in set(b1)}
    assert read_counts(job.config) == Counter(b0) + Counter(b1)
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)


def test_rows_of_a_task_the_spark_task_does_not_run_are_refused(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=PARTITIONS, name="grouped")
    run = TaskRun(config, key_count_task(), pa.schema([("key", pa.string()), ("count", pa.int64())]), batch_id=0)
    batch = pa.record_batch({"user_id": ["a", "b"], PARTITION_COLUMN: pa.array([0, 1], pa.int32())})
    with pytest.raises(LocalStateError, match=r"runs tasks \[0, 2\] but got rows of task\(s\) \[1\]"):
        list(run_partitions(run, [0, 2], iter([batch])))
    # nothing was committed, and the tasks' locks were released
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS))
    with TaskStorage(config, 0), TaskStorage(config, 2):
        pass


def test_bad_spark_tasks_are_refused(tmp_path: Path) -> None:
    for bad in (0, 5, 2.0, True, "2"):
        with pytest.raises(ConfigError, match="spark_tasks must be an int from 1 to the task count 4"):
            _job(tmp_path, bad)  # type: ignore[arg-type]


@pytest.mark.spark
def test_an_input_column_named_like_the_partition_column_is_refused(spark: Any, tmp_path: Path) -> None:
    job = _job(tmp_path, 2)
    df = spark.createDataFrame([("a", 1)], f"user_id string, {PARTITION_COLUMN} int")
    with pytest.raises(ConfigError, match="rename it"):
        job.transform(df, batch_id=0)


@pytest.mark.spark
def test_a_grouped_stream_counts_exactly_and_reports_every_tasks_metrics(spark: Any, tmp_path: Path) -> None:
    """run_stream with 4 tasks in 2 Spark tasks: two micro-batches (one file each), the
    output of each is the running totals of its keys, every task commits both, and the
    observed metrics count all 4 tasks."""
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    src = tmp_path / "in"
    src.mkdir()
    files = [[f"u{i % 9}" for i in range(60)], [f"u{i % 4}" for i in range(25)]]
    for n, users in enumerate(files):
        (src / f"{n}.jsonl").write_text("".join(f'{{"user_id": "{u}"}}\n' for u in users))
    job = _job(tmp_path / "job", 2)
    outputs: dict[int, dict[str, int]] = {}

    def output(df: Any, batch_id: int) -> None:
        outputs[batch_id] = {r["key"]: r["count"] for r in dataframe_to_arrow(df).to_pylist()}

    stream = (spark.readStream.format("localstate-jsonl").schema("user_id string").option("maxFilesPerTrigger", 1)
              .load(str(src)))
    query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True},
                           output=output)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    total = Counter(files[0]) + Counter(files[1])
    assert outputs == {0: dict(Counter(files[0])), 1: {k: total[k] for k in set(files[1])}}
    assert read_counts(job.config) == total
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)
    observed = query.lastProgress["observedMetrics"]["localstate.counts"]
    assert (observed["numTasks"], observed["commits"], observed["numRowsUpdated"]) == (PARTITIONS, PARTITIONS, 4)


@pytest.mark.spark
def test_grouped_batch_runs_apply_each_run_once_with_every_tasks_metrics(spark: Any, tmp_path: Path) -> None:
    job = _job(tmp_path, 3)  # groups [0, 3], [1], [2]: unequal groups
    users = [f"u{i % 10}" for i in range(70)]
    first = {r["key"]: r["count"] for r in dataframe_to_arrow(job.run(_input(spark, users))).to_pylist()}
    second = {r["key"]: r["count"] for r in dataframe_to_arrow(job.run(_input(spark, users))).to_pylist()}
    assert first == Counter(users)
    assert second == {k: 2 * v for k, v in Counter(users).items()}
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)
    assert job.batch_metrics[1]["counts"]["numTasks"] == PARTITIONS
