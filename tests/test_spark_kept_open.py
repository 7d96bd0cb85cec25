"""Spark Python workers keep a task's storage open between micro-batches
(:mod:`localstate.kept_open`, ``StatefulJob(keep_open_s=...)``): a micro-batch a worker
ran the task's previous one in uses the open storage as it is; counts stay exact; the
driver (another process) opens any task right after the query while the workers still
hold them parked; a re-run of a committed batch rolls back as before; ``keep_open_s=0``
opens every run afresh."""

from __future__ import annotations

import gc
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate import ConfigError, TaskStorage
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.compat import dataframe_to_arrow
from localstate.contrib.spark.streaming import committed_batches
from localstate.testing.spark import KeyCount, key_count_config, key_count_task, read_counts

PARTITIONS = 4


def _recording_task(log_dir: str) -> type:
    """KeyCount that writes, per run, its worker's pid and its storage's epoch (one per open)."""
    base = key_count_task()

    class Recorded(base):  # type: ignore[misc, valid-type]
        def init(self, context: Any) -> None:
            super().init(context)
            from pyspark import TaskContext as SparkTaskContext

            batch = SparkTaskContext.get().getLocalProperty("streaming.sql.batchId")
            record = {"batch": batch, "task": context.partition, "pid": os.getpid(), "epoch": context.storage.epoch,
                      "frozen": gc.get_freeze_count()}
            Path(log_dir, f"{batch}-{context.partition}.json").write_text(json.dumps(record))

    return Recorded


def _stream(spark: Any, src: Path, batches: list[list[str]]) -> Any:
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    src.mkdir()
    for n, users in enumerate(batches):
        (src / f"{n:03d}.jsonl").write_text("".join(f'{{"user_id": "{u}"}}\n' for u in users))
    return (spark.readStream.format("localstate-jsonl").schema("user_id string").option("maxFilesPerTrigger", 1)
            .load(str(src)))


def _run(spark: Any, tmp_path: Path, keep_open_s: float,
         kafka: str | None = None) -> tuple[StatefulJob, list[dict[str, Any]], Counter]:
    log_dir = tmp_path / "runs"
    log_dir.mkdir()
    config = key_count_config(tmp_path / "job", partitions=PARTITIONS, name="kept")
    if kafka is not None:  # the changelog and the checkpoints in Kafka
        topic = f"kept-{tmp_path.name}"
        config = config.with_overrides({"systems.kafka.bootstrap.servers": kafka,
                                         "systems.kafka.checkpoint.topic": f"{topic}-checkpoints",
                                         "stores.counts.changelog": f"kafka.{topic}-counts"})
    job = StatefulJob(config, _recording_task(str(log_dir)), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                      keep_open_s=keep_open_s)
    batches = [[f"u{(i * 7 + b) % 23}" for i in range(40)] for b in range(8)]
    outputs: dict[int, dict[str, int]] = {}

    def output(df: Any, batch_id: int) -> None:
        outputs[batch_id] = {r["key"]: r["count"] for r in dataframe_to_arrow(df).to_pylist()}

    query = job.run_stream(_stream(spark, tmp_path / "in", batches), checkpoint_location=str(tmp_path / "ckpt"),
                           trigger={"availableNow": True}, output=output)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    running: Counter = Counter()
    for b, users in enumerate(batches):  # every micro-batch's output: its keys' running totals
        running += Counter(users)
        assert outputs[b] == {u: running[u] for u in set(users)}
    runs = [json.loads(p.read_text()) for p in log_dir.glob("*.json")]
    return job, runs, running


def _reuses(runs: list[dict[str, Any]]) -> int:
    """Runs that got the open storage of the task's previous run (the same epoch: no open between)."""
    by_task: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: int(r["batch"])):
        by_task.setdefault(r["task"], []).append(r)
    return sum(1 for seq in by_task.values() for a, b in zip(seq, seq[1:])
               if (a["pid"], a["epoch"]) == (b["pid"], b["epoch"]))


