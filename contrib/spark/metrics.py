"""State metrics of Spark runs: in the streaming query's progress, and on the driver.

A task's :class:`~localstate.TaskStorage` lives only while its Spark task runs, so a
Prometheus scrape of an executor would see nothing. The metrics leave the task two ways:

* **in** ``StreamingQueryProgress.observedMetrics`` (streaming runs): the tasks run
  inside the streaming query's own plan, and each ends its output with one extra row
  that carries its stores' metrics in a hidden map column (:data:`METRICS_COLUMN`).
  :func:`observe_state` sums those rows with ``DataFrame.observe`` — one observation
  ``localstate.<store>`` per store, shaped like the ``stateOperators`` entries of
  Spark's own state stores (:data:`OBSERVED_FIELDS`) — and drops them before the
  user's ``output`` sees the batch. So ``query.lastProgress["observedMetrics"]
  ["localstate.counts"]["numRowsUpdated"]`` is that micro-batch's puts, and a
  ``StreamingQueryListener`` gets them with every progress event::

      query = job.run_stream(df, checkpoint_location=...)
      query.lastProgress["observedMetrics"]["localstate.counts"]

  (``df.observe`` *inside* ``foreachBatch`` does not reach the progress — measured with
  PySpark 4.3: ``observedMetrics`` stays empty — and an observation on the input runs
  before the tasks touch their state: hence rows from the tasks themselves.)
* **to the driver**: each task also adds a snapshot (:func:`task_snapshot`, engine
  gauges included, with its close time: :func:`with_close_time`) to a Spark accumulator; the driver keeps the per-batch sums in
  ``job.batch_metrics`` (batch runs too), read by :func:`state_progress` and the
  Prometheus collector.

A task's figures leave it after its storage is closed, so they include the close (for
rocksdb a memtable flush and the clean-close claim, a fixed cost per micro-batch):
``closeTimeMs`` beside ``commitTimeMs``. The snapshot of the figures itself is taken just
before the close, while the stores are open (their counters and engine gauges are read
from the open engines).

Spark counts accumulator updates and observed rows of a retried task again: under task
retries the sums over-count (the state itself is exact; see streaming.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from localstate.metrics import COUNTER_FIELDS
from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:
    from localstate import TaskStorage
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from .runner import StatefulJob

__all__ = [
    "StateMetricsParam", "task_snapshot", "with_close_time", "metrics_delta", "batch_progress", "state_progress",
    "METRICS_COLUMN", "OBSERVED_FIELDS", "observation_name", "with_metrics_column", "with_null_metrics",
    "metrics_batch", "observe_state",
]

METRICS_COLUMN = "__localstate_metrics"
"""The hidden output column (``map<string, double>``, keys ``<store>.<field>``) of a task's
metrics row; null on every row the task emits."""

OBSERVED_FIELDS: tuple[str, ...] = (
    "numRowsTotal", "numRowsUpdated", "numRowsRemoved", "commitTimeMs", "closeTimeMs", "numTasks", *COUNTER_FIELDS,
)
"""The fields of each ``localstate.<store>`` observation: Spark's ``stateOperators`` names
(``numRowsTotal`` is the engine's key estimate, null when the engine has none; the commit
and close times are each task's, repeated in every store's observation), then the store
counters (docs/metrics.md), each summed over the batch's tasks."""


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


def run_counters(storage: TaskStorage) -> dict[str, dict[str, float]]:
    """The storage's counters and commit time so far, per store: what a run's
    :func:`task_snapshot` subtracts when its storage was kept open from an earlier run."""
    commit_ms = storage.task_metrics.commit_latency.sum * 1000
    out = {}
    for name in storage.stores:
        m = storage.metrics(name)
        out[name] = {**{field: float(getattr(m, field)) for field in COUNTER_FIELDS}, "commit_time_ms": commit_ms}
    return out


