"""``localstate.partitioning.task_for`` equals Spark's own routing of rows to tasks
(``df.repartition(N, key)``, as StatefulJob does) on a real local Spark session, for
every key type it supports: rescale relies on it to put state where its rows go."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from localstate import InvalidValueError
from localstate.partitioning import spark_hash, spark_hashes, task_for


def _strings() -> list[str | None]:
    rng = random.Random(5)
    alphabet = "abcXYZ019 _-é€𝄞\x00"
    out: list[str | None] = ["", "a", "ab", "abc", "abcd", "abcde", "user-1", "ü", "€€€", "𝄞", None]
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 23))) for _ in range(300)]
    return out


def _longs() -> list[int | None]:
    rng = random.Random(6)
    edge = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32, 2**63 - 1, -(2**63), None]
    return edge + [rng.randrange(-(2**63), 2**63) for _ in range(300)] + list(range(-50, 50))


def _spark_tasks(spark, column: pa.Array, partitions: int) -> list[tuple[object, int, int]]:
    """(key, task, hash) triples: the task as StatefulJob's routing puts the key's rows
    (repartition by the key column), and Spark's ``hash(key)``."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(pa.table({"k": column}))
    rows = df.repartition(partitions, "k").select("k", F.spark_partition_id().alias("p"), F.hash("k").alias("h"))
    return [(r["k"], r["p"], r["h"]) for r in rows.collect()]


COLUMNS = [
    pa.array(_strings(), pa.string()),
    pa.array(_longs(), pa.int64()),
    pa.array([v for v in _longs() if v is None or -(2**31) <= v < 2**31], pa.int32()),
    pa.array([b"", b"\x00", b"\xff\xfe\x80", bytes(range(256)), b"abcdefg", None], pa.binary()),
    pa.array([True, False, None], pa.bool_()),
    pa.array([0.0, -0.0, 1.5, -2.25, 1e300, float("inf"), float("-inf"), None], pa.float64()),
]


@pytest.mark.parametrize("column", COLUMNS, ids=[str(c.type) for c in COLUMNS])
def test_task_for_equals_spark_repartition(spark, column):
    """Per key type: the task ``df.repartition(4, key)`` picks, and Spark's ``hash(key)``
    — from which HashPartitioning takes ``pmod(hash, N)`` for every N (checked for 3 and 6)."""
    int32 = column.type == pa.int32()
    rows = _spark_tasks(spark, column, 4)
    assert len(rows) == len(column)
    wrong = [(k, p, h) for k, p, h in rows
             if (task_for(k, 4, as_int32=int32), spark_hash(k, as_int32=int32)) != (p, h)]
    assert not wrong, f"{column.type}: {wrong[:5]}"
    for n in (3, 6):
        assert all(task_for(k, n, as_int32=int32) == h % n for k, _, h in rows)


@pytest.mark.parametrize("bad", [1.5j, (1, 2), [1], object()])
def test_unsupported_key_types_are_refused(bad):
    with pytest.raises(InvalidValueError, match="cannot route key"):
        task_for(bad, 4)


@pytest.mark.parametrize("partitions", [0, -1, 2.0, True, "4"])
def test_partition_count_must_be_a_positive_int(partitions):
    with pytest.raises(InvalidValueError, match="partitions must be an int >= 1"):
        task_for("a", partitions)


def test_out_of_range_ints_are_refused():
    with pytest.raises(InvalidValueError, match="int64"):
        task_for(2**63, 4)
    with pytest.raises(InvalidValueError, match="int32"):
        task_for(2**31, 4, as_int32=True)
    with pytest.raises(InvalidValueError, match="NaN"):
        task_for(float("nan"), 4)


def test_the_vectorised_hash_equals_the_one_checked_against_spark():
    """``spark_hashes`` (numpy, grouped by length) gives exactly ``spark_hash`` per value,
    mixed types, every tail length, int32 and int64."""
    rng = random.Random(9)
    values: list = [v for column in COLUMNS for v in column.to_pylist()]
    values += [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 21))) for _ in range(2_000)]
    values += [rng.randrange(-(2**63), 2**63) for _ in range(2_000)]
    assert spark_hashes(values) == [spark_hash(v) for v in values]
    ints = [rng.randrange(-(2**31), 2**31) for _ in range(500)]
    assert spark_hashes(ints, as_int32=True) == [spark_hash(v, as_int32=True) for v in ints]
    assert spark_hashes([]) == []
    with pytest.raises(InvalidValueError, match="cannot route key"):
        spark_hashes(["a", (1, 2)])
