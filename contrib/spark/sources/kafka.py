"""``localstate-kafka``: a Kafka topic read through localstate's Kafka client
(:mod:`localstate.changelog.kafka.client`: the same end detection, retries and settings
as the Kafka changelog; the JVM Kafka connector is not needed). Columns ``key binary,
value binary, topic string, partition int, offset long, timestamp long`` (ms); with
``format=json`` and a schema, the JSON values are parsed (vectorised, pyarrow) into that
schema instead. Offsets are ``{"<partition>": next offset}``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Message
from localstate.changelog.kafka.client import KafkaClient, KafkaSettings
from localstate.contrib.spark.json_policy import JsonPolicy, read_json_records
from localstate.contrib.spark.sources._base import (
    BatchReader,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    StreamReader,
    StructType,
    _arrow_schema,
    _int_option,
    _json_offsets,
    _option,
    _options,
    _Range,
)
from localstate.errors import ChangelogError, ConfigError
from localstate.options import parse_options

__all__ = ["KafkaSource", "KAFKA_SCHEMA"]

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp long"
_KAFKA_RANGE = 500_000
"""A Kafka partition's offset range is split into input partitions of this many offsets."""
_BATCH_ROWS = 100_000
_key_of, _value_of, _offset_of = Message.key, Message.value, Message.offset


_IDLE_CONSUMERS: dict[tuple[Any, ...], Any] = {}
"""Per Python worker process: one idle assign-only consumer per client configuration.
Spark reuses its Python workers across tasks and micro-batches, and a new consumer costs
a broker connection and a metadata round trip before its first fetch — per input
partition per micro-batch. A consumer holds no group membership or offsets (it
uses ``assign``, and :meth:`KafkaClient.scan` unassigns when done), so the next read can
take it over; one whose read failed or stopped early is closed instead."""


