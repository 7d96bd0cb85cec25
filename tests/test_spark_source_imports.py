"""What Spark's streaming-source runner imports with ``localstate-kafka``.

Every streaming query with a Python data source starts a fresh interpreter
(``pyspark.sql.streaming.python_streaming_source_runner``) that unpickles the source, so
whatever the source module imports is paid at every query start. These tests import it
the way that runner does — in a fresh interpreter, after pyspark's own runner — and check
``sys.modules``: the Kafka client is there (the driver-side reader needs it for offsets),
the job runner, the storage, the engines' registry, the layers and the other sources are
not. They also check that the names made lazy still import from their public paths.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("confluent_kafka")

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"

NOT_FOR_THE_SOURCE = [
    "localstate.storage",  # a task's stores: executors only
    "localstate.store_open",
    "localstate.config",
    "localstate.registry",  # scans the installed plug-ins' entry points when imported
    "localstate.layers",
    "localstate.reader",
    "localstate.serdes",
    "localstate.contrib.spark.runner",
    "localstate.contrib.spark.streaming",
    "localstate.contrib.spark.metrics",
    "localstate.contrib.spark.task",
    "localstate.contrib.spark.sources.jsonl",
    "localstate.contrib.spark.sources.changelog",
    "localstate.contrib.spark.state_source",
    "pyarrow.compute",  # the runner's; pyspark's source runner does not import it
]


def _fresh_import(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints a JSON value as its last line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_source_runner_imports_the_kafka_source_without_the_job_machinery() -> None:
    code = f"""
import json, sys
import {RUNNER}
before = set(sys.modules)
from localstate.contrib.spark.sources.kafka import KafkaSource
added = sorted(set(sys.modules) - before)
print(json.dumps({{"added": added, "name": KafkaSource.name()}}))
"""
    out = _fresh_import(code)
    added = set(out["added"])  # type: ignore[arg-type]
    assert out["name"] == "localstate-kafka"
    assert "localstate.changelog.kafka.client" in added and "confluent_kafka" in added
    assert sorted(added & set(NOT_FOR_THE_SOURCE)) == []


def test_reading_options_and_building_a_stream_reader_stays_light() -> None:
    """The runner's first call, ``streamReader``: options parsed, the Kafka client built
    (no broker needed until an offset is asked for)."""
    code = f"""
import json, sys
import {RUNNER}
from pyspark.sql.types import LongType, StringType, StructField, StructType
from localstate.contrib.spark.sources.kafka import KafkaSource
source = KafkaSource({{"bootstrap.servers": "127.0.0.1:1", "topic": "t", "format": "json",
                      "maxOffsetsPerTrigger": "10", "minPartitions": "2"}})
reader = source.streamReader(StructType([StructField("ts", LongType()), StructField("user_id", StringType())]))
print(json.dumps({{"max_rows": reader.max_rows, "modules": sorted(sys.modules)}}))
"""
    out = _fresh_import(code)
    assert out["max_rows"] == 10
    assert sorted(set(out["modules"]) & set(NOT_FOR_THE_SOURCE)) == []  # type: ignore[arg-type]


def test_the_lazy_names_import_from_their_public_paths() -> None:
    import localstate
    import localstate.contrib.spark as spark_pkg
    import localstate.contrib.spark.sources as sources_pkg

    for module in (localstate, spark_pkg, sources_pkg):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
            assert name in dir(module)
        with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
            module.NoSuchName  # noqa: B018 - the attribute access is the test
    from localstate import Config, TaskStorage
    from localstate.config import Config as config_config
    from localstate.contrib.spark import StatefulJob
    from localstate.contrib.spark.runner import StatefulJob as runner_job
    from localstate.contrib.spark.sources import CHANGELOG_SCHEMA, KAFKA_SCHEMA, KafkaSource
    from localstate.contrib.spark.sources.kafka import KafkaSource as kafka_source
    from localstate.storage import TaskStorage as storage_task

    assert Config is config_config and TaskStorage is storage_task and StatefulJob is runner_job
    assert KafkaSource is kafka_source and "binary" in KAFKA_SCHEMA and "offset" in CHANGELOG_SCHEMA


def test_an_unknown_option_of_a_localstate_settings_class_still_says_did_you_mean() -> None:
    """options.py imports the registry's ``did_you_mean`` only on its error paths."""
    code = """
import json, sys
from localstate.options import parse_options
from localstate.changelog.kafka.client import KafkaSettings
from localstate.errors import ConfigError
before = "localstate.registry" in sys.modules
try:
    parse_options(KafkaSettings, {"bootstrap.servers": "x", "timeout.mss": 5}, "systems.kafka")
    message = None
except ConfigError as e:
    message = str(e)
print(json.dumps({"before": before, "message": message}))
"""
    out = _fresh_import(code)
    assert out["before"] is False
    assert "timeout.mss" in str(out["message"]) and "Did you mean 'timeout.ms'" in str(out["message"])
