"""Run a :class:`StreamTask` per Spark partition, with its state in localstate.

A :class:`StatefulJob` repartitions its input by the key column into N partitions
(N = ``job.partitions`` = changelog partitions). Partition ``p`` is task ``p``: on
the executor it opens ``TaskStorage(config, p)`` under ``job.state.dir`` (which
restores the stores from the changelog when the local copy is missing or behind —
as happens when Spark moves the task to another executor), hands the task whole
Arrow record batches (``mapInArrow``), calls ``window`` and commits. The rows the
task emits become the output DataFrame, with the declared schema.

Structured Streaming (:meth:`StatefulJob.run_stream`) uses ``foreachBatch``; the
batch id is the commit version. See :mod:`localstate.contrib.spark.streaming` for
how a re-run batch is applied exactly once.

Executors sharing one file system (``local-cluster``, several executors per host)
share ``job.state.dir`` unless it contains ``{executor}``: each executor then
replaces it with its own id (:func:`executor_id`), so a task that moves finds no
local copy, or a stale one, and restores from the changelog — which must stay
shared (``systems.file.path``). Attempts of one task on different executors are
then kept apart by the changelog partition's single-writer lock, not the state-dir
lock, and a streaming task checks its committed version again once it holds that
lock (see ``_open_for_batch``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pyarrow as pa
from localstate import (
    Config,
    ConfigError,
    KeyValueStore,
    LocalStateError,
    StoreLockedError,
    TaskStorage,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

__all__ = [
    "Emitter",
    "StatefulJob",
    "StreamTask",
    "TaskContext",
    "TaskRun",
    "executor_id",
    "executor_state_dir",
    "run_partition",
    "spark_session",
]

K = TypeVar("K")
V = TypeVar("V")

KEPT_BATCH_METRICS = 100
"""How many micro-batches' state metrics a streaming job keeps on the driver."""

LOCK_WAIT_S = 60.0
"""How long a task waits for its partition's lock (a killed attempt's Python worker
may still be exiting when Spark starts the next attempt)."""


@dataclass
class TaskContext:
    """What :meth:`StreamTask.init` gets: the task's partition and its open stores."""

    partition: int
    partitions: int
    config: Config
    storage: TaskStorage

    @overload
    def store(self, name: str) -> Any: ...
    @overload
    def store(self, name: str, key_type: type[K], value_type: type[V]) -> KeyValueStore[K, V]: ...

    def store(self, name: str, key_type: type | None = None, value_type: type | None = None) -> Any:
        """The store ``name`` of this task (``storage.store(name)``); with types,
        ``context.store("counts", str, int)`` is a checked ``KeyValueStore[str, int]``."""
        return self.storage.store(name, key_type, value_type)  # type: ignore[arg-type]