def task_snapshot(storage: TaskStorage, since: Mapping[str, Mapping[str, float]] | None = None
                  ) -> dict[str, dict[str, float]]:
    """This task's metrics per store: the counters of this run (those of the open, less
    ``since``: :func:`run_counters` at the run's start when the storage was kept open
    from an earlier run), the commit time, and the engine's gauges (e.g.
    ``estimated_keys``). Ratios are left out (they do not add up across tasks); hits and
    misses are there instead."""
    out: dict[str, dict[str, float]] = {}
    for name, counters in run_counters(storage).items():
        before = since.get(name, {}) if since else {}
        row = {field: value - before.get(field, 0.0) for field, value in counters.items()}
        row["tasks"] = 1.0
        for stat, value in storage.engine(name).stats().items():
            if not stat.endswith("_ratio"):
                row[f"engine_{stat}"] = float(value)
        out[name] = row
    return out


def with_close_time(snapshot: dict[str, dict[str, float]], seconds: float) -> dict[str, dict[str, float]]:
    """``snapshot`` (:func:`task_snapshot`) with the task's storage close time,
    ``close_time_ms``, in every store's row (as ``commit_time_ms``: one figure per task)."""
    return {store: {**row, "close_time_ms": seconds * 1000} for store, row in snapshot.items()}


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
            "closeTimeMs": int(m.get("close_time_ms", 0)),
            "numTasks": int(m.get("tasks", 0)),
            "customMetrics": {k: v for k, v in sorted(m.items())
                              if k not in ("puts", "deletes", "commit_time_ms", "close_time_ms", "tasks")},
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


def observation_name(store: str) -> str:
    """The ``observedMetrics`` key of ``store``'s metrics: ``localstate.<store>``."""
    return f"localstate.{store}"


def _metrics_type() -> pa.DataType:
    return pa.map_(pa.string(), pa.float64())


def with_metrics_column(struct: StructType) -> StructType:
    """The output struct of tasks run inside the streaming plan: the job's columns, made
    nullable (the metrics row has no values for them), plus :data:`METRICS_COLUMN`."""
    from localstate import ConfigError
    from pyspark.sql.types import DoubleType, MapType, StringType, StructField, StructType

    if METRICS_COLUMN in struct.names:
        raise ConfigError(f"output_schema has a column {METRICS_COLUMN!r}, the name the streaming runner uses "
                          "for its state metrics rows: rename it")
    fields = [StructField(f.name, f.dataType, True, f.metadata) for f in struct.fields]
    return StructType([*fields, StructField(METRICS_COLUMN, MapType(StringType(), DoubleType()), True)])


def with_null_metrics(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An output batch with the (null) metrics column appended."""
    return pa.RecordBatch.from_arrays([*batch.columns, pa.nulls(batch.num_rows, _metrics_type())],
                                      names=[*batch.schema.names, METRICS_COLUMN])


def metrics_batch(snapshot: Mapping[str, Mapping[str, float]], output_schema: pa.Schema) -> pa.RecordBatch:
    """One row: nulls in the job's columns, this task's metrics (``snapshot``: its
    :func:`task_snapshot` after its commit, :func:`with_close_time` after its close) in
    :data:`METRICS_COLUMN`."""
    entries: list[tuple[str, float]] = []
    for store, row in batch_progress(snapshot).items():
        # the Spark-named fields, and every store counter under its own name (puts and
        # deletes included, though numRowsUpdated/numRowsRemoved repeat them)
        values = {**snapshot[store], **{k: v for k, v in row.items() if k != "customMetrics"}}
        if values["numRowsTotal"] < 0:
            del values["numRowsTotal"]  # the engine has no estimate: null, not -1, in the sums
        entries.extend((f"{store}.{k}", float(values[k])) for k in OBSERVED_FIELDS if k in values)
    arrays = [pa.nulls(1, f.type) for f in output_schema]
    arrays.append(pa.array([entries], _metrics_type()))
    return pa.RecordBatch.from_arrays(arrays, names=[*output_schema.names, METRICS_COLUMN])


def observe_state(plan: DataFrame, stores: list[str]) -> DataFrame:
    """``plan`` (tasks run with metrics rows) observed per store, without the metrics rows
    and column: what the job's ``output`` receives."""
    from pyspark.sql import functions as F

    metrics = F.col(METRICS_COLUMN)
    observed = plan
    for store in sorted(stores):
        exprs = [F.sum(metrics[f"{store}.{field}"]).cast("long").alias(field) for field in OBSERVED_FIELDS]
        observed = observed.observe(observation_name(store), *exprs)
    return observed.where(metrics.isNull()).drop(METRICS_COLUMN)
