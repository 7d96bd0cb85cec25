"""PySpark Python data sources (batch and streaming) for localstate jobs' inputs.

Register them once per session with :func:`register_sources`, then::

    spark.read.format("localstate-kafka").option("bootstrap.servers", "127.0.0.1:9092") \\
        .option("topic", "views").load()
    spark.readStream.format("localstate-jsonl").schema("ts long, user_id string") \\
        .load("/data/views")
    spark.readStream.format("localstate-changelog").option("path", "./changelog") \\
        .option("stream", "pageviews-counts").load()

* ``localstate-kafka`` reads a Kafka topic through confluent-kafka (the JVM Kafka
  connector is not needed). Columns ``key binary, value binary, topic string,
  partition int, offset long, timestamp long`` (ms); with ``format=json`` and a
  schema, the JSON values are parsed (vectorised, pyarrow) into that schema instead.
  Offsets are ``{"<partition>": next offset}``.
* ``localstate-jsonl`` reads a directory of JSON-lines files that are appended to or
  added (files are read in name order; only complete lines count). Offsets are
  ``{"files": {"<name>": byte position}}``.
* ``localstate-changelog`` reads a store's file changelog: columns ``partition int,
  offset long, key binary, value binary`` (null value = tombstone). Offsets are
  ``{"<partition>": next offset}``; with ``job`` and ``store`` options only committed
  records (below the task checkpoint) are read.

Every offset is a plain JSON dict that Spark stores in its checkpoint (offset log);
a micro-batch re-run after a failure reads exactly the same records, as the
exactly-once runner (:mod:`localstate.contrib.spark.streaming`) requires. All readers
produce Arrow record batches (no per-row Python objects on the way into Spark).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from localstate import ChangelogError, ConfigError
from localstate.options import parse_size_bytes

from .compat import SOURCES_PYSPARK, require_pyspark

# Before the imports below fail with a bare ImportError on an older Spark.
require_pyspark(SOURCES_PYSPARK, "the localstate Spark data sources (localstate-kafka, -jsonl, -changelog)")

from pyspark.sql.datasource import (  # noqa: E402
    CaseInsensitiveDict,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType  # noqa: E402

from .json_policy import JsonPolicy, read_json_records  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "KafkaSource",
    "JsonLinesSource",
    "ChangelogSource",
    "register_sources",
    "kafka_end_offsets",
]

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp long"
CHANGELOG_SCHEMA = "partition int, offset long, key binary, value binary"

_CHUNK_BYTES = 32 << 20
"""JSON-lines files are split into input partitions of about this size (at newlines)."""
_KAFKA_RANGE = 500_000
"""A Kafka partition's offset range is split into input partitions of this many offsets."""


def register_sources(spark: SparkSession) -> None:
    """Register ``localstate-kafka``, ``localstate-jsonl``, ``localstate-changelog`` and
    ``localstate-state`` (:mod:`localstate.contrib.spark.state_source`)."""
    from .state_source import StateSource

    for source in (KafkaSource, JsonLinesSource, ChangelogSource, StateSource):
        spark.dataSource.register(source)


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def _options(options: Mapping[str, str]) -> CaseInsensitiveDict:
    """The reader's options, looked up case-insensitively as Spark passes them: Spark
    lower-cases option names, so a plain ``dict`` of them would miss ``startingOffsets``."""
    return CaseInsensitiveDict(options)


def _option(options: Mapping[str, str], name: str, source: str, default: str | None = None) -> str:
    value = options.get(name, default)
    if value is None or value == "":
        raise ConfigError(f"data source {source!r} needs option {name!r} (.option({name!r}, ...))")
    return value


def _int_option(options: Mapping[str, str], name: str, source: str, default: int | None) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"data source {source!r}: option {name!r} = {value!r} is not an integer") from None


