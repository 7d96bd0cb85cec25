"""Malformed JSON input: mode = FAILFAST / PERMISSIVE / DROPMALFORMED, and per-trigger limits.

The record-level policy (localstate.contrib.spark.json_policy) is tested directly, then
through a real local Spark session reading ``localstate-jsonl`` files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from localstate import ConfigError
from localstate.contrib.spark.json_policy import JsonPolicy, MalformedRecordError, read_json_records

SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string())])
WITH_CORRUPT = SCHEMA.append(pa.field("_corrupt_record", pa.string()))
LINES = b'{"n": 1, "s": "a"}\n{"n": oops}\n\n[1, 2]\n{"n": "not a number"}\n{"n": 3}\n'


def read(data: Any, mode: str, schema: pa.Schema = WITH_CORRUPT) -> list[dict[str, Any]]:
    return read_json_records(data, schema, JsonPolicy(mode), lambda i: f"in.jsonl:{i + 1}", "test").to_pylist()


def test_permissive_keeps_bad_records_as_null_rows_with_their_text():
    rows = read(LINES, "PERMISSIVE")
    assert [r["n"] for r in rows] == [1, None, None, None, 3]
    assert [r["_corrupt_record"] for r in rows] == [None, '{"n": oops}', "[1, 2]", '{"n": "not a number"}', None]
    # without the corrupt-record column in the schema: null rows (Spark's behaviour too)
    assert read(LINES, "PERMISSIVE", SCHEMA) == [{"n": 1, "s": "a"}] + [{"n": None, "s": None}] * 3 + [
        {"n": 3, "s": None}]


def test_dropmalformed_skips_bad_records():
    assert read(LINES, "DROPMALFORMED", SCHEMA) == [{"n": 1, "s": "a"}, {"n": 3, "s": None}]


def test_failfast_error_is_short_and_names_file_and_line():
    with pytest.raises(MalformedRecordError) as e:
        read(LINES, "FAILFAST")
    message = str(e.value)
    assert "in.jsonl:2" in message and "oops" in message and "DROPMALFORMED" in message
    assert "\n" not in message and len(message) < 400


def test_kafka_values_use_the_same_policy_and_name_the_offset():
    values = [b'{"n": 1}', b"garbage", b'{"n": 2}']
    with pytest.raises(MalformedRecordError, match="offset 11"):
        read_json_records(values, SCHEMA, JsonPolicy("FAILFAST"), lambda i: f"offset {10 + i}", "localstate-kafka")
    table = read_json_records(values, SCHEMA, JsonPolicy("DROPMALFORMED"), str, "localstate-kafka")
    assert table.column("n").to_pylist() == [1, 2]


def test_bad_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="use one of PERMISSIVE, DROPMALFORMED, FAILFAST"):
        JsonPolicy.from_options({"mode": "lenient"}, "localstate-jsonl")
    assert JsonPolicy.from_options({"mode": "dropMalformed"}, "x").mode == "DROPMALFORMED"


def test_a_bad_record_deep_in_a_large_chunk_is_found_without_parsing_each_line():
    data = b"".join(b'{"n": %d}\n' % i for i in range(50_000)) + b"{bad\n" + b'{"n": 0}\n' * 10
    with pytest.raises(MalformedRecordError, match="in.jsonl:50001"):
        read(data, "FAILFAST")
    assert len(read(data, "DROPMALFORMED")) == 50_010


# -- through Spark ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sources(spark: Any) -> Any:
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    return spark


@pytest.mark.spark
def test_jsonl_modes_in_spark(sources: Any, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_bytes(LINES)
    reader = sources.read.format("localstate-jsonl")
    rows = reader.schema("n long, s string, _corrupt_record string").option("mode", "PERMISSIVE").load(str(d))
    assert sorted(str(r["_corrupt_record"]) for r in rows.collect())[:3] == ['None', 'None', '[1, 2]']
    dropped = reader.schema("n long, s string").option("mode", "DROPMALFORMED").load(str(d)).collect()
    assert sorted(r["n"] for r in dropped) == [1, 3]
    with pytest.raises(Exception) as e:
        reader.schema("n long, s string").option("mode", "FAILFAST").load(str(d)).collect()
    assert "a.jsonl:2" in str(e.value)


@pytest.mark.spark
def test_jsonl_max_files_and_bytes_per_trigger(sources: Any, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    for i in range(3):
        (d / f"f{i}.jsonl").write_text("".join(json.dumps({"n": i * 10 + j}) + "\n" for j in range(10)))

    def drain(**options: str) -> list[list[int]]:
        batches: dict[int, list[int]] = {}
        stream = sources.readStream.format("localstate-jsonl").schema("n long")
        for k, v in options.items():
            stream = stream.option(k, v)
        query = stream.load(str(d)).writeStream.option("checkpointLocation", str(tmp_path / str(options))) \
            .foreachBatch(lambda df, b: batches.__setitem__(b, sorted(r["n"] for r in df.collect()))) \
            .trigger(availableNow=True).start()
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        return [batches[b] for b in sorted(batches) if batches[b]]

    by_file = drain(maxFilesPerTrigger="1")
    assert by_file == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    line = len(json.dumps({"n": 0}) + "\n")  # 9 bytes
    by_bytes = drain(maxBytesPerTrigger=str(line * 4))
    assert sum(by_bytes, []) == list(range(30)) and all(len(b) <= 5 for b in by_bytes)
    with pytest.raises(Exception, match="maxBytesPerTrigger"):
        drain(maxBytesPerTrigger="lots")


@pytest.mark.parametrize(("option", "value", "fragment"), [
    ("maxFilesPerTrigger", "0", "must be >= 1"),
    ("maxFilesPerTrigger", "many", "is not an integer"),
    ("maxBytesPerTrigger", "0", "must be >= 1"),
    ("maxBytesPerTrigger", "12 parsecs", "unknown unit"),
    ("mode", "strict", "use one of"),
])
def test_bad_jsonl_options_are_config_errors(tmp_path: Path, option: str, value: str, fragment: str) -> None:
    from localstate.contrib.spark.sources.jsonl import _JsonLinesReader
    from pyspark.sql.types import LongType, StructField, StructType

    with pytest.raises(ConfigError, match=fragment):
        _JsonLinesReader(tmp_path, StructType([StructField("n", LongType())]), {option: value})
