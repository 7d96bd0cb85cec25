"""Run a :class:`StreamTask` per Spark partition, with its state in localstate.

A :class:`StatefulJob` repartitions its input by the key column into N partitions
(N = ``job.partitions`` = changelog partitions). Partition ``p`` is task ``p``: on
the executor it opens ``TaskStorage(config, p)`` under ``job.state.dir`` (which
restores the stores from the changelog when the local copy is missing or behind —
as happens when Spark moves the task to another executor), hands the task whole
Arrow record batches (``mapInArrow``), calls ``window`` and commits. The rows the
task emits become the output DataFrame, with the declared schema.

Structured Streaming (:meth:`StatefulJob.run_stream`) runs the tasks inside the
query's plan, evaluated once per micro-batch by ``foreachBatch``; the micro-batch id
is the commit version, and the tasks' state metrics reach the query's progress as
observed metrics (:mod:`localstate.contrib.spark.metrics`). See :mod:`localstate.contrib.spark.streaming` for
how a re-run batch is applied exactly once.

Executors sharing one file system (``local-cluster``, several executors per host)
share ``job.state.dir`` unless it contains ``{executor}``: each executor then
replaces it with its own id (:func:`executor_id`), so a task that moves finds no
local copy, or a stale one, and restores from the changelog — which must stay
shared (``systems.file.path``). Attempts of one task on different executors are
then kept apart by the changelog partition's single-writer lock, not the state-dir
lock, and a streaming task checks its committed version again once it holds that
lock (see :func:`localstate.contrib.spark.streaming.open_version`).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate import Config, ConfigError, LocalStateError
from localstate.copies import record_copy

from .compat import RUNNER_PYSPARK, require_pyspark
from .streaming import commit_version, next_version, open_version, stream_batch_id
from .task import Emitter, StreamTask, TaskContext
from .ticks import check_checkpoint_ticks, check_timer_interval, tick_trigger, with_ticks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

__all__ = [
    "require_pyspark",
    "Emitter",
    "StatefulJob",
    "StreamTask",
    "TaskContext",
    "TaskRun",
    "executor_id",
    "executor_state_dir",
    "run_partition",
    "run_partitions",
    "task_groups",
    "spark_task_keys",
    "PARTITION_COLUMN",
    "spark_session",
    "one_host_exclusion",
    "wait_for_executors",
]

KEPT_BATCH_METRICS = 100
"""How many micro-batches' state metrics a streaming job keeps on the driver."""

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


@dataclass(frozen=True)
class _PlacedRun:
    """One run's placement: a preferred location per Spark partition, the executor
    proposed per task, and the accumulator the Spark tasks report where they ran to."""

    locations: list[list[str]]
    owners: dict[int, str]
    report: Any
    standbys: dict[int, str]


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
        self.storage = open_version(config, partition, batch_id, run.lock_wait_s)
        open_seconds = time.perf_counter() - opening
        self.task: StreamTask | None = None
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
                                       open_seconds, run.key)
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
            self.close()
            return
        from .metrics import metrics_batch, task_snapshot, with_close_time

        # The figures are read from the open stores, then the task closes before they leave
        # it, so they include the close (with rocksdb a memtable flush and the clean-close
        # claim, a fixed cost per micro-batch). The version is committed; the close only
        # releases the state.
        snapshot = task_snapshot(self.storage)
        closing = time.perf_counter()
        self.close()
        snapshot = with_close_time(snapshot, time.perf_counter() - closing)
        if self.run.metrics is not None:
            self.run.metrics.add(snapshot)
        if self.run.in_stream_plan:
            yield metrics_batch(snapshot, self.run.output_schema)

    def close(self) -> None:
        """Close the task and its storage (once; later calls do nothing)."""
        task, self.task = self.task, None
        try:
            if task is not None:
                task.close()
        finally:
            self.storage.close()


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
    run.placement_report.add({_spark_partition_id(): me})
    if run.owners is not None:
        sweep_copies(config, run.owners, me, run.standbys)


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
            attempt.close()
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


