"""Emitter: the rows a task emits must name exactly the output schema's columns.

A misspelt field is an error naming it, the schema and the closest column; a missing
one is an error too (a null is given explicitly, and only a nullable column takes it).
The task runs for real (run_partition over a real store, and one Spark batch run): a
partition whose rows do not fit fails and commits nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from localstate import LocalStateError, TaskStorage
from localstate.contrib.spark import Emitter, StatefulJob, StreamTask, TaskContext
from localstate.contrib.spark.runner import TaskRun, run_partition
from localstate.testing.spark import key_count_config

SCHEMA = pa.schema([pa.field("user_id", pa.string(), nullable=False), ("views", pa.int64()), ("note", pa.string())])


def test_a_misspelt_field_is_an_error_naming_it_the_schema_and_the_closest_column() -> None:
    emit = Emitter(SCHEMA)
    emit({"user_id": "u1", "views": 1, "note": None})
    emit({"user_id": "u2", "veiws": 2, "note": None})
    with pytest.raises(LocalStateError) as e:
        emit.drain()
    message = str(e.value)
    assert "unknown field(s) 'veiws' (did you mean 'views'?)" in message
    assert "(user_id: string not null, views: int64, note: string)" in message
    assert "'veiws': 2" in message  # the offending row
    assert "missing field(s) 'views'" in message


def test_an_extra_field_with_no_close_column_is_an_error_too() -> None:
    emit = Emitter(SCHEMA)
    emit.rows([{"user_id": "u1", "views": 1, "note": None, "zzz": 3}])
    with pytest.raises(LocalStateError, match=r"unknown field\(s\) 'zzz'; *$|unknown field\(s\) 'zzz'$"):
        emit.drain()


def test_a_missing_field_is_an_error_and_an_explicit_none_is_a_null_where_nullable() -> None:
    emit = Emitter(SCHEMA)
    emit({"user_id": "u1", "views": 1})
    with pytest.raises(LocalStateError, match=r"missing field\(s\) 'note' \(nullable: to emit a null, give 'note': None\)"):
        emit.drain()
    emit({"views": 1, "note": "x"})
    with pytest.raises(LocalStateError, match=r"missing field\(s\) 'user_id' \(not nullable\)"):
        emit.drain()
    emit({"user_id": None, "views": 1, "note": "x"})
    with pytest.raises(LocalStateError, match="output column 'user_id' is not nullable but got a null"):
        emit.drain()
    emit({"user_id": "u1", "views": None, "note": None})
    emit.rows([{"note": "n", "views": 2, "user_id": "u2"}])  # key order does not matter
    assert pa.Table.from_batches(emit.drain()).to_pylist() == [
        {"user_id": "u1", "views": None, "note": None}, {"user_id": "u2", "views": 2, "note": "n"},
    ]


def test_a_row_that_is_not_a_dict_is_named() -> None:
    emit = Emitter(SCHEMA)
    emit({"user_id": "u1", "views": 1, "note": None})
    emit(("u2", 2, None))  # type: ignore[arg-type]
    with pytest.raises(LocalStateError, match="emitted row 1 of this batch is a tuple, not a dict"):
        emit.drain()


def test_an_arrow_batch_lacking_a_column_names_the_closest_and_nulls_in_a_required_column_are_refused() -> None:
    emit = Emitter(SCHEMA)
    with pytest.raises(LocalStateError, match=r"lacks the column\(s\) 'user_id' \(the batch has 'user'\)"):
        emit.arrow(pa.record_batch({"user": ["u"], "views": [1], "note": ["x"]}))
    with pytest.raises(LocalStateError, match="user_id.*non-nullable"):
        emit.arrow(pa.record_batch({"user_id": pa.array([None], pa.string()), "views": [1], "note": ["x"]}))
    emit.arrow(pa.record_batch({"user_id": ["u"], "views": [1], "note": [None], "extra": [0]}))  # extra columns: fine
    assert pa.Table.from_batches(emit.drain()).to_pylist() == [{"user_id": "u", "views": 1, "note": None}]


class _Misspelt(StreamTask):
    """Counts views per user and emits each total with a misspelt column name."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        user = record["user_id"]
        n = self.counts[user] = (self.counts.get(user) or 0) + 1
        emit({"user_id": user, "view": n})


OUT = pa.schema([("user_id", pa.string()), ("views", pa.int64())])


def test_a_partition_whose_rows_do_not_fit_fails_and_commits_nothing(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=1)
    batch = pa.record_batch({"user_id": ["u1", "u2", "u1"]})
    with pytest.raises(LocalStateError, match=r"unknown field\(s\) 'view' \(did you mean 'views'\?\)"):
        list(run_partition(TaskRun(config, _Misspelt, OUT), 0, iter([batch])))
    with TaskStorage(config, 0) as storage:
        assert storage.checkpoint is None and storage.store("counts").get("u1") is None


@pytest.mark.spark
def test_a_spark_job_whose_task_misspells_a_column_fails_with_the_name(spark: Any, tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=1, name="misspelt")
    job = StatefulJob(config, _Misspelt, key="user_id", output_schema="user_id string, views long")
    df = spark.createDataFrame([("u1",), ("u2",)], "user_id string")
    with pytest.raises(Exception, match=r"unknown field\(s\) 'view' \(did you mean 'views'\?\)"):
        job.run(df).collect()
    with TaskStorage(config, 0) as storage:
        assert storage.checkpoint is None
