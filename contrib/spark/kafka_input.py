"""Kafka through Spark's own connector (``format("kafka")``, ``spark-sql-kafka-0-10``) as
the input of a :class:`~localstate.contrib.spark.StatefulJob`.

* :func:`kafka_connector_package` — the connector's Maven coordinate for a Spark version
  (``spark.jars.packages``); :func:`require_kafka_connector` — a clear error naming it when
  the session lacks the connector; :func:`kafka_stream` — ``spark.readStream.format("kafka")``
  after that check.
* :func:`kafka_json` — the connector's rows (``key``/``value`` binary, ``topic``,
  ``partition``, ``offset``, ``timestamp``) → the JSON values parsed into columns, with the
  parser of the ``localstate-kafka`` source (:func:`~localstate.contrib.spark.json_policy.read_json_records`:
  the same ``mode`` and error messages), keeping the ``partition`` column.
* The **co-partitioned path** (``run_stream(..., co_partitioned=True)``): the topic is
  already partitioned by the job's key, so each Spark partition of the Kafka source (one
  topic partition) runs the task of that number with no shuffle. Spark's checkpoint holds
  the offsets; each task commits per micro-batch as on the shuffled path. What it needs,
  checked before the query starts (:func:`check_co_partitioned`): one topic, subscribed by
  name, with exactly ``job.partitions`` partitions; no ``minPartitions`` or
  ``maxRecordsPerPartition`` (they split a topic partition over several Spark tasks: two
  writers of one task); only row-wise steps (select, filter, :func:`kafka_json`) between
  the source and the job; no ``timer_interval_ms``. Each row is checked in the JVM to be in
  the topic partition ``pmod(hash(key), N)`` — the task the shuffled path gives its key
  (:mod:`localstate.partitioning`) — so the producer must choose the partition itself:
  ``producer.produce(topic, value, key, partition=task_for(key, N))``
  (:func:`localstate.partitioning.task_for`); Kafka's default partitioner (murmur2) puts
  keys elsewhere. A task runs, and commits, only in micro-batches where its topic partition
  has records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate import ConfigError, LocalStateError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from .runner import StatefulJob, TaskRun

__all__ = [
    "KAFKA_PARTITION_COLUMN",
    "KafkaConnectorMissing",
    "kafka_connector_package",
    "require_kafka_connector",
    "kafka_stream",
    "kafka_json",
    "check_co_partitioned",
]

KAFKA_PARTITION_COLUMN = "partition"
"""The connector's column holding each row's topic partition."""

CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

PUBLISHED_CONNECTOR = {"4.3.0": "4.2.0"}
"""PySpark releases whose JVM artifacts are not on Maven Central (checked 2026-11-27) → the
connector release that is, and that runs on them (the tests run it)."""

_ROW_WISE = frozenset({"Project", "Filter", "MapInArrow", "PythonMapInArrow", "MapInPandas", "SubqueryAlias",
                       "EventTimeWatermark"})
"""Logical plan steps that keep every row in its Spark partition (allowed between the Kafka
source and a co-partitioned job)."""
_SPLITTING = ("minPartitions", "maxRecordsPerPartition")
_BAD = "__localstate_bad_record"


class KafkaConnectorMissing(LocalStateError):
    """The Spark session has no ``spark-sql-kafka-0-10`` connector on its classpath."""


def kafka_connector_package(spark_version: str | None = None) -> str:
    """The Maven coordinate of Spark's Kafka connector for ``spark_version`` (default: the
    installed PySpark), for ``spark.jars.packages``: Scala 2.12 for Spark 3, 2.13 for 4."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    version = PUBLISHED_CONNECTOR.get(spark_version, spark_version)
    scala = "2.12" if version.startswith("3.") else "2.13"
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"


