"""What the localstate data sources share: option parsing, input ranges, offset
arithmetic, and the stream reader every source runs on (:class:`StreamReader`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from localstate.errors import ConfigError
from localstate.options import parse_size_bytes

# (the package checked the PySpark version first: on an older Spark this import would fail bare)
from pyspark.sql.datasource import (
    CaseInsensitiveDict,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

__all__ = [
    "StreamReader",
    "BatchReader",
    "RangeReader",
    # PySpark's data source API, imported once here behind the version check
    "DataSource",
    "DataSourceReader",
    "DataSourceStreamReader",
    "InputPartition",
    "ReadLimit",
    "StructType",
]


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


class RangeReader(Protocol):
    """What a source's reader provides; batch and stream readers are built on it.
    Offsets are flat ``{"<partition>": next offset}`` dicts unless a source overrides
    :meth:`StreamReader.latestOffset`."""

    def ends(self) -> dict[str, Any]: ...
    def starts(self) -> dict[str, Any]: ...
    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> list[_Range]: ...
    def read(self, part: _Range) -> Iterator[pa.RecordBatch]: ...


class BatchReader(DataSourceReader):
    """A batch read of ``[reader.starts(), end)``; ``end`` defaults to ``reader.ends()``."""

    def __init__(self, reader: RangeReader, end: dict[str, Any] | None = None) -> None:
        self.reader = reader
        self.end = end

    def partitions(self) -> Sequence[InputPartition]:
        return self.reader.plan(self.reader.starts(), self.end if self.end is not None else self.reader.ends())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.reader.read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read over a :class:`RangeReader`: offsets live in Spark's checkpoint
    (``commit`` has nothing to do), ``availableNow`` reads what is there when the
    trigger starts, offsets never move backwards, and ``max_rows`` (when set) caps a
    micro-batch fairly across partitions."""

    def __init__(self, reader: RangeReader, max_rows: int | None = None) -> None:
        self.reader = reader
        self.max_rows = max_rows
        self.target: dict[str, Any] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.reader.ends()

    def initialOffset(self) -> dict:
        return self.reader.starts()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Under availableNow the end is the snapshot taken when the trigger started: ends
        # never move backwards, so asking the source again (for Kafka, reading every
        # partition's last batch to EOF) each micro-batch would only return it again.
        end = self.target if self.target is not None else self.reader.ends()
        end = {p: max(int(o), int(start.get(p, 0))) for p, o in end.items()}
        if isinstance(limit, ReadMaxRows):
            end = _limit_rows({p: int(o) for p, o in start.items()}, end, limit.max_rows)
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.reader.plan(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.reader.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: positions live in Spark's checkpoint."""


def _json_offsets(option: str, value: str, keywords: str) -> dict[str, int]:
    """Option ``option`` given as JSON ``{"<partition>": offset}``; else a ConfigError
    naming the option and the accepted ``keywords``."""
    try:
        return {str(p): int(o) for p, o in json.loads(value).items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(
            f"localstate-kafka: {option} = {value!r}; use {keywords} or a JSON object " '{"<partition>": offset}'
        ) from None


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
