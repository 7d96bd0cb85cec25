"""``file``: the embedded changelog — segmented append-only files, no server.

Layout under ``systems.<name>.path``::

    <stream>/stream.json                 {"partitions": N}
    <stream>/<partition>/.lock           single-writer lock (flock; holds the pid)
    <stream>/<partition>/<base:020d>.log segments of record batches (segments.py, ../format.py)
    <stream>/<partition>/compaction.json {"tombstone_horizon": offset} (compaction.py)
    <stream>/<partition>/clean.json      the clean-close claim (clean.py)
    <stream>/<partition>/log.id          the log's identity (:meth:`~FileChangelogPartition.log_id`)
    <stream>/<partition>/shipped/        the engine snapshots shipped here after commits
                                         (shipped.py; ``snapshots = false``: none)
    _checkpoints/<job>/partition-<p>.ckpt (+ .prev)   task checkpoints (checkpoints.py)

A partition (its open, writes, reads, tail cut, reset) is :mod:`.partition`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate.errors import ConfigError, CorruptionError
from localstate.locking import atomic_write, io_error

from ..base import ChangelogSystem, check_stream_partitions
from .checkpoints import FileCheckpointStore
from .partition import DEFAULT_RETENTION_MS, DEFAULT_SEGMENT_BYTES, FileChangelogPartition

if TYPE_CHECKING:
    from localstate.rescale_job import RescaleStrategy

__all__ = ["FileChangelogSystem", "FileChangelogPartition", "FileCheckpointStore", "FileChangelogOptions"]


@dataclass(frozen=True)
class FileChangelogOptions:
    """``systems.<name>.*`` of the file changelog."""

    path: str = "./changelog"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    """Roll to a new segment file at this size (compaction works on closed segments)."""
    delete_retention_ms: int = DEFAULT_RETENTION_MS
    """How long compaction keeps a tombstone (as Kafka's ``delete.retention.ms``)."""
    fsync: bool = True
    """false is for benchmarks only: a commit is then not durable."""
    snapshots: bool = True
    """Ship the engine's local snapshots (RocksDB) into the partition directory after
    commits, so a task that moves to another machine replays only what follows the newest
    one (hard links where the state dir is on the same filesystem: no extra disk)."""
    snapshot_every: int = 0
    """Also ship one every N commits (the engine takes the snapshot it deferred); 0: only
    when the engine takes one (every ``snapshot.interval.records`` records)."""

    def validate(self, prefix: str) -> None:
        if self.segment_bytes < 4096:
            raise ConfigError(f"{prefix}.segment.bytes = {self.segment_bytes}: must be >= 4096")
        if self.delete_retention_ms < 0:
            raise ConfigError(f"{prefix}.delete.retention.ms = {self.delete_retention_ms}: must be >= 0")
        if self.snapshot_every < 0:
            raise ConfigError(f"{prefix}.snapshot.every = {self.snapshot_every}: must be >= 0")


class FileChangelogSystem(ChangelogSystem):
    """The embedded default; options: :class:`FileChangelogOptions`."""

    options_type = FileChangelogOptions
    exclusive_writer_lock = True  # a partition's .lock: one writer, the next one waits
    keeps_open = True  # the lock stays held while a task is kept open

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings: FileChangelogOptions = self.parse_settings(name, options)
        self.root = Path(self.settings.path)
        self.segment_bytes = self.settings.segment_bytes
        self.retention_ms = self.settings.delete_retention_ms
        self.fsync = self.settings.fsync
        self._checkpoints = FileCheckpointStore(self.root / "_checkpoints")

    def describe(self) -> str:
        return f"file changelog at {self.root}"

    def inspect_partition(self, stream: str, physical: str, partition: int, partitions: int) -> dict[str, Any]:
        """As ``localstate inspect DIR`` shows it: segments and the writer's pid too."""
        from .inspect import partition_row

        return partition_row(self.partition_dir(physical, partition), str(self.root))

    @classmethod
    def inspect_location(cls, name: str, options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Every file changelog under the directory ``options["path"]``."""
        from .inspect import inspect_directory

        return inspect_directory(Path(options["path"]))

    def count_records(self, stream: str, partition: int, partitions: int, start: int, stop: int) -> int | None:
        from .inspect import count_records

        part = self.open_partition(stream, partition, partitions, readonly=True)
        try:
            return count_records(part, start, stop)
        finally:
            part.close()

    def rescale_strategy(self) -> RescaleStrategy:
        """Stage the new job beside the old one and swap directories (a file system renames)."""
        from .rescale import FileRescale

        return FileRescale()

    def partition_dir(self, stream: str, partition: int) -> Path:
        return self.root / stream / str(partition)

    def stream_partitions(self, stream: str) -> int | None:
        meta = self.root / stream / "stream.json"
        try:
            data = meta.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise io_error(e, "read", meta) from e
        try:
            return int(json.loads(data)["partitions"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{meta} is corrupt ({e}); nothing was changed") from e

    def open_partition(self, stream: str, partition: int, partitions: int, *, readonly: bool = False) -> FileChangelogPartition:
        sdir = self.root / stream
        if not readonly:
            try:
                sdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create changelog directory", sdir) from e
            meta = sdir / "stream.json"
            if meta.exists():
                check_stream_partitions(
                    stream, str(meta), meta.read_bytes(), partitions,
                    "Set job.partitions = {have} (`localstate rescale --to N` changes the count of a stopped "
                    "job), or use a new changelog stream.",
                )
            else:
                try:
                    atomic_write(meta, json.dumps({"partitions": partitions}).encode())
                except OSError as e:
                    raise io_error(e, "write", meta) from e
        if not 0 <= partition < partitions:
            raise ConfigError(f"partition {partition} is out of range for job.partitions = {partitions}")
        return FileChangelogPartition(
            sdir / str(partition),
            stream=stream,
            partition=partition,
            segment_bytes=self.segment_bytes,
            retention_ms=self.retention_ms,
            fsync=self.fsync,
            readonly=readonly,
            snapshots=self.settings.snapshots,
            snapshot_every=self.settings.snapshot_every,
        )

    def checkpoints(self) -> FileCheckpointStore:
        return self._checkpoints
