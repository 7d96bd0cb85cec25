"""Issue 14 case 14: a batch run is an action that runs every task exactly once.

``StatefulJob.run(df)`` used to return the lazy ``mapInArrow`` plan: the README's own
``run(df).show()`` ran 1 task of 4 (the rest of the input was never applied), and
each further action applied the input again. Real local Spark session.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from localstate import LocalStateError
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.streaming import committed_batches
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

pytestmark = pytest.mark.spark


def _input(spark, rows: int, keys: int, seed: int):
    rng = random.Random(seed)
    users = [f"user-{rng.randrange(keys):04d}" for _ in range(rows)]
    return spark.createDataFrame([(u,) for u in users], "user_id string"), Counter(users)


def _job(config):
    return StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)


def test_show_runs_every_task_and_more_actions_apply_nothing_again(spark, tmp_path):
    config = key_count_config(tmp_path, partitions=4)
    df, expected = _input(spark, 20_000, 500, seed=1)
    result = _job(config).run(df)
    assert committed_batches(config) == dict.fromkeys(range(4), 0)  # all 4 tasks, before any action
    result.show(3)
    assert result.count() == result.count() == len(expected)
    assert {r["key"]: r["count"] for r in result.collect()} == dict(expected)
    assert read_counts(config) == dict(expected)  # applied exactly once
    assert committed_batches(config) == dict.fromkeys(range(4), 0)


def test_consecutive_runs_add_up_and_versions_advance(spark, tmp_path):
    config = key_count_config(tmp_path, partitions=4)
    df1, c1 = _input(spark, 5_000, 200, seed=2)
    df2, c2 = _input(spark, 5_000, 200, seed=3)
    _job(config).run(df1).count()
    _job(config).run(df2).count()
    assert committed_batches(config) == dict.fromkeys(range(4), 1)
    assert read_counts(config) == dict(c1 + c2)


def test_an_unfinished_run_is_named_and_repeating_it_completes_it_once(spark, tmp_path):
    """A driver that died mid-run leaves some tasks at version V, others at V-1. The next
    run refuses to guess; repeating version V with the same input applies it once."""
    config = key_count_config(tmp_path, partitions=4)
    df1, c1 = _input(spark, 4_000, 100, seed=4)
    _job(config).run(df1).count()
    df2, c2 = _input(spark, 4_000, 100, seed=5)
    # The unfinished run, simulated by running version 1 only on partitions 0 and 1
    # (a stand-in for a driver killed mid-job: what it leaves behind is exactly this).
    from localstate.contrib.spark.runner import TaskRun, run_partition
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    job = _job(config)
    run = TaskRun(config, job.task, to_arrow_schema(_parse_datatype_string(KeyCount.OUTPUT_SCHEMA)), 1, 10.0)
    parts = dataframe_to_arrow(df2.repartition(4, "user_id"))
    from pyspark.sql.functions import spark_partition_id

    with_pid = dataframe_to_arrow(df2.repartition(4, "user_id").withColumn("pid", spark_partition_id()))
    assert parts.num_rows == with_pid.num_rows
    for p in (0, 1):
        rows = with_pid.filter(with_pid.column("pid").to_numpy() == p).drop(["pid"])
        list(run_partition(run, p, iter(rows.to_batches())))
    assert committed_batches(config) == {0: 1, 1: 1, 2: 0, 3: 0}
    with pytest.raises(LocalStateError, match=r"job.run\(df, version=1\)"):
        _job(config).run(df2)
    _job(config).run(df2, version=1).count()
    assert committed_batches(config) == dict.fromkeys(range(4), 1)
    assert read_counts(config) == dict(c1 + c2)