def _size_option(options: Mapping[str, str], name: str, source: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        return parse_size_bytes(value, name)
    except ConfigError as e:
        raise ConfigError(f"data source {source!r}: option {e}") from None


@dataclass
class _Range(InputPartition):
    """One input partition: records ``[start, stop)`` of ``part`` (a Kafka/changelog
    partition number, or a file name with byte positions)."""

    part: Any
    start: int
    stop: int


# -- Kafka -------------------------------------------------------------------------------------------
def _kafka_conf(options: Mapping[str, str], source: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": options.get("bootstrap.servers") or _option(options, "kafka.bootstrap.servers", source),
        "group.id": options.get("group.id", "localstate-spark-source"),
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 10,
        "auto.offset.reset": "earliest",
    }
    for k, v in options.items():
        if k.startswith("kafka.") and k != "kafka.bootstrap.servers":
            conf[k[len("kafka."):]] = v
    return conf


def _kafka_partitions(consumer: Any, topic: str, timeout: float) -> list[int]:
    meta = consumer.list_topics(topic, timeout=timeout)
    tmeta = meta.topics.get(topic)
    if tmeta is None or tmeta.error is not None or not tmeta.partitions:
        why = tmeta.error if tmeta is not None and tmeta.error is not None else "no such topic"
        raise ChangelogError(f"Kafka topic {topic!r} is not readable ({why}); create it or fix option 'topic'")
    return sorted(tmeta.partitions)


def kafka_end_offsets(consumer: Any, topic: str, partitions: Sequence[int], timeout: float = 10.0) -> dict[int, int]:
    """The true end offset (last record's offset + 1) of each partition.

    The high watermark alone is not trusted (some brokers, e.g. tansu, report the last
    batch's base offset + 1): the last batch is read to its end of partition.
    """
    from confluent_kafka import TopicPartition

    out: dict[int, int] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
        end = high
        if high > low:
            consumer.assign([TopicPartition(topic, p, max(low, high - 1))])
            for msg in _consume_until_eof(consumer, timeout):
                end = max(end, msg.offset() + 1)
        out[p] = max(end, low)
    return out


def _consume_until_eof(consumer: Any, timeout: float, stop: int | None = None) -> Iterator[Any]:
    """Messages of the one assigned partition until its EOF (or offset ``stop``)."""
    from confluent_kafka import KafkaError, KafkaException

    idle = 0.0
    while True:
        msgs = consumer.consume(10_000, 0.5)
        if not msgs:
            idle += 0.5
            if idle >= timeout:
                raise ChangelogError(f"no data and no end-of-partition from Kafka within {timeout:.0f}s")
            continue
        idle = 0.0
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(err)
            if stop is not None and msg.offset() >= stop:
                return
            yield msg
            if stop is not None and msg.offset() + 1 >= stop:
                return


def _json_offsets(option: str, value: str, keywords: str) -> dict[str, int]:
    """Option ``option`` given as JSON ``{"<partition>": offset}``; else a ConfigError
    naming the option and the accepted ``keywords``."""
    try:
        return {str(p): int(o) for p, o in json.loads(value).items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(
            f"localstate-kafka: {option} = {value!r}; use {keywords} or a JSON object " '{"<partition>": offset}'
        ) from None


class _KafkaReader:
    """Shared by the batch and the streaming Kafka readers."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = options = _options(options)
        self.topic = _option(options, "topic", KafkaSource.name())
        self.conf = _kafka_conf(options, KafkaSource.name())
        self.timeout = float(options.get("timeout.s", "30"))
        self.schema = schema
        self.json = options.get("format", "raw") == "json"
        self.policy = JsonPolicy.from_options(options, KafkaSource.name())

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(self.conf)

    def ends(self) -> dict[str, int]:
        consumer = self._consumer()
        try:
            parts = _kafka_partitions(consumer, self.topic, self.timeout)
            return {str(p): o for p, o in kafka_end_offsets(consumer, self.topic, parts, self.timeout).items()}
        finally:
            consumer.close()

    def starts(self) -> dict[str, int]:
        from confluent_kafka import TopicPartition

        where = self.options.get("startingOffsets", "earliest")
        if where == "latest":
            return self.ends()
        if where != "earliest":
            return _json_offsets("startingOffsets", where, "'earliest', 'latest'")
        consumer = self._consumer()
        try:
            parts = _kafka_partitions(consumer, self.topic, self.timeout)
            return {
                str(p): consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout)[0]
                for p in parts
            }
        finally:
            consumer.close()

    def plan(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        out = []
        for p, stop in sorted(end.items(), key=lambda x: int(x[0])):
            begin = int(start.get(p, 0))
            for s in range(begin, int(stop), _KAFKA_RANGE):
                out.append(_Range(int(p), s, min(int(stop), s + _KAFKA_RANGE)))
        return out

    def read(self, part: _Range) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import TopicPartition

        if part.stop <= part.start:
            return
        consumer = self._consumer()
        try:
            consumer.assign([TopicPartition(self.topic, part.part, part.start)])
            keys: list[bytes | None] = []
            values: list[bytes | None] = []
            offsets: list[int] = []
            stamps: list[int] = []
            for msg in _consume_until_eof(consumer, self.timeout, part.stop):
                keys.append(msg.key())
                values.append(msg.value())
                offsets.append(msg.offset())
                stamps.append(msg.timestamp()[1])
                if len(offsets) >= 100_000:
                    yield self._batch(part.part, keys, values, offsets, stamps)
                    keys, values, offsets, stamps = [], [], [], []
            if offsets:
                yield self._batch(part.part, keys, values, offsets, stamps)
        finally:
            consumer.close()

    def _batch(self, partition: int, keys: list, values: list, offsets: list, stamps: list) -> pa.RecordBatch:
        if self.json:

            schema = _arrow_schema(self.schema)
            present = [(o, v) for o, v in zip(offsets, values) if v is not None]
            table = read_json_records(
                [v for _, v in present], schema, self.policy,
                lambda i: f"topic {self.topic!r} partition {partition} offset {present[i][0]}", KafkaSource.name(),
            )
            return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema)
        n = len(offsets)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([self.topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(stamps, pa.int64()),
            ],
            names=["key", "value", "topic", "partition", "offset", "timestamp"],
        )


class _KafkaBatchReader(DataSourceReader):
    def __init__(self, reader: _KafkaReader) -> None:
        self.reader = reader

    def partitions(self) -> Sequence[InputPartition]:
        end_opt = self.reader.options.get("endingOffsets", "latest")
        end = self.reader.ends() if end_opt == "latest" else _json_offsets("endingOffsets", end_opt, "'latest'")
        return self.reader.plan(self.reader.starts(), end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.reader.read(partition)


def _limit_rows(start: dict[str, int], end: dict[str, int], max_rows: int) -> dict[str, int]:
    """Cap the range ``start → end`` at ``max_rows`` offsets in total, fairly per partition."""
    pending = {p: max(0, end[p] - start.get(p, 0)) for p in end}
    total = sum(pending.values())
    if total <= max_rows:
        return end
    out = {}
    budget = max_rows
    for p in sorted(pending, key=int):
        take = min(pending[p], max(1, pending[p] * max_rows // total), budget)
        budget -= take
        out[p] = start.get(p, 0) + take
    return out


def _cap(end: dict[str, Any], target: dict[str, Any] | None) -> dict[str, Any]:
    """``end`` no further than ``target`` (the ``availableNow`` snapshot), per partition."""
    if target is None:
        return end
    return {p: min(int(o), int(target.get(p, o))) for p, o in end.items()}


class _KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, reader: _KafkaReader) -> None:
        self.reader = reader
        self.max_rows = _int_option(reader.options, "maxOffsetsPerTrigger", KafkaSource.name(), None)
        self.target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """``availableNow``: read what the topic holds now, in micro-batches of at most
        ``maxOffsetsPerTrigger`` offsets, then stop."""
        self.target = self.reader.ends()

    def initialOffset(self) -> dict:
        return self.reader.starts()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = _cap(self.reader.ends(), self.target)
        end = {p: max(o, int(start.get(p, 0))) for p, o in end.items()}
        if isinstance(limit, ReadMaxRows):
            end = _limit_rows({p: int(o) for p, o in start.items()}, end, limit.max_rows)
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.reader.plan(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.reader.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: positions live in Spark's checkpoint, not in a consumer group."""


class KafkaSource(DataSource):
    """``format("localstate-kafka")``: a Kafka topic through confluent-kafka.

    Options: ``bootstrap.servers`` (or ``kafka.bootstrap.servers``), ``topic``,
    ``startingOffsets`` (``earliest`` (default), ``latest`` or JSON
    ``{"<partition>": offset}``), ``endingOffsets`` (batch only: ``latest`` or JSON),
    ``maxOffsetsPerTrigger`` (streaming), ``format`` (``raw`` (default) or ``json``:
    parse values into the given ``schema``, with ``mode`` = ``FAILFAST`` (default) /
    ``PERMISSIVE`` / ``DROPMALFORMED`` for bad values, as ``localstate-jsonl``), ``timeout.s``, and ``kafka.<key>`` for
    any consumer setting. Reads with ``isolation.level=read_committed``.
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
        return _KafkaBatchReader(self._reader(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _KafkaStreamReader(self._reader(schema))


# -- JSON lines --------------------------------------------------------------------------------------
def _jsonl_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"localstate-jsonl: path {root} does not exist; point option 'path' at a directory")
    return sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith((".", "_")))


def _complete_size(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline (a line being written is
    not read until it is complete)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                return pos - step + nl + 1
            pos -= step
        return 0


def _split_at_newlines(path: Path, start: int, stop: int) -> list[tuple[int, int]]:
    if stop - start <= _CHUNK_BYTES:
        return [(start, stop)]
    out = []
    with open(path, "rb") as f:
        pos = start
        while pos < stop:
            cut = pos + _CHUNK_BYTES
            if cut >= stop:
                out.append((pos, stop))
                break
            f.seek(cut)
            rest = f.readline()
            cut = min(stop, cut + len(rest))
            out.append((pos, cut))
            pos = cut
    return out


class _JsonLinesReader(DataSourceReader):
    def __init__(self, root: Path, schema: StructType, options: Mapping[str, str] | None = None) -> None:
        options = _options(options or {})
        self.root = root
        self.schema = schema
        self.policy = JsonPolicy.from_options(options, JsonLinesSource.name())
        self.max_files = _int_option(options, "maxFilesPerTrigger", JsonLinesSource.name(), None)
        self.max_bytes = _size_option(options, "maxBytesPerTrigger", JsonLinesSource.name())
        for name, value in (("maxFilesPerTrigger", self.max_files), ("maxBytesPerTrigger", self.max_bytes)):
            if value is not None and value < 1:
                raise ConfigError(f"data source {JsonLinesSource.name()!r}: option {name} = {value}: must be >= 1")

    def ends(self) -> dict[str, dict[str, int]]:
        return {"files": {p.name: _complete_size(p) for p in _jsonl_files(self.root)}}

    def plan(self, start: dict, end: dict) -> list[_Range]:
        done = start.get("files", {})
        out = []
        for name, stop in sorted(end.get("files", {}).items()):
            begin = int(done.get(name, 0))
            path = self.root / name if self.root.is_dir() else self.root
            for s, e in _split_at_newlines(path, begin, int(stop)) if stop > begin else []:
                out.append(_Range(name, s, e))
        return out

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan({}, self.ends())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:

        assert isinstance(partition, _Range)
        path = self.root / partition.part if self.root.is_dir() else self.root
        with open(path, "rb") as f:
            f.seek(partition.start)
            data = f.read(partition.stop - partition.start)
        if not data.strip():
            return
        schema = _arrow_schema(self.schema)

        def locate(i: int) -> str:
            with open(path, "rb") as f:
                before = f.read(partition.start).count(b"\n")
            return f"{path}:{before + i + 1}"

        table = read_json_records(data, schema, self.policy, locate, JsonLinesSource.name())
        yield from table.select(schema.names).cast(schema).to_batches()

    def limit(self, start: dict, end: dict) -> dict:
        """``end`` cut to at most ``maxFilesPerTrigger`` files with new data and about
        ``maxBytesPerTrigger`` new bytes (cut after a whole line; at least one line, so a
        stream always moves), in file name order."""
        if self.max_files is None and self.max_bytes is None:
            return end
        done = start.get("files", {})
        files = dict(done)
        budget, taken = self.max_bytes, 0
        for name, stop in sorted(end.get("files", {}).items()):
            begin = int(done.get(name, 0))
            if stop <= begin:
                files[name] = stop
                continue
            if self.max_files is not None and taken >= self.max_files or budget is not None and budget <= 0:
                break
            taken += 1
            if budget is not None and stop - begin > budget:
                path = self.root / name if self.root.is_dir() else self.root
                with open(path, "rb") as f:
                    f.seek(begin + budget - 1)
                    rest = f.readline()  # up to the end of the line the budget falls in
                stop = min(stop, begin + budget - 1 + len(rest))
            files[name] = stop
            if budget is not None:
                budget -= stop - begin
        return {"files": files}


class _JsonLinesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, reader: _JsonLinesReader) -> None:
        self.reader = reader
        self.target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """``availableNow``: the complete lines present now, then stop."""
        self.target = self.reader.ends()["files"]

    def initialOffset(self) -> dict:
        return {"files": {}}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self.reader.ends()
        if self.target is not None:
            end["files"] = {n: min(o, self.target[n]) for n, o in end["files"].items() if n in self.target}
        done = start.get("files", {})
        for name, pos in done.items():  # never move backwards (a file that was truncated)
            end["files"][name] = max(int(pos), end["files"].get(name, 0))
        return self.reader.limit(start, end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.reader.plan(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reader.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: files are left in place."""


class JsonLinesSource(DataSource):
    """``format("localstate-jsonl")``: JSON-lines files in a directory (``path``).

    Files are read in name order; new files and appended lines are picked up by the
    streaming reader; a partial last line waits until it is complete. Give the schema
    (``.schema("ts long, user_id string")``); without one it is inferred from the first
    64 KiB of the first file.

    Options: ``mode`` (``FAILFAST`` (default), ``PERMISSIVE``, ``DROPMALFORMED``; see
    :mod:`localstate.contrib.spark.json_policy`), ``columnNameOfCorruptRecord``,
    ``maxFilesPerTrigger`` and ``maxBytesPerTrigger`` (streaming: new files / new bytes per
    micro-batch, bytes with units such as ``64MB``; a batch ends after a whole line).
    """

    @classmethod
    def name(cls) -> str:
        return "localstate-jsonl"

    def _root(self) -> Path:
        return Path(_option(self.options, "path", self.name()))

    def schema(self) -> StructType:
        from pyarrow import json as pajson
        from pyspark.sql.pandas.types import from_arrow_schema

        files = _jsonl_files(self._root())
        if not files:
            raise ConfigError(
                f"localstate-jsonl: no files under {self._root()} to infer a schema from; give one with .schema(...)"
            )
        with open(files[0], "rb") as f:
            head = f.read(65536)
        head = head[: head.rfind(b"\n") + 1]
        return from_arrow_schema(pajson.read_json(io.BytesIO(head)).schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _JsonLinesReader(self._root(), schema, self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _JsonLinesStreamReader(_JsonLinesReader(self._root(), schema, self.options))


# -- localstate's file changelog -----------------------------------------------------------------------
class _ChangelogReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        options = _options(options)
        source = ChangelogSource.name()
        self.root = Path(_option(options, "path", source))
        self.stream = _option(options, "stream", source)
        self.job = options.get("job")
        self.store = options.get("store")
        if (self.job is None) != (self.store is None):
            raise ConfigError(f"{source}: give both 'job' and 'store' (to read committed records only) or neither")
        meta = self.root / self.stream / "stream.json"
        try:
            self.partitions_count = int(json.loads(meta.read_text())["partitions"])
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(
                f"{source}: {meta} is missing or unreadable ({e}); is {self.root} a localstate file "
                f"changelog (systems.file.path) with stream {self.stream!r}?"
            ) from e

    def _partition(self, p: int) -> Any:
        from localstate.changelog.file import FileChangelogPartition

        return FileChangelogPartition(self.root / self.stream / str(p), stream=self.stream, partition=p, readonly=True)

    def ends(self) -> dict[str, int]:
        if self.job is not None:
            from localstate.changelog.file import FileCheckpointStore

            store = FileCheckpointStore(self.root / "_checkpoints")
            out = {}
            for p in range(self.partitions_count):
                ckpt = store.read(self.job, p)
                out[str(p)] = int(ckpt.offsets.get(self.store, 0)) if ckpt is not None else 0
            return out
        out = {}
        for p in range(self.partitions_count):
            part = self._partition(p)
            try:
                out[str(p)] = part.end_offset()
            finally:
                part.close()
        return out

    def plan(self, start: dict, end: dict) -> list[_Range]:
        return [
            _Range(int(p), int(start.get(p, 0)), int(stop))
            for p, stop in sorted(end.items(), key=lambda x: int(x[0]))
            if int(stop) > int(start.get(p, 0))
        ]

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan({}, self.ends())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        part = self._partition(partition.part)
        try:
            offsets: list[int] = []
            keys: list[bytes] = []
            values: list[bytes | None] = []
            for o, k, v in part.read_with_offsets(partition.start, partition.stop):
                offsets.append(o)
                keys.append(k)
                values.append(v)
                if len(offsets) >= 100_000:
                    yield self._batch(partition.part, offsets, keys, values)
                    offsets, keys, values = [], [], []
            if offsets:
                yield self._batch(partition.part, offsets, keys, values)
        finally:
            part.close()

    @staticmethod
    def _batch(p: int, offsets: list[int], keys: list[bytes], values: list[bytes | None]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [
                pa.array([p] * len(offsets), pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
            ],
            names=["partition", "offset", "key", "value"],
        )


class _ChangelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, reader: _ChangelogReader) -> None:
        self.reader = reader
        self.target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """``availableNow``: the records present (or committed) now, then stop."""
        self.target = self.reader.ends()

    def initialOffset(self) -> dict:
        return {str(p): 0 for p in range(self.reader.partitions_count)}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = _cap(self.reader.ends(), self.target)
        return {p: max(o, int(start.get(p, 0))) for p, o in end.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.reader.plan(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reader.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the changelog is owned by its job."""


class ChangelogSource(DataSource):
    """``format("localstate-changelog")``: a store's file changelog as a table/stream.

    Options: ``path`` (``systems.file.path``), ``stream`` (the changelog stream, as in
    ``stores.<s>.changelog = file.<stream>``), and optionally ``job`` + ``store`` to
    read only committed records (below the task checkpoints); without them, records of
    a commit in progress may be read.
    """

    @classmethod
    def name(cls) -> str:
        return "localstate-changelog"

    def schema(self) -> str:
        return CHANGELOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ChangelogReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _ChangelogStreamReader(_ChangelogReader(self.options))
