"""The exactly-once protocol of :mod:`localstate.contrib.spark.streaming`, step by step.

Micro-batch ``B`` commits every task with ``version = B``. A batch that Spark runs
again (its commit log never got ``B``) rolls the task back to the version ``B``
replaced and applies ``B`` once more; state ahead of Spark's checkpoint is an error.
These tests drive :meth:`StatefulJob.transform` with explicit batch ids on the shared
``local[2]`` session (the real foreachBatch path and driver kills are covered by
``test_spark_jobs.py``, ``test_spark_input_sources.py`` and ``test_spark_driver_kill.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate import LocalStateError, TaskStorage
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.streaming import committed_batches, prepare_version, stream_position
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

pytestmark = [pytest.mark.spark]

PARTITIONS = 2


def _job(tmp_path: Path) -> StatefulJob:
    config = key_count_config(tmp_path, partitions=PARTITIONS, name="proto")
    return StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)


def _input(spark: Any, users: list[str]) -> Any:
    return spark.createDataFrame([(u,) for u in users], "user_id string")


def _run(job: StatefulJob, df: Any, batch_id: int) -> dict[str, int]:
    rows = dataframe_to_arrow(job.transform(df, batch_id=batch_id)).to_pylist()
    return {r["key"]: r["count"] for r in rows}


def test_a_batch_run_twice_is_rolled_back_and_applied_once(spark: Any, tmp_path: Path) -> None:
    job = _job(tmp_path)
    b0 = [f"u{i % 7}" for i in range(50)]
    b1 = [f"u{i % 5}" for i in range(30)]
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS))

    out0 = _run(job, _input(spark, b0), 0)
    assert out0 == Counter(b0)
    out1 = _run(job, _input(spark, b1), 1)
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)

    # Spark re-runs batch 1 (e.g. the driver died before its commit log): same input,
    # same output, and the state counts batch 1 once.
    assert _run(job, _input(spark, b1), 1) == out1 == {k: (Counter(b0) + Counter(b1))[k] for k in set(b1)}
    assert read_counts(job.config) == Counter(b0) + Counter(b1)
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 1)

    # The partition rolled back to version 0 and replayed batch 1: the task checkpoint
    # of batch 1 still records version 0 as the one to roll back to.
    with TaskStorage(job.config, 0) as s:
        pos = s.checkpoint.input_position  # type: ignore[union-attr]
        assert pos["batch_id"] == 1 and pos["previous"]["version"] == 0

    out2 = _run(job, _input(spark, ["u1"]), 2)
    assert out2 == {"u1": read_counts(job.config)["u1"]}


def test_state_ahead_of_spark_is_a_clear_error_and_loses_nothing(spark: Any, tmp_path: Path) -> None:
    job = _job(tmp_path)
    for b in range(3):
        _run(job, _input(spark, ["a", "b", "c", "a"]), b)
    before = read_counts(job.config)
    assert before == {"a": 6, "b": 3, "c": 3}
    # A fresh Spark checkpoint location starts again at batch 0: the state is ahead.
    with pytest.raises(Exception) as e:
        _run(job, _input(spark, ["a"]), 0)
    text = str(e.value)
    assert "job 'proto' partition" in text and "committed version 2" in text and "micro-batch 0" in text
    assert "checkpoint location" in text
    assert read_counts(job.config) == before
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 2)


def test_prepare_version_rolls_back_only_the_batch_being_rerun(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=1, name="prep")
    assert prepare_version(config, 0, 0) is False  # nothing committed: nothing to do
    with TaskStorage(config, 0) as s:
        s.store("counts").put("k", 1)
        s.commit(stream_position(0, 1, None), version=0)
    assert prepare_version(config, 0, 1) is False  # the next batch: the normal case
    with TaskStorage(config, 0) as s:
        previous = s.checkpoint
        s.store("counts").put("k", 2)
        s.commit(stream_position(1, 1, previous), version=1)
    assert committed_batches(config) == {0: 1}

    assert prepare_version(config, 0, 1) is True  # batch 1 again: back to version 0
    assert committed_batches(config) == {0: 0}
    with TaskStorage(config, 0) as s:
        assert s.store("counts").get("k") == 1  # the rolled-back write is gone
    # One step of history: Spark re-runs only its last uncommitted batch, so once batch
    # 1 is re-run, batch 0 was committed by Spark and is never run again.
    with pytest.raises(LocalStateError, match="ahead of the streaming checkpoint"):
        prepare_version(config, 0, 0)

    # The first batch re-run rolls back to no state at all.
    fresh = key_count_config(tmp_path / "fresh", partitions=1, name="prep0")
    with TaskStorage(fresh, 0) as s:
        s.store("counts").put("k", 1)
        s.commit(stream_position(0, 1, None), version=0)
    assert prepare_version(fresh, 0, 0) is True
    assert committed_batches(fresh) == {0: None}
    with TaskStorage(fresh, 0) as s:
        assert s.store("counts").get("k") is None

    # A checkpoint written by a batch run (no stream position) is not a streaming one.
    with TaskStorage(config, 0) as s:
        s.commit({"rows": 1}, version=5)
    with pytest.raises(LocalStateError, match="ahead of the streaming checkpoint"):
        prepare_version(config, 0, 5)