class _KafkaReader:
    """Shared by the batch and the streaming Kafka readers: one client (and one
    consumer, kept between calls on the driver) per reader."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = options = _options(options)
        source = KafkaSource.name()
        self.topic = _option(options, "topic", source)
        servers = options.get("bootstrap.servers") or _option(options, "kafka.bootstrap.servers", source)
        consumer = {k[len("kafka."):]: v for k, v in options.items()
                    if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        timeout_s = float(options.get("timeout.s", "30"))
        settings = parse_options(KafkaSettings, {"bootstrap.servers": servers, "timeout.ms": int(timeout_s * 1000),
                                                 "retries": 0, **{f"consumer.{k}": v for k, v in consumer.items()}},
                                 f"data source {source!r}", pass_through=("producer", "consumer", "topic"))
        self.client = KafkaClient(settings, where=f"data source {source!r} option kafka",
                                  group_id=options.get("group.id", "localstate-spark-source"))
        self._consumer: Any = None
        self.schema = schema
        self.json = options.get("format", "raw") == "json"
        self.min_partitions = _int_option(options, "minPartitions", source, None)
        if self.min_partitions is not None and self.min_partitions < 1:
            raise ConfigError(f"data source {source!r}: option 'minPartitions' = {self.min_partitions}; use an int >= 1")
        self.policy = JsonPolicy.from_options(options, source)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_consumer": None}  # a consumer does not travel to executors

    def consumer(self) -> Any:
        """The driver's consumer for offsets and ends."""
        if self._consumer is None:
            self._consumer = self.client.consumer()
        return self._consumer

    def partitions(self) -> list[int]:
        try:
            return self.client.partitions(self.topic)
        except ChangelogError as e:
            raise ChangelogError(f"{e}; create it or fix option 'topic'") from e

    def ends(self) -> dict[str, int]:
        """The true end of every partition (read to partition EOF, never the high watermark)."""
        consumer = self.consumer()
        return {str(p): self.client.end_offset(consumer, self.topic, p) for p in self.partitions()}

    def starts(self) -> dict[str, int]:
        where = self.options.get("startingOffsets", "earliest")
        if where == "latest":
            return self.ends()
        if where != "earliest":
            return _json_offsets("startingOffsets", where, "'earliest', 'latest'")
        consumer = self.consumer()
        return {str(p): self.client.watermarks(consumer, self.topic, p)[0] for p in self.partitions()}

    def plan(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        """Input partitions of at most ``_KAFKA_RANGE`` offsets; with ``minPartitions`` set
        and fewer ranges than that, they are cut smaller so that at least that many Spark
        tasks read (a topic with fewer partitions than cores then still reads and parses
        its JSON on every core)."""
        spans = {p: (int(start.get(p, 0)), int(stop)) for p, stop in end.items()}
        total = sum(max(0, b - a) for a, b in spans.values())
        size = _KAFKA_RANGE
        if self.min_partitions and total:
            size = max(1, min(size, -(-total // self.min_partitions)))
        out = []
        for p, (begin, stop) in sorted(spans.items(), key=lambda x: int(x[0])):
            for s in range(begin, stop, size):
                out.append(_Range(int(p), s, min(stop, s + size)))
        return out

    def read(self, part: _Range) -> Iterator[pa.RecordBatch]:
        if part.stop <= part.start:
            return
        consumer = self._borrow_consumer()
        finished = False
        try:
            # Each fetched batch is taken apart into its fields at once (C-level maps), and
            # only the fields are kept until an Arrow batch is full: a ``Message`` is an
            # object the cyclic GC tracks, so holding 100k of them made every collection
            # traverse them (and a loop over messages costs more than the fetch and the
            # JSON parse together). JSON needs only the values and, for errors, offsets.
            fields = _Fields(self.json)
            for msgs, _ in self.client.scan(consumer, self.topic, part.part, part.start, part.stop):
                fields.add(msgs)
                if len(fields.offsets) >= _BATCH_ROWS:
                    yield self._batch(part.part, fields)
                    fields = _Fields(self.json)
            if fields.offsets:
                yield self._batch(part.part, fields)
            finished = True
        finally:
            if finished:
                self._return_consumer(consumer)
            else:
                consumer.close()

    def _consumer_key(self) -> tuple[Any, ...]:
        settings = self.client.settings
        return (settings.bootstrap_servers, self.client.group_id, tuple(sorted(settings.consumer.items())))

    def _borrow_consumer(self) -> Any:
        """The worker's idle consumer for this configuration, or a new one."""
        return _IDLE_CONSUMERS.pop(self._consumer_key(), None) or self.client.consumer()

    def _return_consumer(self, consumer: Any) -> None:
        spare = _IDLE_CONSUMERS.pop(self._consumer_key(), None)
        if spare is not None:  # two reads of one worker overlapped: keep one consumer
            spare.close()
        _IDLE_CONSUMERS[self._consumer_key()] = consumer

    def _batch(self, partition: int, fields: _Fields) -> pa.RecordBatch:
        values, offsets = fields.values, fields.offsets
        if self.json:
            schema = _arrow_schema(self.schema)
            if None in values:  # tombstones carry no record
                offsets = [o for o, v in zip(offsets, values) if v is not None]
                values = [v for v in values if v is not None]
            table = read_json_records(
                values, schema, self.policy,
                lambda i: f"topic {self.topic!r} partition {partition} offset {offsets[i]}", KafkaSource.name(),
            )
            return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema)
        n = len(values)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(fields.keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([self.topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(fields.timestamps, pa.int64()),
            ],
            names=["key", "value", "topic", "partition", "offset", "timestamp"],
        )


class _Fields:
    """The fields of fetched messages, column by column (keys and timestamps only for
    the raw columns)."""

    __slots__ = ("raw", "values", "offsets", "keys", "timestamps")

    def __init__(self, json: bool) -> None:
        self.raw = not json
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.timestamps: list[int] = []

    def add(self, msgs: list[Any]) -> None:
        self.values += map(_value_of, msgs)
        self.offsets += map(_offset_of, msgs)
        if self.raw:
            self.keys += map(_key_of, msgs)
            self.timestamps += [m.timestamp()[1] for m in msgs]


class KafkaSource(DataSource):
    """``format("localstate-kafka")``: a Kafka topic through confluent-kafka.

    Options: ``bootstrap.servers`` (or ``kafka.bootstrap.servers``), ``topic``,
    ``startingOffsets`` (``earliest`` (default), ``latest`` or JSON
    ``{"<partition>": offset}``), ``endingOffsets`` (batch only: ``latest`` or JSON),
    ``maxOffsetsPerTrigger`` (streaming), ``minPartitions`` (read each batch with at least
    this many Spark tasks, cutting partitions' offset ranges; as Spark's Kafka source), ``format`` (``raw`` (default) or ``json``:
    parse values into the given ``schema``, with ``mode`` = ``FAILFAST`` (default) /
    ``PERMISSIVE`` / ``DROPMALFORMED`` for bad values, as ``localstate-jsonl``), ``timeout.s``, and ``kafka.<key>`` for
    any consumer setting. Reads with ``isolation.level=read_committed`` and, to find a
    partition's end quickly, ``fetch.wait.max.ms=1`` unless ``kafka.fetch.wait.max.ms`` is given.
    """

    @classmethod
    def name(cls) -> str:
        return "localstate-kafka"

    def schema(self) -> str:
        if self.options.get("format", "raw") == "json":
            raise ConfigError(
                "localstate-kafka with format=json needs the value schema: .schema('ts long, user_id string')"
            )
        return KAFKA_SCHEMA

    def _reader(self, schema: StructType) -> _KafkaReader:
        return _KafkaReader(self.options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        reader = self._reader(schema)
        end_opt = reader.options.get("endingOffsets", "latest")
        end = None if end_opt == "latest" else _json_offsets("endingOffsets", end_opt, "'latest'")
        return BatchReader(reader, end)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = self._reader(schema)
        return StreamReader(reader, _int_option(reader.options, "maxOffsetsPerTrigger", self.name(), None))


