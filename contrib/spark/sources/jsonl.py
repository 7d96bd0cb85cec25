"""``localstate-jsonl``: a directory of JSON-lines files that are appended to or added
(read in name order; only complete lines count). Offsets are ``{"files": {"<name>":
byte position}}``."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
from localstate.contrib.spark.json_policy import JsonPolicy, read_json_records
from localstate.contrib.spark.sources._base import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    ReadLimit,
    StreamReader,
    StructType,
    _arrow_schema,
    _int_option,
    _option,
    _options,
    _Range,
    _size_option,
)
from localstate.errors import ConfigError

__all__ = ["JsonLinesSource"]

_CHUNK_BYTES = 32 << 20
"""JSON-lines files are split into input partitions of about this size (at newlines)."""


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
    """The files of one ``localstate-jsonl`` read; offsets ``{"files": {name: byte position}}``."""

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

    def starts(self) -> dict[str, dict[str, int]]:
        return {"files": {}}

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan(self.starts(), self.ends())

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


class _JsonLinesStreamReader(StreamReader):
    """Offsets are nested per file: ``availableNow`` keeps the complete lines present
    when the trigger starts; a truncated file never moves its offset backwards."""

    reader: _JsonLinesReader

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.reader.ends()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self.reader.ends()
        if self.target is not None:
            target = self.target["files"]
            end["files"] = {n: min(o, target[n]) for n, o in end["files"].items() if n in target}
        done = start.get("files", {})
        for name, pos in done.items():  # never move backwards (a file that was truncated)
            end["files"][name] = max(int(pos), end["files"].get(name, 0))
        return self.reader.limit(start, end)


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