def _spark_partition_id() -> int:
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    if ctx is None:
        raise LocalStateError("run_partition must run inside a Spark task (no pyspark TaskContext)")
    return ctx.partitionId()


def _to_struct(schema: StructType | str) -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    try:
        parsed = _parse_datatype_string(schema)
    except Exception as e:
        raise ConfigError(f"output_schema {schema!r} is not a valid Spark DDL schema: {e}") from e
    if not isinstance(parsed, StructType):
        raise ConfigError(f"output_schema {schema!r} must be a struct (e.g. 'user string, views long')")
    return parsed


class StatefulJob:
    """A stateful job: ``task`` run per key partition with its stores in localstate.

    ``num_tasks`` defaults to ``config.partitions`` (``job.partitions``) and must equal
    it: a task is a changelog partition.

    ``spark_tasks`` (default: ``num_tasks``) is how many Spark tasks run them: with
    fewer, Spark task ``i`` runs tasks ``i, i + spark_tasks, …`` side by side
    (:func:`run_partitions`). Each Spark task pays a fixed cost (scheduling, shuffle
    fetch set-up, the Python worker hand-off — tens of ms even for a tiny micro-batch),
    so setting it to the cores the job gets (e.g. 2 tasks per Spark task on 2 cores)
    runs a micro-batch in one wave instead of several. Which task a key belongs to does
    not change (``pmod(hash(key), num_tasks)``, as ``repartition(num_tasks, key)``).

    ``affinity`` (default on): on a cluster (executors besides the driver), each run's
    Spark tasks prefer the executor that holds their state
    (:mod:`localstate.contrib.spark.placement`, the registry in :attr:`placement`).
    With ``job.standby.replicas = 1`` another executor keeps a warm copy of each task,
    brought up to the task's commit after every run
    (:mod:`localstate.contrib.spark.standby`; reports in :attr:`standby_follows`).

    >>> job = StatefulJob(config, CountViews, key="user_id",          # doctest: +SKIP
    ...                   output_schema="user_id string, views long")
    >>> job.run(spark.read.parquet("views")).show()   # runs every task once  # doctest: +SKIP
    """

    def __init__(
        self,
        config: Config,
        task: type[StreamTask],
        *,
        key: str,
        output_schema: StructType | str,
        num_tasks: int | None = None,
        spark_tasks: int | None = None,
        affinity: bool = True,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"StatefulJob needs a localstate.Config, got {type(config).__name__}")
        if not (isinstance(task, type) and issubclass(task, StreamTask)):
            raise TypeError(f"task must be a StreamTask subclass, got {task!r}")
        n = config.partitions if num_tasks is None else num_tasks
        if n != config.partitions:
            raise ConfigError(
                f"num_tasks = {n} but job.partitions = {config.partitions} for job {config.job_name!r}: "
                "a task is a changelog partition, so set job.partitions to the task count"
            )
        grouped = n if spark_tasks is None else spark_tasks
        if isinstance(grouped, bool) or not isinstance(grouped, int) or not 1 <= grouped <= n:
            raise ConfigError(
                f"job {config.job_name!r}: spark_tasks must be an int from 1 to the task count {n}, "
                f"got {spark_tasks!r}"
            )
        self.config = config
        self.task = task
        self.key = key
        self.num_tasks = n
        self.spark_tasks = grouped
        self.output_schema = output_schema
        self.lock_wait_s = LOCK_WAIT_S
        self.affinity = affinity
        from .placement import Placement

        self.placement = Placement(grouped)
        """Where each Spark partition ran last (the placement registry, on this driver)."""
        self._placement_reports: dict[str, Any] = {}
        self.metrics_accumulator: Any = None
        """Set by :meth:`run_stream`: where the tasks add their state metrics."""
        self.standby_follows: dict[int, dict[str, Any]] = {}
        """Per run version (the last :data:`KEPT_BATCH_METRICS`): the standby follow after it,
        ``{"seconds": wall time of the follow job, "reports": [what each follow did]}``
        (:func:`~localstate.contrib.spark.standby.follow_standbys`)."""
        self.batch_metrics: dict[int, dict[str, Any]] = {}
        """Per micro-batch id or batch-run version (streaming: the last
        :data:`KEPT_BATCH_METRICS`): the state metrics of its tasks, per store (see
        :mod:`localstate.contrib.spark.metrics`)."""

    def _struct(self) -> StructType:
        return _to_struct(self.output_schema)

    def check_input(self, df: DataFrame) -> None:
        """Raise :class:`ConfigError` unless ``df`` has the job's key column (and, when
        tasks share Spark tasks, no column named :data:`PARTITION_COLUMN`)."""
        if self.key not in df.columns:
            raise ConfigError(
                f"job {self.config.job_name!r}: key column {self.key!r} is not in the input "
                f"(columns: {', '.join(df.columns)})"
            )
        if self.spark_tasks != self.num_tasks and PARTITION_COLUMN in df.columns:
            raise ConfigError(
                f"job {self.config.job_name!r}: the input has a column {PARTITION_COLUMN!r}, which the runner "
                "adds itself when tasks share Spark tasks (spark_tasks); rename it"
            )

    def transform(self, df: DataFrame, batch_id: int | None = None, *, in_stream_plan: bool = False,
                  placement: _PlacedRun | None = None, co_partitioned: bool = False) -> DataFrame:
        """The lazy output DataFrame of one run over ``df`` (``batch_id``: streaming version).

        Executing it more than once re-runs the tasks: a batch run applies its input
        again; a streaming batch rolls back to ``batch_id - 1`` first (idempotent).
        With ``placement`` (:meth:`placement_plan`) each Spark task prefers the executor
        the registry proposes (:mod:`localstate.contrib.spark.placement`). ``co_partitioned``:
        no shuffle, each Spark partition of a Kafka source runs the task of its topic
        partition (:mod:`localstate.contrib.spark.kafka_input`).
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        require_pyspark(RUNNER_PYSPARK, "the localstate Spark runner")
        self.check_input(df)
        struct = self._struct()
        run = TaskRun(self.config, self.task, to_arrow_schema(struct), batch_id, self.lock_wait_s,
                      self.metrics_accumulator, in_stream_plan,
                      placement.report if placement is not None else None,
                      placement.owners if placement is not None else None,
                      placement.standbys if placement is not None else None, self.key)

        if in_stream_plan:  # ``in_stream_plan``: see TaskRun.in_stream_plan
            from .metrics import with_metrics_column

            struct = with_metrics_column(struct)
        if co_partitioned:
            from .kafka_input import co_partitioned_plan

            return co_partitioned_plan(self, df, run, struct)
        if self.spark_tasks == self.num_tasks:
            def tasks_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                return run_partition(run, _spark_partition_id(), batches)

            partitioned = df.repartition(self.num_tasks, self.key)
        else:
            from pyspark.sql import functions as F

            groups = task_groups(self.num_tasks, self.spark_tasks)

            def tasks_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                return run_partitions(run, groups[_spark_partition_id()], batches)

            owner = F.pmod(F.hash(self.key), F.lit(self.num_tasks))
            keys = F.array(*(F.lit(v) for v in spark_task_keys(self.spark_tasks)))
            spark_task = F.element_at(keys, F.pmod(F.col(PARTITION_COLUMN), F.lit(self.spark_tasks)) + 1)
            partitioned = df.withColumn(PARTITION_COLUMN, owner).repartition(self.spark_tasks, spark_task)
        if placement is None:
            return partitioned.mapInArrow(tasks_fn, struct)
        from .placement import placed, unpacked

        def placed_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return tasks_fn(unpacked(batches))

        return placed(partitioned, placement.locations).mapInArrow(placed_fn, struct)

    def placement_plan(self, spark: SparkSession) -> _PlacedRun | None:
        """Where the next run's Spark tasks should go (None: the job runs without
        affinity, or there are no executors besides the driver, as under ``local[*]``)."""
        if not self.affinity:
            return None
        from .placement import PlacementParam, live_executors, location

        sc = spark.sparkContext
        executors = live_executors(sc)
        if not executors:
            return None
        assignment = self.placement.assign(executors)
        standbys = [self.placement.standbys.get(i) for i in range(self.spark_tasks)]
        # With standbys a Spark task prefers its standby as much as its owner: both hold the
        # last commit (the standby followed it), and a retry after the owner is lost mid-run
        # then goes where the warm copy is instead of anywhere.
        locations = [[location(x, executors[x]) for x in (e, s) if x is not None and x in executors]
                     for e, s in zip(assignment, standbys)]
        owners = self.placement.owner_of_tasks(task_groups(self.num_tasks, self.spark_tasks), assignment)
        # One accumulator per job and SparkContext, emptied before each run (runs of a job
        # are sequential): a new one per micro-batch would stay registered with the context.
        report = self._placement_reports.get(sc.applicationId)
        if report is None:
            report = self._placement_reports[sc.applicationId] = sc.accumulator({}, PlacementParam())
        report.value = {}
        return _PlacedRun(locations, owners, report,
                          self.placement.owner_of_tasks(task_groups(self.num_tasks, self.spark_tasks), standbys))

    def follow_standbys(self, spark: SparkSession, version: int) -> None:
        """After run ``version`` committed: the standby executors bring their copies up to
        it (nothing without ``job.standby.replicas`` or a second executor)."""
        if self.config.standby_replicas < 1:
            return
        from .placement import live_executors
        from .standby import follow_standbys

        sc = spark.sparkContext
        t0 = time.perf_counter()
        reports = follow_standbys(sc, self.config, self.placement, task_groups(self.num_tasks, self.spark_tasks),
                                  live_executors(sc))
        self.standby_follows[version] = {"seconds": time.perf_counter() - t0, "reports": reports}
        for old in sorted(self.standby_follows)[:-KEPT_BATCH_METRICS]:
            del self.standby_follows[old]

    def run(self, df: DataFrame, *, version: int | None = None,
            output: Callable[[DataFrame, int], None] | None = None) -> DataFrame:
        """Batch run — an **action**: repartition ``df`` by key into N tasks, run every
        task now, exactly once, and commit each as ``version``.

        Returns the emitted rows, already computed (``localCheckpoint``), as a DataFrame
        with the declared output schema: ``show()``, ``count()`` or a write read it any
        number of times without touching the state again. (Spark is lazy: a run that
        returned the plan itself let ``show()`` run one task of N and each further
        action apply the input again.)

        ``version`` defaults to one past the tasks' committed version. Each task commits
        it through the streaming protocol, so a Spark task retry, or a re-evaluation
        Spark needs after losing the computed output, rolls the task back to
        ``version - 1`` and applies its input once. If the driver dies mid-run some
        tasks have committed and others not; the next ``run`` refuses to guess and
        names the version to repeat: ``run(same_input, version=V)`` completes it.

        ``output(rows, version)`` (e.g. an exactly-once sink of
        :mod:`localstate.contrib.spark.sinks`) receives the emitted rows after the commit.
        A sink that knows what it delivered (``delivered()``) makes a run without
        ``version`` refuse to go on past a committed version whose output it lacks.
        """
        if output is not None and version is None:
            from .sinks import check_delivered

            check_delivered(self.config, output)
        version = next_version(self.config, version)
        from .metrics import StateMetricsParam, batch_progress

        accumulator = df.sparkSession.sparkContext.accumulator({}, StateMetricsParam())
        self.metrics_accumulator = accumulator
        placement = self.placement_plan(df.sparkSession)
        try:
            result = self.transform(df, batch_id=version, placement=placement).localCheckpoint(eager=True)
        finally:
            self.metrics_accumulator = None
        if placement is not None:
            self.placement.record(placement.report.value)
            self.follow_standbys(df.sparkSession, version)
        self.batch_metrics[version] = batch_progress(accumulator.value)
        if output is not None:
            output(result, version)
        return result

    def run_stream(
        self,
        stream_df: DataFrame,
        *,
        checkpoint_location: str,
        trigger: dict[str, Any] | None = None,
        output: Callable[[DataFrame, int], None] | None = None,
        timer_interval_ms: int | None = None,
        co_partitioned: bool = False,
    ) -> StreamingQuery:
        """Start the job over ``stream_df`` with ``foreachBatch``; returns the running query.

        Each micro-batch ``B`` runs every task with commit version ``B``. ``output(df, B)``
        receives the batch's emitted rows (persisted, so evaluating them more than once
        does not re-run the tasks); without ``output`` the rows are computed and dropped.
        Spark calls ``output`` again for a batch it runs again: an exactly-once sink of
        :mod:`localstate.contrib.spark.sinks` delivers each batch once.
        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``
        or ``{"processingTime": "2 seconds"}``). Each batch's state metrics are in
        :attr:`batch_metrics` and, when the tasks run in the query's own plan (``local[*]``,
        or ``affinity=False``), in ``query.lastProgress["observedMetrics"]["localstate.<store>"]``;
        on a cluster with affinity they run inside ``foreachBatch``, each run placed
        (:mod:`localstate.contrib.spark.placement`).

        ``timer_interval_ms`` (an int >= 1): run a micro-batch every that many ms even
        without new input, so due timers fire on their own (a session closes after its
        gap with no further events). It sets the trigger to ``processingTime`` of that
        interval — give no ``trigger`` with it — and adds a tick source whose rows no task
        ever sees (:mod:`localstate.contrib.spark.ticks`); each tick micro-batch is a
        commit version like any other. A bad interval, ``trigger`` with it, or a (local)
        checkpoint written without ticks is a :class:`ConfigError` before the query starts.

        ``co_partitioned=True``: ``stream_df`` is Spark's Kafka source (``format("kafka")``)
        over a topic already partitioned by the job's key into ``job.partitions`` partitions;
        each topic partition's Spark partition runs its task with no shuffle. What it needs
        (one topic, no ``minPartitions``, the producer choosing each record's partition as
        ``pmod(hash(key), N)``) is in :mod:`localstate.contrib.spark.kafka_input`; a run that
        could not be exact is a :class:`ConfigError` before the query starts.
        """
        from .metrics import StateMetricsParam, batch_progress, metrics_delta, observe_state

        interval = check_timer_interval(self.config.job_name, timer_interval_ms)
        if interval is not None:
            trigger = tick_trigger(self.config.job_name, interval, trigger)
            check_checkpoint_ticks(self.config.job_name, checkpoint_location)
        self.check_input(stream_df)
        if co_partitioned:
            from .kafka_input import check_co_partitioned

            check_co_partitioned(self, stream_df, interval)
        if interval is not None:
            stream_df = with_ticks(stream_df)
        accumulator = stream_df.sparkSession.sparkContext.accumulator({}, StateMetricsParam())
        self.metrics_accumulator = accumulator
        from .placement import live_executors

        # Without executors of its own (local[*]) or affinity, the tasks run in the query's
        # own plan (their metrics reach its progress as observed metrics); foreachBatch
        # evaluates it once per micro-batch. On a cluster they run inside foreachBatch, on
        # the micro-batch's input, where each run can carry its placement.
        # (Co-partitioned tasks follow the Kafka source's own placement: a topic partition
        # prefers one executor.)
        placed = (self.affinity and not co_partitioned
                  and bool(live_executors(stream_df.sparkSession.sparkContext)))
        if placed:
            plan = stream_df
        else:
            plan = observe_state(self.transform(stream_df, in_stream_plan=True, co_partitioned=co_partitioned),
                                 list(self.config.stores))

        def run_batch(result: DataFrame, batch_id: int) -> None:
            before = metrics_delta(accumulator.value, {})
            placement = None
            if placed:
                placement = self.placement_plan(result.sparkSession)
                result = self.transform(result, batch_id=batch_id, placement=placement)
            if output is None:
                result.write.format("noop").mode("overwrite").save()
            else:
                from pyspark import StorageLevel

                result = result.persist(StorageLevel.MEMORY_AND_DISK)
                try:
                    result.count()
                    output(result, batch_id)
                finally:
                    result.unpersist()
            if placement is not None:
                self.placement.record(placement.report.value)
                self.follow_standbys(result.sparkSession, batch_id)
            self.batch_metrics[batch_id] = batch_progress(metrics_delta(accumulator.value, before))
            for old in sorted(self.batch_metrics)[:-KEPT_BATCH_METRICS]:
                del self.batch_metrics[old]

        writer = plan.writeStream.foreachBatch(run_batch).option("checkpointLocation", checkpoint_location)
        writer = writer.queryName(f"localstate-{self.config.job_name}")
        if trigger:
            writer = writer.trigger(**trigger)
        return writer.start()


_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,")


def spark_session(master: str = "local[*]", app_name: str = "localstate", **conf: Any) -> SparkSession:
    """A SparkSession for localstate jobs, with sane local defaults.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` (unless set), makes executors use this Python
    (``PYSPARK_PYTHON``), binds the driver to 127.0.0.1, disables the UI, uses UTC and
    Arrow. ``conf`` entries (Spark keys, e.g. ``**{"spark.sql.shuffle.partitions": "8"}``)
    override the defaults. For ``local-cluster[n,c,m]`` it waits (up to 120 s) until
    all ``n`` executors have registered.
    """
    require_pyspark(RUNNER_PYSPARK, "the localstate Spark runner")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    defaults: dict[str, Any] = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "50000",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # A task that failed on an executor (e.g. its state dir is unusable) is retried on
        # another one, and an executor where tasks keep failing is left out for a while
        # (placement proposes only executors Spark has not excluded): without it a retry
        # goes back to the executor its state preferred, and fails there again.
        "spark.excludeOnFailure.enabled": "true",
    }
    match = _LOCAL_CLUSTER.match(master)
    if match:
        defaults.update(one_host_exclusion(int(match.group(1)), int(conf.get("spark.task.maxFailures", 4))))
    defaults.update({k: str(v) for k, v in conf.items()})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in defaults.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if match:
        wait_for_executors(spark, int(match.group(1)))
    return spark


def one_host_exclusion(executors: int, max_failures: int = 4) -> dict[str, str]:
    """Spark settings for a cluster whose ``executors`` all run on one host (``local-cluster``,
    a test's standalone workers): exclude a failing executor, never the host, or two failures
    of one task would leave it nowhere to run. Spark wants a task's attempts per host below
    ``spark.task.maxFailures`` (``max_failures``)."""
    return {"spark.excludeOnFailure.task.maxTaskAttemptsPerNode": str(max(1, max_failures - 1)),
            "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": str(executors + 1),
            "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": str(executors + 1)}


def wait_for_executors(spark: SparkSession, count: int, timeout_s: float = 120.0) -> None:
    """Block until ``count`` executors have registered with ``spark``'s driver."""
    sc = spark.sparkContext._jsc.sc()  # noqa: SLF001 - the status API is JVM-only
    deadline = time.monotonic() + timeout_s
    while True:
        registered = sc.getExecutorMemoryStatus().size() - 1  # the driver is listed too
        if registered >= count:
            return
        if time.monotonic() >= deadline:
            raise LocalStateError(
                f"only {registered} of {count} Spark executors registered within {timeout_s:.0f}s; "
                "check the executor logs under $SPARK_HOME/work or the memory given to local-cluster"
            )
        time.sleep(0.25)
