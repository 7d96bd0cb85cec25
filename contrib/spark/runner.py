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

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from localstate import Config, ConfigError
from localstate.kept_open import KEEP_OPEN_S

from .compat import RUNNER_PYSPARK, require_pyspark
from .session import one_host_exclusion, spark_session, wait_for_executors
from .streaming import next_version
from .task import Emitter, StreamTask, TaskContext
from .task_run import (
    EXECUTOR_PLACEHOLDER,
    LOCK_WAIT_S,
    PARTITION_COLUMN,
    TaskRun,
    executor_id,
    executor_state_dir,
    run_partition,
    run_partitions,
    spark_partition_id,
    spark_task_keys,
    task_groups,
)
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
    "EXECUTOR_PLACEHOLDER",
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


@dataclass(frozen=True)
class _PlacedRun:
    """One run's placement: a preferred location per Spark partition, the executor
    proposed per task, and the accumulator the Spark tasks report where they ran to."""

    locations: list[list[str]]
    owners: dict[int, str]
    report: Any
    standbys: dict[int, str]


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

    ``keep_open_s`` (default 30): after a task commits, the Python worker that ran it keeps
    its storage open for that long, and a later run of the task in the same worker (the
    next micro-batch) uses it as it is instead of opening and restoring again
    (:mod:`localstate.kept_open`). Commits are unchanged; another worker or process that
    needs the task makes the idle one close it within milliseconds. 0 closes every task's
    storage after each run. Above 0 a reused worker also freezes what it holds out of the
    collection PySpark runs after every task
    (:func:`~localstate.contrib.spark.task_run.freeze_worker_heap`).

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
        keep_open_s: float = KEEP_OPEN_S,
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
        if isinstance(keep_open_s, bool) or not isinstance(keep_open_s, (int, float)) or not keep_open_s >= 0:
            raise ConfigError(f"job {config.job_name!r}: keep_open_s must be a number of seconds >= 0 (0: close "
                              f"every task's storage after each run), got {keep_open_s!r}")
        self.keep_open_s = float(keep_open_s)
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

    def task_column(self) -> Any:
        """Each row's task as a Spark column: ``pmod(hash(key), N)``, the partition
        ``repartition(N, key)`` sends it to (:mod:`localstate.partitioning`)."""
        from pyspark.sql import functions as F

        return F.pmod(F.hash(self.key), F.lit(self.num_tasks))

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
                      placement.standbys if placement is not None else None, self.key, self.keep_open_s)

        if in_stream_plan:  # ``in_stream_plan``: see TaskRun.in_stream_plan
            from .metrics import with_metrics_column

            struct = with_metrics_column(struct)
        if co_partitioned:
            from .kafka_input import co_partitioned_plan

            return co_partitioned_plan(self, df, run, struct)
        if self.spark_tasks == self.num_tasks:
            def tasks_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                return run_partition(run, spark_partition_id(), batches)

            partitioned = df.repartition(self.num_tasks, self.key)
        else:
            from pyspark.sql import functions as F

            groups = task_groups(self.num_tasks, self.spark_tasks)

            def tasks_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                return run_partitions(run, groups[spark_partition_id()], batches)

            owner = self.task_column()
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
