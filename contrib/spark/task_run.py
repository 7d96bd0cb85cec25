"""One task's run inside a Spark task, on the executor.

:func:`run_partition` runs one task over its partition's Arrow batches,
:func:`run_partitions` several tasks side by side in one Spark task: each opens (restores)
its storage for the run's commit version, feeds the task, fires timers, calls ``window``,
commits and closes. :class:`TaskRun` is what the driver ships to the executors: the job's
config, the task class, the output schema and the commit version.

Executors sharing one file system share ``job.state.dir`` unless it contains
``{executor}`` (:func:`executor_state_dir`), resolved here, on the executor.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate import Config, ConfigError, LocalStateError
from localstate.copies import record_copy
from localstate.kept_open import KEEP_OPEN_S, kept_storages

from .streaming import commit_version, open_version, stream_batch_id
from .task import Emitter, StreamTask, TaskContext

__all__ = [
    "LOCK_WAIT_S",
    "TaskRun",
    "EXECUTOR_PLACEHOLDER",
    "executor_id",
    "executor_state_dir",
    "run_partition",
    "run_partitions",
    "task_groups",
    "spark_task_keys",
    "spark_partition_id",
    "PARTITION_COLUMN",
]

LOCK_WAIT_S = 60.0
"""How long a task waits for its partition's lock (a killed attempt's Python worker
may still be exiting when Spark starts the next attempt)."""


@dataclass(frozen=True)
class TaskRun:
    """How to run one partition: which job, which task class, which commit version."""

    config: Config
    task: type[StreamTask]
    output_schema: pa.Schema
    batch_id: int | None = None
    """Streaming: the micro-batch id (= commit version); None for a batch run."""
    lock_wait_s: float = LOCK_WAIT_S
    metrics: Any = None
    """A Spark accumulator of :class:`~localstate.contrib.spark.metrics.StateMetricsParam`:
    each task adds its stores' metrics after its commit (None: not gathered)."""
    in_stream_plan: bool = False
    """Run inside a streaming query's plan: the commit version is the micro-batch id
    Spark gives the task (:func:`~localstate.contrib.spark.streaming.stream_batch_id`),
    and the output ends with a metrics row for ``DataFrame.observe``
    (:mod:`localstate.contrib.spark.metrics`)."""
    placement_report: Any = None
    """A Spark accumulator of :class:`~localstate.contrib.spark.placement.PlacementParam`:
    each Spark task adds ``{spark partition: executor}`` after its tasks committed (None:
    the job runs without placement)."""
    owners: Mapping[int, str] | None = None
    """Task → the executor the placement registry gives it this run: copies this
    executor holds of other executors' tasks are swept after the commit
    (:func:`~localstate.contrib.spark.placement.sweep_copies`)."""
    standbys: Mapping[int, str] | None = None
    """Task → the executor keeping its standby copy: kept by the sweep."""
    key: str | None = None
    """The job's key column (:attr:`TaskContext.key_column`: keyed state is scoped to it)."""
    keep_open_s: float = KEEP_OPEN_S
    """How long a Python worker keeps a task's storage open after its run, for the task's
    next run in the same worker (:mod:`localstate.kept_open`; 0: close after every run)."""


EXECUTOR_PLACEHOLDER = "{executor}"
_LOG_URL_EXECUTOR = re.compile(r"[?&]executorId=([^&]+)")
_ENV_PLACEHOLDER = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def executor_id() -> str:
    """The id of the Spark executor this Python worker serves.

    From ``SPARK_EXECUTOR_ID`` (Kubernetes executors), else the ``executorId`` of
    ``SPARK_LOG_URL_STDERR`` (standalone and ``local-cluster`` executors), else
    ``CONTAINER_ID`` (YARN), else ``"driver"`` (``local[*]``: the driver is the only
    executor). A re-launched executor gets a new id.
    """
    explicit = os.environ.get("SPARK_EXECUTOR_ID")
    if explicit:
        return explicit
    match = _LOG_URL_EXECUTOR.search(os.environ.get("SPARK_LOG_URL_STDERR", ""))
    if match:
        return match.group(1)
    return os.environ.get("CONTAINER_ID") or "driver"