class Emitter:
    """Collects a task's output rows and hands them out as Arrow batches of ``schema``.

    ``emit(row)`` takes one dict keyed by the output column names (missing keys are
    null), ``emit.rows(rows)`` many, and ``emit.arrow(batch)`` a record batch holding
    (at least) the output columns — the vectorised path. Order is kept across the
    three forms.
    """

    __slots__ = ("schema", "_rows", "_batches")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._rows: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []

    def __call__(self, row: dict[str, Any]) -> None:
        self._rows.append(row)

    def rows(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows.extend(rows)

    def arrow(self, batch: pa.RecordBatch | pa.Table) -> None:
        self._flush_rows()
        if batch.num_rows == 0:
            return
        try:
            table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
            table = table.select(self.schema.names).cast(self.schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise LocalStateError(
                f"emitted Arrow batch with columns {batch.schema} does not fit the job's output "
                f"schema {self.schema}: {e}; emit the output columns with compatible types"
            ) from e
        self._batches.extend(table.to_batches())

    def _flush_rows(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            try:
                self._batches.append(pa.RecordBatch.from_pylist(rows, schema=self.schema))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                raise LocalStateError(
                    f"emitted rows do not fit the job's output schema {self.schema}: {e}; "
                    f"first row: {rows[0]!r}"
                ) from e

    def drain(self) -> list[pa.RecordBatch]:
        """The batches emitted since the last drain (and forget them)."""
        self._flush_rows()
        out, self._batches = self._batches, []
        return out


class StreamTask:
    """A stateful task: one instance per partition run (a Spark task attempt).

    Lifecycle per run: ``init(context)`` → ``process_batch`` per Arrow batch of the
    partition's input → ``window(emit)`` → (the runner commits) → ``close()``.
    Override :meth:`process_batch` for the vectorised path, or only :meth:`process`
    for the per-record convenience (about 20× slower: every row becomes a dict).
    """

    def init(self, context: TaskContext) -> None:
        """Get stores by name (``context.store(name)``) and load task-level state."""

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        """Handle one Arrow batch of input rows; default: :meth:`process` per row."""
        process = self.process
        for record in batch.to_pylist():
            process(record, emit)

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        """Handle one input row (a dict keyed by column name)."""
        raise NotImplementedError(f"{type(self).__name__} must implement process() or process_batch()")

    def window(self, emit: Emitter) -> None:
        """Called at every window/commit boundary: after the partition's last batch of a
        run (batch job) or micro-batch (streaming), before the commit."""

    def close(self) -> None:
        """Release task resources (stores are closed by the runner). Always called."""


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


EXECUTOR_PLACEHOLDER = "{executor}"
_LOG_URL_EXECUTOR = re.compile(r"[?&]executorId=([^&]+)")


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
    """``config`` with ``{executor}`` in ``job.state.dir`` replaced by ``executor``
    (default: :func:`executor_id`); ``config`` itself when there is no placeholder."""
    state_dir = str(config.state_dir)
    if EXECUTOR_PLACEHOLDER not in state_dir:
        return config
    name = (executor if executor is not None else executor_id()).replace(os.sep, "_")
    return config.with_overrides({"job.state.dir": state_dir.replace(EXECUTOR_PLACEHOLDER, name)})


def open_storage(config: Config, partition: int, lock_wait_s: float = LOCK_WAIT_S) -> TaskStorage:
    """``TaskStorage(config, partition)``, retrying while another (dying) attempt holds
    the partition lock, for up to ``lock_wait_s`` seconds."""
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            return TaskStorage(config, partition)
        except StoreLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


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
    from .streaming import stream_position

    config = executor_state_dir(run.config)
    if run.batch_id is None:
        storage = open_storage(config, partition, run.lock_wait_s)
    else:
        storage = _open_for_batch(config, partition, run.batch_id, run.lock_wait_s)
    task: StreamTask | None = None
    try:
        previous = storage.checkpoint
        emit = Emitter(run.output_schema)
        task = run.task()
        task.init(TaskContext(partition, config.partitions, config, storage))
        rows = 0
        process_batch = task.process_batch
        for batch in batches:
            rows += batch.num_rows
            process_batch(batch, emit)
            yield from emit.drain()
        task.window(emit)
        yield from emit.drain()
        if run.batch_id is None:
            before = previous.input_position if previous is not None else None
            done = before.get("rows", 0) if isinstance(before, dict) else 0
            storage.commit({"rows": done + rows})
        else:
            storage.commit(stream_position(run.batch_id, rows, previous), version=run.batch_id)
        if run.metrics is not None:
            from .metrics import task_snapshot

            run.metrics.add(task_snapshot(storage))
    finally:
        try:
            if task is not None:
                task.close()
        finally:
            storage.close()


def _open_for_batch(config: Config, partition: int, batch_id: int, lock_wait_s: float) -> TaskStorage:
    """The partition's storage, opened with a committed version below ``batch_id``.

    :func:`~localstate.contrib.spark.streaming.prepare_version` rolls back a commit of
    ``batch_id`` before the storage is opened; the version is checked again once it is
    open (its locks held), because another attempt of the task — on another executor,
    with its own state dir and lock — may have committed ``batch_id`` while this one
    waited for the changelog lock. Then it is closed, rolled back and opened again.
    """
    from .streaming import prepare_version

    while True:
        prepare_version(config, partition, batch_id, lock_wait_s)
        storage = open_storage(config, partition, lock_wait_s)
        current = storage.checkpoint
        if current is None or current.version < batch_id:
            return storage
        storage.close()


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
        self.config = config
        self.task = task
        self.key = key
        self.num_tasks = n
        self.output_schema = output_schema
        self.lock_wait_s = LOCK_WAIT_S
        self.metrics_accumulator: Any = None
        """Set by :meth:`run_stream`: where the tasks add their state metrics."""
        self.batch_metrics: dict[int, dict[str, Any]] = {}
        """Per micro-batch id or batch-run version (streaming: the last
        :data:`KEPT_BATCH_METRICS`): the state metrics of its tasks, per store (see
        :mod:`localstate.contrib.spark.metrics`)."""

    def _struct(self) -> StructType:
        return _to_struct(self.output_schema)

    def _check_key(self, df: DataFrame) -> None:
        if self.key not in df.columns:
            raise ConfigError(
                f"job {self.config.job_name!r}: key column {self.key!r} is not in the input "
                f"(columns: {', '.join(df.columns)})"
            )

    def transform(self, df: DataFrame, batch_id: int | None = None) -> DataFrame:
        """The lazy output DataFrame of one run over ``df`` (``batch_id``: streaming version).

        Executing it more than once re-runs the tasks: a batch run applies its input
        again; a streaming batch rolls back to ``batch_id - 1`` first (idempotent).
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        self._check_key(df)
        struct = self._struct()
        run = TaskRun(self.config, self.task, to_arrow_schema(struct), batch_id, self.lock_wait_s,
                      self.metrics_accumulator)

        def task_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return run_partition(run, _spark_partition_id(), batches)

        return df.repartition(self.num_tasks, self.key).mapInArrow(task_fn, struct)

    def run(self, df: DataFrame, *, version: int | None = None) -> DataFrame:
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
        """
        from .streaming import committed_batches

        committed = committed_batches(self.config)
        done = {v for v in committed.values()}
        if version is None:
            if len(done) > 1:
                mixed = {p: v for p, v in committed.items()}
                latest = max(v for v in done if v is not None)
                raise LocalStateError(
                    f"job {self.config.job_name!r}: the tasks' committed versions differ ({mixed}): an "
                    f"earlier run (version {latest}) did not finish. Run it again with the same input to "
                    f"complete it: job.run(df, version={latest}); tasks that committed it roll back and "
                    "apply it again, the others apply it once"
                )
            (last,) = done if done else (None,)
            version = 0 if last is None else last + 1
        elif not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ConfigError(f"version must be an int >= 0, got {version!r}")
        from .metrics import StateMetricsParam, batch_progress

        accumulator = df.sparkSession.sparkContext.accumulator({}, StateMetricsParam())
        self.metrics_accumulator = accumulator
        try:
            result = self.transform(df, batch_id=version).localCheckpoint(eager=True)
        finally:
            self.metrics_accumulator = None
        self.batch_metrics[version] = batch_progress(accumulator.value)
        return result

    def run_stream(
        self,
        stream_df: DataFrame,
        *,
        checkpoint_location: str,
        trigger: dict[str, Any] | None = None,
        output: Callable[[DataFrame, int], None] | None = None,
    ) -> StreamingQuery:
        """Start a Structured Streaming query; see :func:`localstate.contrib.spark.streaming.start`."""
        from .streaming import start

        return start(self, stream_df, checkpoint_location=checkpoint_location, trigger=trigger, output=output)


_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,")


def spark_session(master: str = "local[*]", app_name: str = "localstate", **conf: Any) -> SparkSession:
    """A SparkSession for localstate jobs, with sane local defaults.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` (unless set), makes executors use this Python
    (``PYSPARK_PYTHON``), binds the driver to 127.0.0.1, disables the UI, uses UTC and
    Arrow. ``conf`` entries (Spark keys, e.g. ``**{"spark.sql.shuffle.partitions": "8"}``)
    override the defaults. For ``local-cluster[n,c,m]`` it waits (up to 120 s) until
    all ``n`` executors have registered.
    """
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
    }
    defaults.update({k: str(v) for k, v in conf.items()})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in defaults.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    match = _LOCAL_CLUSTER.match(master)
    if match:
        wait_for_executors(spark, int(match.group(1)))
    return spark


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
