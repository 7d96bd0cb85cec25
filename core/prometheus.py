"""Export localstate's metrics in the Prometheus text format (the ``metrics`` extra).

Why prometheus-client: it is the Prometheus project's own Python client, small and
dependency-free, and its custom collectors read our counters at scrape time — the
put/get path keeps adding to plain integers and pays nothing for the export
(OpenTelemetry's SDK would need its meters updated on the hot path or observable
callbacks per metric, plus an exporter package; its Prometheus exporter is itself
built on prometheus-client). Every name is in docs/metrics.md.

    from prometheus_client import start_http_server
    from localstate.prometheus import register

    register()               # every TaskStorage open in this process, at each scrape
    start_http_server(9108)  # or generate_latest() for a push gateway / a file

Labels: ``job`` (``job.name``), ``partition`` and, per store, ``store``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from .metrics import LatencyHistogram, StoreMetrics, open_storages

__all__ = ["LocalStateCollector", "SparkJobCollector", "register", "register_spark_job", "STORE_COUNTERS",
           "STORE_HISTOGRAMS"]

STORE_COUNTERS: dict[str, tuple[str, str]] = {
    "gets": ("localstate_store_gets", "Point reads (get, get_all keys, [], in)"),
    "hits": ("localstate_store_cache_hits", "Reads answered by the object cache (or found, without a cache)"),
    "misses": ("localstate_store_cache_misses", "Reads that went below the object cache (or missed, without a cache)"),
    "puts": ("localstate_store_puts", "Writes (put, put_all entries, []=)"),
    "deletes": ("localstate_store_deletes", "Deletes (delete, delete_all keys, del)"),
    "range_scans": ("localstate_store_range_scans", "Iterators opened (range, prefix, all, keys/values/items)"),
    "records_logged": ("localstate_changelog_records_logged", "Change records appended to the changelog"),
    "bytes_logged": ("localstate_changelog_bytes_logged", "Bytes (keys + values) appended to the changelog"),
    "commits": ("localstate_store_commits", "Commits that included the store"),
    "records_restored": ("localstate_restore_records", "Change records replayed by restores"),
    "bytes_restored": ("localstate_restore_bytes", "Changelog bytes replayed by restores"),
    "late_records": ("localstate_window_late_records", "Records dropped by a window store: their window had closed"),
}
"""StoreMetrics field → (metric name without ``_total``, help); one entry per
:data:`~localstate.metrics.COUNTER_FIELDS`."""

STORE_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "flush_latency": ("localstate_store_flush_seconds",
                      "Commit steps 1-2 per store: cache into the engine, changelog made durable"),
    "persist_latency": ("localstate_store_persist_seconds",
                        "Commit step 3 per store: engine flush and local snapshot"),
    "restore_latency": ("localstate_store_restore_seconds", "Restore of the store at open"),
}

_STORE_LABELS = ["job", "partition", "store"]
_TASK_LABELS = ["job", "partition"]


def _histogram(name: str, doc: str, labels: list[str],
               rows: Iterable[tuple[list[str], LatencyHistogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in rows:
        buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in h.cumulative()]
        family.add_metric(values, buckets, h.sum)
    return family


StoreRow = tuple[str, int, str, StoreMetrics, Any]
"""(job, partition, store, metrics, open TaskStorage)."""


class LocalStateCollector(Collector):
    """A collector of every open :class:`~localstate.TaskStorage` (or of ``source()``)."""

    def __init__(self, source: Callable[[], list[Any]] = open_storages) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        storages = [s for s in self._source() if not getattr(s, "_closed", True)]
        rows: list[StoreRow] = []
        for st in storages:
            for name in st.stores:
                rows.append((st.job, st.partition, name, st.metrics(name), st))
        for field, (name, doc) in STORE_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=_STORE_LABELS)
            for job, p, store, m, _ in rows:
                family.add_metric([job, str(p), store], getattr(m, field))
            yield family
        for field, (name, doc) in STORE_HISTOGRAMS.items():
            yield _histogram(name, doc, _STORE_LABELS,
                             (([job, str(p), store], getattr(m, field)) for job, p, store, m, _ in rows))
        yield _histogram("localstate_task_commit_seconds", "The whole commit protocol of a task",
                         _TASK_LABELS, (([st.job, str(st.partition)], st.task_metrics.commit_latency)
                                        for st in storages))
        lag = GaugeMetricFamily("localstate_changelog_uncommitted_records",
                                "Change records written since the store's last commit (changelog end - "
                                "committed offset + records still buffered in the change logger)",
                                labels=_STORE_LABELS)
        engine: dict[str, GaugeMetricFamily] = {}
        for job, p, store, _, st in rows:
            labels = [job, str(p), store]
            changelog = st.changelog(store)
            if changelog is not None:
                committed = st.committed_offset(store) or 0
                lag.add_metric(labels, max(0, changelog.end_offset() - committed) + st.pending_records(store))
            for stat, value in st.engine(store).stats().items():
                family = engine.get(stat)
                if family is None:
                    family = engine[stat] = GaugeMetricFamily(
                        f"localstate_engine_{stat}", f"Engine statistic {stat!r} (docs/metrics.md)",
                        labels=_STORE_LABELS)
                family.add_metric(labels, value)
        yield lag
        yield from engine.values()


def register(registry: CollectorRegistry = REGISTRY) -> LocalStateCollector:
    """Register a :class:`LocalStateCollector` of every open TaskStorage with
    ``registry`` (prometheus-client's default one unless given); returns it."""
    collector = LocalStateCollector()
    registry.register(collector)
    return collector


_SPARK_FIELDS = {"numRowsTotal": "rows_total", "numRowsUpdated": "rows_updated", "numRowsRemoved": "rows_removed",
                 "commitTimeMs": "commit_time_ms", "closeTimeMs": "close_time_ms", "numTasks": "tasks"}


class SparkJobCollector(Collector):
    """The Spark driver's view: the state metrics of a :class:`StatefulJob`'s last
    finished micro-batch (or batch run), summed over its tasks
    (``job.batch_metrics``, :mod:`localstate.contrib.spark.metrics`), as gauges
    ``localstate_spark_batch_<metric>{job, store}`` plus ``localstate_spark_batch_id{job}``.
    The tasks' own TaskStorages live on the executors only while a task runs."""

    def __init__(self, job: Any) -> None:
        self.job = job

    def collect(self) -> Iterator[Metric]:
        metrics: dict[str, dict[str, Any]] = self.job.batch_metrics
        name = self.job.config.job_name
        batch = GaugeMetricFamily("localstate_spark_batch_id", "The batch id (or version) the figures are from",
                                  labels=["job"])
        if not metrics:
            yield batch
            return
        last = max(metrics)
        batch.add_metric([name], last)
        yield batch
        families: dict[str, GaugeMetricFamily] = {}
        for store, progress in sorted(metrics[last].items()):
            values = {_SPARK_FIELDS[k]: v for k, v in progress.items() if k in _SPARK_FIELDS}
            values.update(progress.get("customMetrics", {}))
            for metric, value in values.items():
                family = families.get(metric)
                if family is None:
                    family = families[metric] = GaugeMetricFamily(
                        f"localstate_spark_batch_{metric}", f"{metric} of the last batch, summed over its tasks",
                        labels=["job", "store"])
                family.add_metric([name, store], value)
        yield from families.values()


def register_spark_job(job: Any, registry: CollectorRegistry = REGISTRY) -> SparkJobCollector:
    """Export ``job``'s per-batch state metrics from the driver (see :class:`SparkJobCollector`)."""
    collector = SparkJobCollector(job)
    registry.register(collector)
    return collector
