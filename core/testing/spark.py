"""A shared local Spark session for tests (pytest plugin).

``pytest_plugins = ["localstate.testing.spark"]`` provides:

* ``spark`` — session-scoped :class:`pyspark.sql.SparkSession` on ``local[2]``
  (starting one costs 6–10 s, so every test of a pytest run shares it), built by
  :func:`localstate.contrib.spark.spark_session` (127.0.0.1, UTC, Arrow, no UI), with
  Spark's Kafka connector on its classpath (``format("kafka")``);
* ``spark_master`` — the master URL it runs on (``LOCALSTATE_SPARK_MASTER`` overrides
  ``local[2]``).

Tests that need Spark should also carry ``@pytest.mark.spark``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["spark", "spark_master", "KeyCount", "key_count_task", "key_count_config", "read_counts", "batch_stages"]


@pytest.fixture(scope="session")
def spark_master() -> str:
    return os.environ.get("LOCALSTATE_SPARK_MASTER", "local[2]")


@pytest.fixture(scope="session")
def spark(spark_master: str) -> Iterator[Any]:
    from localstate.contrib.spark import spark_session

    session = spark_session(spark_master, app_name="localstate-tests",
                            **{"spark.sql.shuffle.partitions": "4", **_kafka_connector()})
    try:
        yield session
    finally:
        session.stop()


def _kafka_connector() -> dict[str, str]:
    """``spark.jars`` of Spark's Kafka connector (:mod:`localstate.testing.kafka_connector`),
    fetched on first use when Maven is installed; local jars add next to nothing to the
    session's start. Without Maven, or when the fetch fails: none, with a warning (the
    connector's tests then fail naming the fix; every other test runs)."""
    import shutil
    import warnings

    from localstate.testing.kafka_connector import kafka_connector_conf

    try:
        return kafka_connector_conf(fetch=shutil.which("mvn") is not None)
    except RuntimeError as e:
        warnings.warn(f"the test session has no Kafka connector: {e}", stacklevel=2)
        return {}


class KeyCount:
    """Reference tasks for Spark tests: events per key in store ``counts`` (string → long).

    :func:`key_count_task` returns the vectorised (``per_record=False``) or per-record
    StreamTask class; both emit nothing while counting and, at ``window``, the keys
    whose count changed in this run as rows ``key string, count long`` (so the union
    of a run's output and earlier state is the full count).
    """

    STORES = {"counts": {"key.serde": "string", "msg.serde": "long", "object.cache.size": 20_000,
                        "write.batch.size": 10_000}}
    OUTPUT_SCHEMA = "key string, count long"


def key_count_task(key: str = "user_id", *, per_record: bool = False) -> type:
    """A StreamTask class counting rows per ``key`` column (see :class:`KeyCount`)."""
    import pyarrow as pa
    from localstate.contrib.spark import StreamTask

    class _Count(StreamTask):
        PENDING_ROWS = 2_000_000
        """Rows held in Arrow before their counts go to the store (bounds task memory)."""

        def init(self, context: Any) -> None:
            self.counts = context.store("counts")
            self.changed: dict[str, int] = {}
            self.pending: list[pa.Array] = []
            self.pending_rows = 0

        def process_batch(self, batch: pa.RecordBatch, emit: Any) -> None:
            if per_record:
                super().process_batch(batch, emit)
                return
            if batch.num_rows == 0:
                return
            self.pending.append(batch.column(key))
            self.pending_rows += batch.num_rows
            if self.pending_rows >= self.PENDING_ROWS:
                self.apply_pending()

        def apply_pending(self) -> None:
            """Count the pending keys in Arrow, then one ``get_all`` and one ``put_all`` of
            the distinct keys: per-key Python work once per key per run, not per batch."""
            if not self.pending:
                return
            grouped = (
                pa.table({"k": pa.chunked_array(self.pending)})
                .group_by("k", use_threads=False)
                .aggregate([("k", "count")])
            )
            self.pending = []
            self.pending_rows = 0
            keys = grouped.column("k").to_pylist()
            adds = grouped.column("k_count").to_pylist()
            old = self.counts.get_all(keys)
            # a dict, not pairs: put_all then takes keys and values as they are (no tuple per key)
            new = dict(zip(keys, [old.get(k, 0) + n for k, n in zip(keys, adds)] if old else adds))
            self.counts.put_all(new)
            self.changed.update(new)

        def process(self, record: dict[str, Any], emit: Any) -> None:
            k = record[key]
            n = (self.counts.get(k) or 0) + 1
            self.counts[k] = n
            self.changed[k] = n

        def window(self, emit: Any) -> None:
            self.apply_pending()
            emit.arrow(pa.RecordBatch.from_pydict(
                {"key": list(self.changed), "count": list(self.changed.values())},
                schema=pa.schema([("key", pa.string()), ("count", pa.int64())]),
            ))
            self.changed = {}

    _Count.__name__ = _Count.__qualname__ = "KeyCountPerRecord" if per_record else "KeyCountArrow"
    return _Count


def key_count_config(root: Any, *, partitions: int = 4, engine: str = "memory", name: str = "keycount") -> Any:
    """Config of the :class:`KeyCount` job with state and file changelog under ``root``."""
    from pathlib import Path

    from localstate import Config

    root = Path(root)
    values: dict[str, Any] = {
        "job.name": name,
        "job.partitions": partitions,
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.counts.factory": engine,
        "stores.counts.changelog": f"file.{name}-counts",
    }
    for k, v in KeyCount.STORES["counts"].items():
        values[f"stores.counts.{k}"] = v
    return Config.from_dict(values)


def read_counts(config: Any) -> dict[str, int]:
    """Every partition's committed ``counts`` store, merged (opens each TaskStorage)."""
    from localstate import TaskStorage

    out: dict[str, int] = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage, storage.store("counts").all() as items:
            out.update(items)
    return out


_BATCH_ID = re.compile(r"batch = (\d+)")


def batch_stages(spark: Any, run_id: str) -> dict[int, list[dict[str, float]]]:
    """Per micro-batch id of the query run ``run_id``: its completed Spark stages from the
    driver's status store — ``wall`` (first task launch to completion, s), ``task_s``
    (summed executor run time), ``input_rows`` (rows read from files), ``shuffle_read``
    and ``shuffle_write`` (rows). Jobs are matched by the description Structured
    Streaming gives every job of a micro-batch (``runId = …``, ``batch = N``)."""
    store = spark.sparkContext._jsc.sc().statusStore()  # noqa: SLF001 - the status store is JVM-only
    out: dict[int, list[dict[str, float]]] = {}
    jobs = store.jobsList(None).iterator()
    while jobs.hasNext():
        job = jobs.next()
        description = job.description()
        text = description.get() if description.isDefined() else ""
        match = _BATCH_ID.search(text)
        if run_id not in text or match is None:
            continue
        batch = int(match.group(1))
        stage_ids = job.stageIds().iterator()
        while stage_ids.hasNext():
            try:
                stage = store.lastStageAttempt(stage_ids.next())
            except Exception:  # a stage skipped (its shuffle output reused) has no attempt  # noqa: S112
                continue
            launched, completed = stage.firstTaskLaunchedTime(), stage.completionTime()
            if not (launched.isDefined() and completed.isDefined()):
                continue
            out.setdefault(batch, []).append({
                "wall": (completed.get().getTime() - launched.get().getTime()) / 1000,
                "task_s": stage.executorRunTime() / 1000,
                "input_rows": stage.inputRecords(),
                "shuffle_read": stage.shuffleReadRecords(),
                "shuffle_write": stage.shuffleWriteRecords(),
            })
    return out