def executor_state_dir(config: Config, executor: str | None = None) -> Config:
    """``config`` with the placeholders of ``job.state.dir`` resolved on this executor:
    ``{executor}`` by ``executor`` (default: :func:`executor_id`), ``{env:NAME}`` by the
    environment variable ``NAME`` (e.g. a local disk each worker node sets for the
    executors it launches); ``config`` itself when there is none.

    Raises :class:`ConfigError` naming the variable when ``{env:NAME}`` is unset.
    """
    state_dir = str(config.state_dir)
    if EXECUTOR_PLACEHOLDER not in state_dir and "{env:" not in state_dir:
        return config

    def from_env(match: re.Match[str]) -> str:
        value = os.environ.get(match.group(1))
        if not value:
            raise ConfigError(
                f"job {config.job_name!r}: job.state.dir {state_dir!r} names the environment variable "
                f"{match.group(1)!r}, which is not set on executor {executor_id()!r}; set it for the "
                "executors (e.g. in the worker's environment or spark.executorEnv.<NAME>)")
        return value

    resolved = _ENV_PLACEHOLDER.sub(from_env, state_dir)
    if EXECUTOR_PLACEHOLDER in resolved:
        name = (executor if executor is not None else executor_id()).replace(os.sep, "_")
        resolved = resolved.replace(EXECUTOR_PLACEHOLDER, name)
    return config.with_overrides({"job.state.dir": resolved})


class _TaskAttempt:
    """One task's run inside a Spark task: its storage opened for the run's version, the
    task initialised; :meth:`feed` input batches, then :meth:`finish` (timers, ``window``,
    commit, close), :meth:`close` always (again: it is idempotent). Output batches come
    back from :meth:`feed` and :meth:`finish` as they are emitted."""

    def __init__(self, run: TaskRun, config: Config, partition: int, batch_id: int | None) -> None:
        self.run = run
        self.partition = partition
        self.batch_id = batch_id
        self.rows = 0
        opening = time.perf_counter()
        self.keep_open_s = run.keep_open_s if worker_reused() else 0.0
        if self.keep_open_s:
            freeze_worker_heap()
        kept = kept_storages().take(config, partition, lambda s: _before(s, batch_id)) if self.keep_open_s else None
        self.storage = kept or open_version(config, partition, batch_id, run.lock_wait_s)
        self.reused = kept is not None
        self.counters_before: dict[str, dict[str, float]] | None = None
        if self.reused and (run.metrics is not None or run.in_stream_plan):
            from .metrics import run_counters

            self.counters_before = run_counters(self.storage)  # this run's metrics start here
        open_seconds = time.perf_counter() - opening
        self.task: StreamTask | None = None
        self._closed = False
        try:
            emit = self.emit = Emitter(run.output_schema)
            self.drain = emit.drain
            if run.in_stream_plan:
                from .metrics import with_null_metrics

                def drain() -> Iterator[pa.RecordBatch]:
                    return map(with_null_metrics, emit.drain())

                self.drain = drain
            task = self.task = run.task()
            self.context = TaskContext(partition, config.partitions, config, self.storage, task.timer_store,
                                       open_seconds, run.key, self.reused)
            task.init(self.context)
        except BaseException:
            self.close()
            raise

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        task = self.task
        assert task is not None, "feed after close"
        self.rows += batch.num_rows
        # The batch is processed at its event time (event-time TTL stamps its writes
        # with it); timers fire after it, so the batch can still delete or move them.
        self.context.observe_event_time(task, batch)
        self.context.process(task, batch, self.emit)
        self.context.fire_timers(task, self.emit)
        return self.drain()

    def finish(self) -> Iterator[pa.RecordBatch]:
        task = self.task
        assert task is not None, "finish after close"
        self.context.fire_timers(task, self.emit)
        task.window(self.emit)
        yield from self.drain()
        commit_version(self.storage, self.batch_id, self.rows)
        record_copy(self.storage.config, self.partition, self.batch_id, executor_id())
        if self.run.metrics is None and not self.run.in_stream_plan:
            self.close(park=True)
            return
        from .metrics import metrics_batch, task_snapshot, with_close_time

        # The figures are read from the open stores, then the task closes before they leave
        # it, so they include the close (with rocksdb a memtable flush and the clean-close
        # claim, a fixed cost per micro-batch). The version is committed; the close only
        # releases the state.
        snapshot = task_snapshot(self.storage, self.counters_before)
        closing = time.perf_counter()
        self.close(park=True)
        snapshot = with_close_time(snapshot, time.perf_counter() - closing)
        if self.run.metrics is not None:
            self.run.metrics.add(snapshot)
        if self.run.in_stream_plan:
            yield metrics_batch(snapshot, self.run.output_schema)

    def close(self, park: bool = False) -> None:
        """Close the task and its storage (once; later calls do nothing). With ``park``
        (after the commit) the storage stays open for the task's next run in this worker
        when it can (:mod:`localstate.kept_open`)."""
        if self._closed:
            return
        self._closed = True
        task, self.task = self.task, None
        closed = False
        try:
            if task is not None:
                task.close()
            closed = True
        finally:
            if closed and park and self.keep_open_s and kept_storages().park(self.storage, self.keep_open_s):
                close_kept_on_exit_signals()
            else:
                self.storage.close()


