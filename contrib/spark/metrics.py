"""State metrics of Spark runs, gathered from the tasks on the executors to the driver.

A task's :class:`~localstate.TaskStorage` lives only while its Spark task runs, so a
Prometheus scrape of an executor would see nothing. Each task therefore adds a
snapshot of its stores' metrics (:func:`task_snapshot`) to a Spark accumulator when
it has committed; the driver reads the sum per micro-batch and keeps it beside the
streaming query's progress, shaped like the ``stateOperators`` entry Spark's own
state stores report in ``StreamingQueryProgress`` (``numRowsTotal``,
``numRowsUpdated``, ``numRowsRemoved``, ``commitTimeMs``, ``customMetrics``)::

    query = job.run_stream(df, checkpoint_location=...)
    ...
    progress = state_progress(job, query)   # query.lastProgress + "localstateStores"

Why not Spark's observed metrics: ``df.observe`` inside ``foreachBatch`` does not reach
the query's progress (measured with PySpark 4.3: ``observedMetrics`` stays empty), and
an observation on the streaming DataFrame runs before the tasks touch their state.
Spark counts accumulator updates of a retried task again: under task retries the
sums over-count (the state itself is exact; see streaming.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from localstate.metrics import COUNTER_FIELDS
from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:
    from localstate import TaskStorage
    from pyspark.sql.streaming import StreamingQuery

    from .runner import StatefulJob

__all__ = ["StateMetricsParam", "task_snapshot", "metrics_delta", "batch_progress", "state_progress"]


class StateMetricsParam(AccumulatorParam):
    """Sums ``{"<store>": {"<metric>": number}}`` snapshots from many tasks."""

    def zero(self, value: Any) -> dict[str, dict[str, float]]:
        return {}

    def addInPlace(self, a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for store, metrics in b.items():
            into = a.setdefault(store, {})
            for name, value in metrics.items():
                into[name] = into.get(name, 0) + value
        return a


def metrics_delta(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``after - before`` per store and metric: one micro-batch's part of the
    accumulator's running sums (gauges such as ``engine_estimated_keys`` are re-reported
    by each task, so they are per batch too). ``metrics_delta(x, {})`` copies ``x``."""
    return {store: {k: v - before.get(store, {}).get(k, 0) for k, v in m.items()} for store, m in after.items()}


def task_snapshot(storage: TaskStorage) -> dict[str, dict[str, float]]:
    """This task's metrics per store: the counters of this open (one task run), the
    commit time, and the engine's gauges (e.g. ``estimated_keys``). Ratios are left
    out (they do not add up across tasks); hits and misses are there instead."""
    out: dict[str, dict[str, float]] = {}
    commit_ms = storage.task_metrics.commit_latency.sum * 1000
    for name in storage.stores:
        m = storage.metrics(name)
        row = {field: float(getattr(m, field)) for field in COUNTER_FIELDS}
        row["commit_time_ms"] = commit_ms
        row["tasks"] = 1.0
        for stat, value in storage.engine(name).stats().items():
            if not stat.endswith("_ratio"):
                row[f"engine_{stat}"] = float(value)
        out[name] = row
    return out


def batch_progress(totals: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """One micro-batch's summed task snapshots, shaped like Spark's ``stateOperators``
    entries (one per store)."""
    out = {}
    for store, m in sorted(totals.items()):
        out[store] = {
            "numRowsTotal": int(m.get("engine_estimated_keys", -1)),
            "numRowsUpdated": int(m.get("puts", 0)),
            "numRowsRemoved": int(m.get("deletes", 0)),
            "commitTimeMs": int(m.get("commit_time_ms", 0)),
            "numTasks": int(m.get("tasks", 0)),
            "customMetrics": {k: v for k, v in sorted(m.items())
                              if k not in ("puts", "deletes", "commit_time_ms", "tasks")},
        }
    return out


def state_progress(job: StatefulJob, query: StreamingQuery) -> dict[str, Any] | None:
    """``query.lastProgress`` with ``"localstateStores"``: the state metrics of the same
    micro-batch (None before the first progress)."""
    progress = query.lastProgress
    if progress is None:
        return None
    out = dict(progress)
    out["localstateStores"] = job.batch_metrics.get(int(progress["batchId"]), {})
    return out
