"""PySpark versions: the runner works on the oldest supported PySpark, and a part that
needs a newer one says which version, instead of failing deep inside Spark.

CI runs this file and the runner tests twice: with the newest PySpark (the main run)
and with the oldest one the runner supports (``RUNNER_PYSPARK``, a second virtualenv
made by ``.ci/run``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from localstate import LocalStateError
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.compat import (
    RUNNER_PYSPARK,
    SOURCES_PYSPARK,
    PySparkVersionError,
    dataframe_from_arrow,
    dataframe_to_arrow,
    pyspark_version,
    require_pyspark,
)
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts


def test_installed_version_is_parsed_and_supported_by_the_runner() -> None:
    assert pyspark_version() == tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    assert pyspark_version() >= RUNNER_PYSPARK
    require_pyspark(RUNNER_PYSPARK, "the runner")


def test_a_part_that_needs_a_newer_pyspark_names_part_versions_and_fix() -> None:
    newer = (pyspark_version()[0] + 1, 0)
    with pytest.raises(PySparkVersionError) as info:
        require_pyspark(newer, "the frobnicator")
    message = str(info.value)
    assert f"the frobnicator needs pyspark>={newer[0]}.0" in message
    assert f"pyspark {pyspark.__version__} is installed" in message
    assert f"pip install 'pyspark>={newer[0]}.0'" in message
    # Both a LocalStateError (our hierarchy) and an ImportError (what a caller guarding
    # an optional import catches).
    assert isinstance(info.value, LocalStateError) and isinstance(info.value, ImportError)


def test_the_data_sources_import_only_on_a_pyspark_that_has_them() -> None:
    result = subprocess.run([sys.executable, "-c", "import localstate.contrib.spark.sources"],
                            capture_output=True, text=True, timeout=120)
    if pyspark_version() >= SOURCES_PYSPARK:
        assert result.returncode == 0, result.stderr[-2000:]
    else:
        assert result.returncode != 0
        assert "PySparkVersionError" in result.stderr
        assert "localstate Spark data sources" in result.stderr
        assert "needs pyspark>=4.2" in result.stderr


@pytest.mark.spark
def test_arrow_round_trip_keeps_types_and_nulls(spark: Any) -> None:
    table = pa.table({
        "user_id": pa.array(["a", None, "c"]),
        "count": pa.array([1, None, 3], pa.int64()),
        "score": pa.array([0.5, 1.5, None], pa.float64()),
        "flag": pa.array([True, False, None]),
    })
    back = dataframe_to_arrow(dataframe_from_arrow(spark, table))
    assert back.schema == table.schema
    assert back.sort_by("count").to_pylist() == table.sort_by("count").to_pylist()


@pytest.mark.spark
def test_an_empty_table_round_trips(spark: Any) -> None:
    table = pa.table({"user_id": pa.array([], pa.string()), "ts": pa.array([], pa.int64())})
    back = dataframe_to_arrow(dataframe_from_arrow(spark, table))
    assert back.num_rows == 0 and back.schema == table.schema


@pytest.mark.spark
def test_run_stream_counts_exactly_over_spark_file_source(spark: Any, tmp_path: Path) -> None:
    """Structured Streaming through ``foreachBatch`` with Spark's own JSON file source, so
    the streaming runner is exercised on every supported PySpark (the localstate sources
    need 4.2). Two ``availableNow`` runs over files added in between: the second run
    continues from the committed state and the checkpointed file list."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    config = key_count_config(tmp_path / "job", partitions=2)
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    outputs: list[dict[str, int]] = []

    def keep(df: Any, batch_id: int) -> None:
        out = dataframe_to_arrow(df)
        outputs.append(dict(zip(out["key"].to_pylist(), out["count"].to_pylist())))

    expected: Counter[str] = Counter()
    for round_, users in enumerate([["a", "b", "a"], ["b", "c", "a", "a"]]):
        (inbox / f"part-{round_}.json").write_text("".join(json.dumps({"user_id": u}) + "\n" for u in users))
        expected.update(users)
        stream = spark.readStream.schema("user_id string").json(str(inbox))
        query = job.run_stream(stream, checkpoint_location=str(tmp_path / "spark-checkpoint"),
                               trigger={"availableNow": True}, output=keep)
        query.awaitTermination(300)
        assert query.exception() is None
        assert read_counts(config) == dict(expected)
    assert outputs[-1] == {"b": 2, "c": 1, "a": 4}