def _before(storage: Any, version: int | None) -> bool:
    """Whether a parked ``storage`` can apply ``version`` as it is (a re-run of its own
    committed version rolls back through :func:`open_version` instead)."""
    committed = storage.checkpoint
    return version is None or committed is None or committed.version < version


def worker_reused() -> bool:
    """Whether this Python worker runs more than one Spark task (``spark.python.worker.reuse``,
    Spark's default): only then can a task's storage wait open for its next run here."""
    return os.environ.get("SPARK_REUSE_WORKER") == "1"


_FIRST_SPARK_TASK: int | None = None
_HEAP_FROZEN = False


def freeze_worker_heap() -> bool:
    """Once per reused Python worker, at the start of the first localstate run in its
    second Spark task: move every object the worker holds into the interpreter's
    permanent generation (``gc.freeze``). True when this call froze it.

    PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused
    worker, before it reads the next one, so a worker's second task of a micro-batch
    waits for a collection over everything the worker holds: the modules, classes and
    functions of PySpark, pyarrow and localstate and the parked storages, some 90,000
    objects here, tens of milliseconds per Spark task, paid again every task. Those objects
    live as long as the worker; frozen, each later collection leaves them out and covers
    only what was made since.

    Why then: the collection that ran just before this Spark task left only live objects
    (the first Spark task imported the engines and serdes the runs need). Frozen objects
    are still freed by reference counting, so a parked storage closed later goes as
    before; only an object frozen here that later ends up in an unreachable cycle is
    never reclaimed (a closed storage leaves a few dozen small ones, once per worker).
    """
    global _FIRST_SPARK_TASK, _HEAP_FROZEN
    if _HEAP_FROZEN or not worker_reused():
        return False
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    if ctx is None:
        return False
    attempt = ctx.taskAttemptId()
    if _FIRST_SPARK_TASK is None:
        _FIRST_SPARK_TASK = attempt
    if attempt == _FIRST_SPARK_TASK:
        return False
    import gc

    gc.freeze()
    _HEAP_FROZEN = True
    return True


_SIGNALS_HOOKED = False


def close_kept_on_exit_signals() -> None:
    """Close this worker's parked storages cleanly when Spark stops it (its daemon sends
    SIGHUP, an executor's stop SIGTERM) before the signal's own action; installed once,
    from the main thread."""
    global _SIGNALS_HOOKED
    import signal
    import threading

    if _SIGNALS_HOOKED or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS_HOOKED = True
    for signum in (signal.SIGHUP, signal.SIGTERM):
        former = signal.getsignal(signum)

        def on_signal(number: int, frame: Any, former: Any = former) -> None:
            kept_storages().close_all(wait=False)
            if callable(former):
                former(number, frame)
                return
            signal.signal(number, former if former is not None else signal.SIG_DFL)
            os.kill(os.getpid(), number)

        signal.signal(signum, on_signal)


def _resolve(run: TaskRun) -> tuple[Config, int | None]:
    """The run's config with ``{executor}`` resolved, and its commit version."""
    return executor_state_dir(run.config), stream_batch_id() if run.in_stream_plan else run.batch_id


