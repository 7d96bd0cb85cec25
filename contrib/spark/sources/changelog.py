"""``localstate-changelog``: a store's file changelog as a table or a stream: columns
``partition int, offset long, key binary, value binary`` (null value = tombstone).
Offsets are ``{"<partition>": next offset}``; with ``job`` and ``store`` options only
committed records (below the task checkpoints) are read."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from localstate.contrib.spark.sources._base import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    StreamReader,
    StructType,
    _option,
    _options,
    _Range,
)
from localstate.errors import ConfigError

__all__ = ["ChangelogSource", "CHANGELOG_SCHEMA"]

CHANGELOG_SCHEMA = "partition int, offset long, key binary, value binary"


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
            from localstate.changelog.file.checkpoints import FileCheckpointStore

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

    def starts(self) -> dict[str, int]:
        return {str(p): 0 for p in range(self.partitions_count)}

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan(self.starts(), self.ends())

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
        return StreamReader(_ChangelogReader(self.options))