def require_kafka_connector(spark: SparkSession) -> None:
    """Raise :class:`KafkaConnectorMissing` naming the fix unless ``spark`` can load the
    connector (``format("kafka")``)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - the classpath is the JVM's
    assert jvm is not None, "a SparkContext without its JVM"
    try:
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(CONNECTOR_CLASS, False, loader)
    except Exception:
        package = kafka_connector_package(spark.version)
        raise KafkaConnectorMissing(
            f"this Spark session has no Kafka connector ({CONNECTOR_CLASS} is not on its classpath), so "
            f'format("kafka") cannot be read. Start the session with it: spark.jars.packages={package} '
            f'(e.g. spark_session(**{{"spark.jars.packages": "{package}"}})), or spark.jars naming its jar and '
            "its dependencies (kafka-clients, commons-pool2, spark-token-provider-kafka-0-10); or read the "
            'topic with localstate\'s own source, format("localstate-kafka")'
        ) from None


def kafka_stream(spark: SparkSession, bootstrap_servers: str, topic: str, **options: Any) -> DataFrame:
    """``spark.readStream.format("kafka")`` subscribed to ``topic`` from the earliest offset
    (``options``, e.g. ``maxOffsetsPerTrigger=10000`` or ``startingOffsets="latest"``, are
    the connector's; ``kafka.``-prefixed ones go to its consumer), after
    :func:`require_kafka_connector`."""
    require_kafka_connector(spark)
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def kafka_json(df: DataFrame, schema: StructType | str, *, mode: str = "FAILFAST",
               keep: Sequence[str] = (KAFKA_PARTITION_COLUMN,)) -> DataFrame:
    """The connector's rows with their JSON ``value`` parsed into ``schema``'s columns, plus
    the connector columns ``keep`` (default the topic partition, which the co-partitioned
    path needs). Tombstones (null values) carry no record and are skipped. ``mode``:
    ``FAILFAST`` (default: the first bad record stops the query with an error naming its
    topic, partition and offset), ``PERMISSIVE`` or ``DROPMALFORMED``, as the
    ``localstate-kafka`` source (:mod:`localstate.contrib.spark.json_policy`). Rows stay in
    their Spark partition (``mapInArrow``, no shuffle)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType as _StructType

    from .json_policy import JsonPolicy
    from .runner import _to_struct

    struct = _to_struct(schema)
    policy = JsonPolicy.from_options({"mode": mode}, "kafka_json")
    missing = [c for c in ("value", "topic", "partition", "offset", *keep) if c not in df.columns]
    if missing:
        raise ConfigError(f"kafka_json: the input lacks the connector column(s) {missing} (columns: "
                          f"{', '.join(df.columns)}); give it the rows of format(\"kafka\")")
    clash = [c for c in keep if c in struct.names]
    if clash:
        raise ConfigError(f"kafka_json: kept column(s) {clash} are also fields of the schema; rename the field "
                          "or keep fewer connector columns")
    out = _StructType([*struct.fields, *(df.schema[c] for c in keep)])
    parse_schema = to_arrow_schema(struct)
    keep = tuple(keep)

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            table = _parse_values(batch, parse_schema, policy, keep)
            if table.num_rows:
                yield from table.to_batches()

    return df.select(*dict.fromkeys(["value", "topic", "partition", "offset", *keep])).mapInArrow(parse, out)


def _parse_values(batch: pa.RecordBatch, schema: pa.Schema, policy: Any, keep: tuple[str, ...]) -> pa.Table:
    """One batch of connector rows → the parsed values plus the ``keep`` columns, row-aligned."""
    from .json_policy import JsonPolicy, read_json_records

    values = batch.column("value")
    if values.null_count:
        batch = batch.filter(pc.is_valid(values))
        values = batch.column("value")
    n = batch.num_rows
    # DROPMALFORMED is parsed as PERMISSIVE with a marker column, so the dropped records can be
    # dropped from the kept columns too.
    dropping = policy.mode == "DROPMALFORMED"
    parse_schema = schema.append(pa.field(_BAD, pa.string())) if dropping else schema
    parse_policy = JsonPolicy("PERMISSIVE", _BAD) if dropping else policy

    def locate(i: int) -> str:
        return (f"topic {batch.column('topic')[i].as_py()!r} partition {batch.column('partition')[i].as_py()} "
                f"offset {batch.column('offset')[i].as_py()}")

    table = parse_schema.empty_table()
    if n:
        # One newline-separated blob: the vectorised parse; a value holding a newline (or an
        # empty one) changes the record count, and then every value is parsed as a record.
        blob = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), values), b"\n")[0].as_py()
        table = read_json_records(blob, parse_schema, parse_policy, locate, "kafka_json")
        if table.num_rows != n:
            table = read_json_records(values.to_pylist(), parse_schema, parse_policy, locate, "kafka_json")
    if dropping:
        good = pc.is_null(table.column(_BAD))
        table = table.filter(good).drop_columns([_BAD])
        batch = batch.filter(good)
    for name in keep:
        table = table.append_column(name, batch.column(name))
    return table