def run_partition(run: TaskRun, partition: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Run task ``partition`` over ``batches`` and yield its output batches.

    Opens (restores) the partition's storage, for streaming first rolls back a batch
    that localstate committed but Spark did not (see
    :func:`localstate.contrib.spark.streaming.prepare_version`), processes, windows,
    commits, and closes. Output is yielded as it is emitted; the commit happens when
    the input is exhausted, so a consumer that stops early (``limit``) commits nothing.
    ``{executor}`` in ``job.state.dir`` is resolved here, on the executor (the task
    sees the resolved config).
    """
    config, batch_id = _resolve(run)
    attempt = _TaskAttempt(run, config, partition, batch_id)
    try:
        for batch in batches:
            yield from attempt.feed(batch)
        yield from attempt.finish()
    finally:
        attempt.close()
    _after_commit(run, config)


def _after_commit(run: TaskRun, config: Config) -> None:
    """A placed run, once its tasks committed: report where it ran, and delete the copies
    this executor holds of tasks placed elsewhere whose owner committed past them."""
    if run.placement_report is None:
        return
    from .placement import sweep_copies

    me = executor_id()
    run.placement_report.add({spark_partition_id(): me})
    if run.owners is not None:
        owners = run.owners
        # a task the registry placed elsewhere runs there from now on: its open here is stale
        kept_storages().release(lambda key: key[:2] == (str(config.state_dir), config.job_name)
                                and owners.get(key[2], me) != me)
        sweep_copies(config, owners, me, run.standbys)


PARTITION_COLUMN = "__localstate_partition"
"""The column :meth:`StatefulJob.transform` adds when several tasks share a Spark task:
each row's task, ``pmod(hash(key), N)`` — the partition ``repartition(N, key)`` gives it."""


def run_partitions(run: TaskRun, partitions: list[int], batches: Iterator[pa.RecordBatch],
                   column: str = PARTITION_COLUMN) -> Iterator[pa.RecordBatch]:
    """Run the tasks ``partitions`` side by side in one Spark task over ``batches``, whose
    ``column`` holds each row's task; yield their output batches.

    Every task is opened first and runs even without rows (its timers fire and it
    commits the version, as in :func:`run_partition`); each input batch is split by
    ``column`` (dropped before the tasks see it). Nothing is committed before all input
    is read; then each task finishes, commits and closes (its locks released) in turn, so
    a failure part-way leaves some tasks at the new version and others not — a retry of
    the Spark task rolls the former back and applies the batch once
    (:mod:`localstate.contrib.spark.streaming`). A row whose task is not in
    ``partitions`` is an error (it would be lost).
    """
    config, batch_id = _resolve(run)
    attempts: list[_TaskAttempt] = []
    try:
        for partition in partitions:
            attempts.append(_TaskAttempt(run, config, partition, batch_id))
        for batch in batches:
            owners = batch.column(column)
            data = batch.drop_columns([column])
            routed = 0
            for attempt in attempts:
                part = data.filter(pc.equal(owners, attempt.partition))
                if part.num_rows:
                    routed += part.num_rows
                    yield from attempt.feed(part)
            if routed != batch.num_rows:
                stray = sorted(set(owners.to_pylist()) - set(partitions))
                raise LocalStateError(
                    f"job {config.job_name!r}: this Spark task runs tasks {partitions} but got rows of "
                    f"task(s) {stray}; the input was not partitioned by StatefulJob.transform"
                )
        for attempt in attempts:
            yield from attempt.finish()
            attempt.close(park=True)
        _after_commit(run, config)
    finally:
        errors: list[BaseException] = []
        for attempt in attempts:
            try:
                attempt.close()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]


def task_groups(tasks: int, spark_tasks: int) -> list[list[int]]:
    """Which tasks each of ``spark_tasks`` Spark tasks runs: Spark task ``i`` runs tasks
    ``i, i + spark_tasks, i + 2 * spark_tasks, …`` below ``tasks``."""
    return [list(range(i, tasks, spark_tasks)) for i in range(spark_tasks)]


def spark_task_keys(spark_tasks: int) -> list[int]:
    """Per Spark task ``i``: the smallest int ``v >= 0`` that ``repartition(spark_tasks, lit(v))``
    sends to partition ``i`` (Spark's ``pmod(hash(v), spark_tasks)``, :mod:`localstate.partitioning`).
    Repartitioning by ``keys[task % spark_tasks]`` places every row of a task exactly."""
    from localstate.partitioning import task_for

    keys: dict[int, int] = {}
    value = 0
    while len(keys) < spark_tasks:
        keys.setdefault(task_for(value, spark_tasks, as_int32=True), value)
        value += 1
    return [keys[i] for i in range(spark_tasks)]


def spark_partition_id() -> int:
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    if ctx is None:
        raise LocalStateError("run_partition must run inside a Spark task (no pyspark TaskContext)")
    return ctx.partitionId()
