"""Metrics leave the process: Prometheus text format over live TaskStorages."""

from __future__ import annotations

from pathlib import Path

import pytest
from localstate import Config, TaskStorage
from localstate.metrics import LATENCY_BUCKETS, LatencyHistogram

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def _config(tmp_path: Path) -> Config:
    return Config.from_dict({
        "job.name": "m",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.counts.factory": "rocksdb",
        "stores.counts.changelog": "file.m-counts",
        "stores.counts.key.serde": "string",
        "stores.counts.msg.serde": "long",
        "stores.counts.object.cache.size": "0",
        "stores.counts.rocksdb.statistics": "true",
        "stores.cached.factory": "memory",
        "stores.cached.changelog": "file.m-cached",
        "stores.cached.write.batch.size": "1000",
    })


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_every_counter_has_a_prometheus_name() -> None:
    from localstate.metrics import COUNTER_FIELDS
    from localstate.prometheus import STORE_COUNTERS

    assert tuple(STORE_COUNTERS) == COUNTER_FIELDS


def test_histogram_buckets() -> None:
    h = LatencyHistogram()
    for s in (0.0001, 0.0005, 0.003, 100.0):
        h.observe(s)
    cum = dict(h.cumulative())
    assert cum[0.0005] == 2 and cum[0.005] == 3 and cum[LATENCY_BUCKETS[-1]] == 3 and cum[float("inf")] == 4
    assert h.count == 4 and h.sum == pytest.approx(100.0036)


def test_prometheus_text_has_every_store_metric(tmp_path: Path) -> None:
    from localstate.prometheus import register

    registry = CollectorRegistry()
    register(registry)
    config = _config(tmp_path)
    with TaskStorage(config, 0) as storage:
        counts = storage.store("counts", str, int)
        for i in range(50):
            counts[f"k{i}"] = i
        assert counts.get("k1") == 1 and counts.get("nope") is None
        storage.store("cached")[b"a"] = b"1"
        storage.commit()
        assert counts.get("k2") == 2  # after the commit's flush: read through the block cache
        counts["k1"] = 100  # one uncommitted record in the change logger's buffer
        storage.store("cached")[b"b"] = b"2"
        samples = _scrape(registry)
        labels = (("job", "m"), ("partition", "0"), ("store", "counts"))
        assert samples[("localstate_store_puts_total", labels)] == 51
        assert samples[("localstate_store_gets_total", labels)] == 3
        assert samples[("localstate_store_cache_hits_total", labels)] == 2
        assert samples[("localstate_store_cache_misses_total", labels)] == 1
        assert samples[("localstate_changelog_records_logged_total", labels)] == 50
        assert samples[("localstate_store_commits_total", labels)] == 1
        assert samples[("localstate_changelog_uncommitted_records", labels)] == 1
        assert samples[("localstate_store_flush_seconds_count", labels)] == 1
        assert samples[("localstate_store_persist_seconds_count", labels)] == 1
        assert samples[("localstate_store_restore_seconds_count", labels)] == 1
        assert samples[("localstate_store_flush_seconds_bucket", (labels[0], ("le", "+Inf"), *labels[1:]))] == 1
        assert samples[("localstate_changelog_bytes_logged_total", labels)] == sum(
            len(f"k{i}") + 8 for i in range(50))
        assert samples[("localstate_task_commit_seconds_count", labels[:2])] == 1
        assert samples[("localstate_engine_estimated_keys", labels)] >= 50
        hits = samples[("localstate_engine_block_cache_hits", labels)]
        misses = samples[("localstate_engine_block_cache_misses", labels)]
        assert hits + misses >= 1
        assert samples[("localstate_engine_block_cache_hit_ratio", labels)] == pytest.approx(hits / (hits + misses))
        cached = (("job", "m"), ("partition", "0"), ("store", "cached"))
        assert samples[("localstate_engine_estimated_keys", cached)] == 1  # memory: exact
    # a closed TaskStorage is no longer reported
    assert not any(name == "localstate_store_puts_total" for name, _ in _scrape(registry))


def test_spark_job_batch_metrics_on_the_driver(tmp_path: Path) -> None:
    """The driver-side collector over job.batch_metrics (filled as run/run_stream do;
    the Spark side is tested in tests/test_spark_state.py)."""
    pytest.importorskip("pyspark")
    from localstate.contrib.spark import StatefulJob, StreamTask
    from localstate.contrib.spark.metrics import batch_progress
    from localstate.prometheus import register_spark_job

    job = StatefulJob(_config(tmp_path), StreamTask, key="k", output_schema="k string")
    registry = CollectorRegistry()
    register_spark_job(job, registry)
    assert not any(name.startswith("localstate_spark_batch_puts") for name, _ in _scrape(registry))
    job.batch_metrics[3] = batch_progress({"counts": {"puts": 5.0, "deletes": 1.0, "tasks": 2.0,
                                                      "engine_estimated_keys": 4.0, "records_logged": 6.0,
                                                      "close_time_ms": 7.5}})
    samples = _scrape(registry)
    labels = (("job", "m"), ("store", "counts"))
    assert samples[("localstate_spark_batch_id", (("job", "m"),))] == 3
    assert samples[("localstate_spark_batch_rows_updated", labels)] == 5
    assert samples[("localstate_spark_batch_rows_removed", labels)] == 1
    assert samples[("localstate_spark_batch_rows_total", labels)] == 4
    assert samples[("localstate_spark_batch_records_logged", labels)] == 6
    assert samples[("localstate_spark_batch_close_time_ms", labels)] == 7