# -- the co-partitioned path ------------------------------------------------------------------

def _children(node: Any) -> list[Any]:
    seq = node.children()
    return [seq.apply(i) for i in range(seq.size())]


def _kafka_source(job: StatefulJob, df: DataFrame) -> Any:
    """The Kafka source relation of ``df``'s analyzed plan; a ConfigError unless every step
    above it is row-wise and it is the only leaf."""
    name = job.config.job_name
    node = df._jdf.queryExecution().analyzed()  # noqa: SLF001 - the plan is JVM-only
    while True:
        kind = node.getClass().getSimpleName()
        children = _children(node)
        if not children:
            break
        if kind not in _ROW_WISE or len(children) != 1:
            raise ConfigError(
                f"job {name!r}: co_partitioned=True runs each Spark partition of the Kafka source as the task "
                f"of its topic partition, but the input has a {kind} step between the source and the job, which "
                "can move rows between Spark partitions; use only row-wise steps (select, filter, kafka_json), "
                "or the shuffled path (co_partitioned=False)"
            )
        node = children[0]
    source = str(node.sourceName()) if hasattr(node, "sourceName") else ""
    if source != "kafka":
        raise ConfigError(f"job {name!r}: co_partitioned=True needs the input read by Spark's Kafka connector "
                          f"(format(\"kafka\")); its source is {source or kind!r}")
    return node


def check_co_partitioned(job: StatefulJob, df: DataFrame, timer_interval_ms: int | None = None) -> None:
    """Refuse, before the query starts, a co-partitioned run that could not be exact (see
    the module docstring); each reason is a :class:`ConfigError` naming the fix."""
    name = job.config.job_name
    if timer_interval_ms is not None:
        raise ConfigError(f"job {name!r}: co_partitioned=True runs a task only when its topic partition has "
                          "records, so timers without input (timer_interval_ms) cannot fire; use the shuffled path")
    if job.spark_tasks != job.num_tasks:
        raise ConfigError(f"job {name!r}: co_partitioned=True runs one Spark task per topic partition; leave "
                          f"spark_tasks unset (it is {job.spark_tasks}, the job has {job.num_tasks} tasks)")
    if KAFKA_PARTITION_COLUMN not in df.columns:
        raise ConfigError(f"job {name!r}: co_partitioned=True needs the connector's {KAFKA_PARTITION_COLUMN!r} "
                          f"column in the input (columns: {', '.join(df.columns)}); keep it (kafka_json keeps it)")
    options = _kafka_source(job, df).extraOptions()
    for option in _SPLITTING:
        if options.get(option) is not None:
            raise ConfigError(
                f"job {name!r}: option {option} = {options.get(option)} of the Kafka source splits a topic "
                "partition over several Spark tasks, which would be two concurrent writers of one task under "
                f"co_partitioned=True; drop the option (co-partitioned reads are as parallel as the topic's "
                "partitions), or use the shuffled path"
            )
    topic = options.get("subscribe")
    if topic is None or "," in str(topic):
        raise ConfigError(
            f"job {name!r}: co_partitioned=True needs one topic subscribed by name (option subscribe=<topic>); "
            f"the source has subscribe={topic!r}, subscribePattern={options.get('subscribePattern')!r}, "
            f"assign={options.get('assign')!r}: partition p of two topics would be two writers of task p"
        )
    count = _topic_partitions(str(options.get("kafka.bootstrap.servers")), str(topic))
    if count != job.num_tasks:
        raise ConfigError(
            f"job {name!r}: topic {topic!r} has {count} partition(s) but the job has {job.num_tasks} tasks "
            f"(job.partitions); co_partitioned=True runs task p on topic partition p, so they must be equal: "
            f"set job.partitions = {count} for new state (or `localstate rescale` existing state), or use the "
            "shuffled path"
        )