@pytest.mark.spark
def test_a_worker_reuses_its_tasks_open_storage_and_the_counts_stay_exact(spark: Any, tmp_path: Path) -> None:
    job, runs, total = _run(spark, tmp_path, keep_open_s=60.0)
    assert len(runs) == 8 * PARTITIONS
    # Which worker gets which task is Spark's pick (about half the time the same one):
    # over 28 task-to-next-batch steps at least one reuse is all but certain.
    assert _reuses(runs) >= 1, runs
    # A worker that ran a second Spark task froze what it holds (the modules of PySpark,
    # pyarrow and localstate, its parked storages) out of the collection PySpark's daemon
    # runs after every task (task_run.freeze_worker_heap).
    assert max(r["frozen"] for r in runs) > 10_000, runs
    # The workers still hold the tasks parked; the driver opens them at once regardless.
    start = time.monotonic()
    assert read_counts(job.config) == total
    for p in range(PARTITIONS):
        with TaskStorage(job.config, p) as s:
            assert s.checkpoint.version == 7
    assert time.monotonic() - start < 30
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 7)


@pytest.mark.spark
@pytest.mark.kafka
def test_a_kafka_changelog_task_is_kept_open_too_and_the_counts_stay_exact(spark: Any, apache_kafka_broker: str,
                                                                          tmp_path: Path) -> None:
    """On the Kafka changelog a kept task renews its producer (fencing whoever opened the
    task meanwhile) and re-reads only the checkpoints written since before it is used.
    On Apache Kafka: tansu 0.6.0 can leave one of the tasks' overlapping transactions on
    the shared checkpoint partition unresolved (docs/changelogs.md, Kafka)."""
    job, runs, total = _run(spark, tmp_path, keep_open_s=60.0, kafka=apache_kafka_broker)
    assert len(runs) == 8 * PARTITIONS
    assert _reuses(runs) >= 1, runs
    assert read_counts(job.config) == total  # the driver fences the parked producers: still exact
    assert committed_batches(job.config) == dict.fromkeys(range(PARTITIONS), 7)


@pytest.mark.spark
def test_a_rerun_of_a_committed_batch_rolls_back_a_kept_open_task(spark: Any, tmp_path: Path) -> None:
    """A parked storage that already committed the batch Spark runs again is not used as
    it is: the task rolls back and applies the batch once (as without keep-open)."""
    config = key_count_config(tmp_path, partitions=2, name="kept-rerun")
    job = StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                      keep_open_s=60.0)

    def run(users: list[str], batch_id: int) -> dict[str, int]:
        df = spark.createDataFrame([(u,) for u in users], "user_id string")
        return {r["key"]: r["count"] for r in dataframe_to_arrow(job.transform(df, batch_id=batch_id)).to_pylist()}

    b0, b1 = ["a", "b", "a"], ["a", "c"]
    run(b0, 0)
    first = run(b1, 1)
    assert run(b1, 1) == first == {"a": 3, "c": 1}  # the same batch again: applied once
    assert run(["b"], 2) == {"b": 2}
    assert read_counts(config) == Counter(b0) + Counter(b1) + Counter(["b"])


@pytest.mark.spark
def test_keep_open_zero_opens_every_run_afresh(spark: Any, tmp_path: Path) -> None:
    _, runs, _ = _run(spark, tmp_path, keep_open_s=0)
    assert _reuses(runs) == 0


def test_a_bad_keep_open_is_refused(tmp_path: Path) -> None:
    config = key_count_config(tmp_path, partitions=2, name="kept-bad")
    for bad in (-1, "30", True, float("nan")):
        with pytest.raises(ConfigError, match="keep_open_s must be a number of seconds >= 0"):
            StatefulJob(config, key_count_task(), key="user_id", output_schema=KeyCount.OUTPUT_SCHEMA,
                        keep_open_s=bad)  # type: ignore[arg-type]
