"""Exactly-once file output (:class:`~localstate.contrib.spark.sinks.FileSink`) on a real
Spark session: batches published as whole ``batch_id=N`` directories, a re-run batch
skipped, readers that never see a batch being written, bad settings refused before
anything is written, and a batch run whose output the driver never delivered."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from localstate import ConfigError, LocalStateError
from localstate.contrib.spark.sinks import TEMP_PREFIX, FileSink, check_delivered, published_batches
from localstate.testing.spark import KeyCount, key_count_config, key_count_task

pytestmark = pytest.mark.spark


def _rows(spark: Any, path: Path) -> list[tuple[str, int, int]]:
    """(key, count, batch_id) of every row the sink published, as Spark reads the path."""
    df = spark.read.json(str(path))
    return sorted((r["key"], r["count"], r["batch_id"]) for r in df.collect())


def test_batches_are_published_whole_and_a_rerun_is_skipped(spark: Any, tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out", format="json")
    assert sink.write(spark.createDataFrame([("a", 1), ("b", 2)], KeyCount.OUTPUT_SCHEMA), 0)
    assert sink.write(spark.createDataFrame([("a", 3)], KeyCount.OUTPUT_SCHEMA), 1)
    # Spark runs the last micro-batch again after a driver crash: already published, skipped
    assert not sink.write(spark.createDataFrame([("a", 99)], KeyCount.OUTPUT_SCHEMA), 1)
    assert sink.published() == published_batches(tmp_path / "out") == [0, 1]
    assert sink.delivered() == 1
    assert _rows(spark, tmp_path / "out") == [("a", 1, 0), ("a", 3, 1), ("b", 2, 0)]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_an_older_batch_than_the_published_ones_is_refused(spark: Any, tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out", format="json")
    sink.write(spark.createDataFrame([("a", 1)], KeyCount.OUTPUT_SCHEMA), 5)
    with pytest.raises(LocalStateError, match=r"batch 3 comes after batch 5 was delivered.*new path"):
        sink.write(spark.createDataFrame([("a", 1)], KeyCount.OUTPUT_SCHEMA), 3)
    assert sink.published() == [5]


def test_readers_skip_a_batch_being_written_and_a_new_sink_removes_it(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    FileSink(out).write(spark.createDataFrame([("a", 1)], KeyCount.OUTPUT_SCHEMA), 0)
    # what a writer killed between writing and publishing batch 1 leaves behind
    torn = out / f"{TEMP_PREFIX}1-0123abcd"
    torn.mkdir()
    (torn / "part-00000.parquet").write_bytes(b"PAR1 torn")
    assert published_batches(out) == [0]
    got = sorted((r["key"], r["count"], r["batch_id"]) for r in spark.read.parquet(str(out)).collect())
    assert got == [("a", 1, 0)]
    import pyarrow.dataset as ds

    assert ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist() == [
        {"key": "a", "count": 1, "batch_id": 0}]
    FileSink(out)
    assert not torn.exists()


def test_stream_output_to_a_file_sink(spark: Any, tmp_path: Path) -> None:
    from localstate.contrib.spark import StatefulJob

    inp = tmp_path / "in"
    inp.mkdir()
    for i, keys in enumerate([["a", "b", "a"], ["b", "c"]]):
        (inp / f"part-{i}.json").write_text("".join(json.dumps({"user_id": k}) + "\n" for k in keys))
        os.utime(inp / f"part-{i}.json", (1_000 + i, 1_000 + i))
    job = StatefulJob(key_count_config(tmp_path / "job", partitions=2), key_count_task("user_id"), key="user_id",
                      output_schema=KeyCount.OUTPUT_SCHEMA)
    sink = FileSink(tmp_path / "out", format="parquet")
    stream = spark.readStream.schema("user_id string").option("maxFilesPerTrigger", 1).json(str(inp))
    query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True},
                           output=sink)
    query.awaitTermination()
    assert sink.published() == [0, 1]
    got = sorted((r["key"], r["count"], r["batch_id"]) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == [("a", 2, 0), ("b", 1, 0), ("b", 2, 1), ("c", 1, 1)]


def test_batch_run_output_and_a_delivery_the_driver_never_made(spark: Any, tmp_path: Path) -> None:
    from localstate.contrib.spark import StatefulJob

    config = key_count_config(tmp_path / "job", partitions=2)
    job = StatefulJob(config, key_count_task("user_id"), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA)
    sink = FileSink(tmp_path / "out", format="json")
    first = spark.createDataFrame([("a",), ("b",)], "user_id string")
    second = spark.createDataFrame([("a",)], "user_id string")
    job.run(first, output=sink)
    assert sink.published() == [0]
    # the driver dies after the tasks committed version 1, before the sink published it
    job.run(second)
    with pytest.raises(LocalStateError, match=r"committed version 1 but FileSink.* delivered only up to version 0.*"
                                              r"job.run\(df, version=1, output=sink\)"):
        job.run(second, output=sink)
    assert sink.published() == [0]
    job.run(second, version=1, output=sink)
    assert _rows(spark, tmp_path / "out") == [("a", 1, 0), ("a", 2, 1), ("b", 1, 0)]
    check_delivered(config, sink)


def test_bad_paths_and_formats_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"format 'parket' is not one of parquet, json, csv, orc.*parquet"):
        FileSink(tmp_path / "out", format="parket")
    assert not (tmp_path / "out").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"afile' is a file, not a directory"):
        FileSink(tmp_path / "afile")
    with pytest.raises(ConfigError, match=r"cannot be created"):
        FileSink(tmp_path / "afile" / "below")
    with pytest.raises(ConfigError, match=r"only local \(POSIX\) paths.*atomic rename"):
        FileSink("s3a://bucket/out")
    with pytest.raises(ConfigError, match=r"batch_id must be an int >= 0"):
        FileSink(tmp_path / "ok").write(None, -1)  # type: ignore[arg-type]
    assert list((tmp_path / "ok").iterdir()) == []
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        # root may write any directory: a directory of a read-only file system then
        unwritable = locked if not os.access(locked, os.W_OK) else Path("/proc/sys")
        if os.access(unwritable, os.W_OK):
            pytest.skip("no unwritable directory for this user")
        with pytest.raises(ConfigError, match=rf"{unwritable.name}' is not writable"):
            FileSink(unwritable)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)