def _topic_partitions(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has, through localstate's one Kafka client (it lists
    every topic rather than naming this one, so a missing topic is not auto-created by
    the check)."""
    from localstate.changelog.kafka.client import KafkaClient, KafkaSettings
    from localstate.errors import ChangelogError
    from localstate.options import parse_options

    settings = parse_options(KafkaSettings, {"bootstrap.servers": bootstrap}, "the Kafka source")
    client = KafkaClient(settings, where="the Kafka source", group_id="localstate-co-partitioned-check")
    try:
        return len(client.partitions(topic))
    except ChangelogError as e:
        raise ConfigError(f"{e}; create topic {topic!r} before starting a co-partitioned job") from None
    finally:
        client.close()


def co_partitioned_plan(job: StatefulJob, df: DataFrame, run: TaskRun, struct: StructType) -> DataFrame:
    """``df`` run by the job's tasks without a shuffle: each Spark partition (one topic
    partition ``p``) runs task ``p``. Rows are checked in the JVM to belong to their
    partition's task (``pmod(hash(key), N)``) before any reaches a task."""
    from pyspark.sql import functions as F

    n, key, column = job.num_tasks, job.key, KAFKA_PARTITION_COLUMN
    owner = job.task_column()
    message = F.concat(
        F.lit(f"job {job.config.job_name!r}, co_partitioned=True: key "), F.col(key).cast("string"),
        F.lit(" is in topic partition "), F.col(column).cast("string"), F.lit(" but its task is "),
        owner.cast("string"),
        F.lit(f" = pmod(hash(key), {n}); produce each record to partition "
              "localstate.partitioning.task_for(key, N), not Kafka's default partitioner (murmur2)"),
    )
    checked = df.filter(F.when(owner != F.col(column), F.raise_error(message)).otherwise(F.lit(True)))

    def tasks_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return run_co_partitioned(run, batches, n)

    return checked.mapInArrow(tasks_fn, struct)


def run_co_partitioned(run: TaskRun, batches: Iterator[pa.RecordBatch], tasks: int) -> Iterator[pa.RecordBatch]:
    """Run the task of the one topic partition ``batches`` come from (nothing when they are
    empty). Rows of a second partition, or a partition without a task, are an error before
    they reach a task."""
    from .runner import run_partition

    name = run.config.job_name
    batches = iter(batches)
    for first in batches:
        if first.num_rows:
            break
    else:
        return

    def one_partition(batch: pa.RecordBatch) -> int:
        low, high = pc.min_max(batch.column(KAFKA_PARTITION_COLUMN)).values()
        if low != high:
            raise LocalStateError(f"job {name!r}, co_partitioned=True: one Spark partition holds rows of topic "
                                  f"partitions {low.as_py()} to {high.as_py()}; each must hold one")
        return int(low.as_py())

    p = one_partition(first)
    if not 0 <= p < tasks:
        raise LocalStateError(f"job {name!r}, co_partitioned=True: rows of topic partition {p}, but the job has "
                              f"{tasks} tasks; the topic gained partitions: rescale the job to the topic's "
                              "partition count (`localstate rescale`), or use the shuffled path")

    def checked() -> Iterator[pa.RecordBatch]:
        yield first
        for batch in batches:
            if batch.num_rows and one_partition(batch) != p:
                raise LocalStateError(f"job {name!r}, co_partitioned=True: one Spark partition holds rows of "
                                      f"topic partitions {p} and {one_partition(batch)}; each must hold one")
            yield batch

    yield from run_partition(run, p, checked())

