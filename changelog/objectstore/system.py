"""``objectstore``: the changelog and the task checkpoints as immutable objects (obstore).

Configuration (``systems.<name>.*``)::

    systems.s3.type = objectstore
    systems.s3.path = s3://bucket/prefix          # s3://, gs://, az://, file:///abs/dir, memory:///
    systems.s3.config.endpoint = http://127.0.0.1:9000   # pass-through store config (obstore keys)
    systems.s3.config.region = us-east-1
    systems.s3.client.allow_http = true           # pass-through client options
    systems.s3.timeout.ms = 30000                 # per request
    systems.s3.retries = 5                        # attempts after the first (5xx, SlowDown, timeouts)
    systems.s3.retry.backoff.ms = 100             # first backoff; doubles, full jitter, capped at 5 s
    systems.s3.rollup.objects = 16                # roll this many objects of one level into one
    systems.s3.rollup.bytes = 67108864            # ... unless the result would be larger
    systems.s3.snapshot.every = 10                # ship the engine's snapshot every N commits (and
                                                  # whenever it takes one; 0: only then)

Layout under ``path`` (object stores have no append, so nothing is ever modified)::

    <stream>/stream.json                          {"partitions": N}, created once
    <stream>/<p>/log/<start:020d>-<end:020d>-<epoch:010d>.lsb
                                                  record batches (changelog/format.py) of
                                                  offsets [start, end), written by ``epoch``
    <stream>/<p>/log/horizon-<offset:020d>        written by a reset: no local snapshot
                                                  below ``offset`` may be loaded
    <stream>/<p>/sst/<epoch:010d>-<file>          immutable snapshot files (RocksDB SSTs), shared
    <stream>/<p>/snapshots/<offset:020d>-<epoch:010d>.json
                                                  a snapshot at a committed offset: its files
    _checkpoints/<job>/partition-<p>/<seq:020d>   checkpoints and claims, If-None-Match
    _generations/<job>/<n:010d>                   after ``localstate rescale``: the job's state
                                                  is in ``<stream>.gen<n>`` and checkpoints of
                                                  ``<job>.gen<n>`` (changelog/base.Generation)

The log as a chain of objects, fencing, roll-ups, compaction, checkpoints and snapshots:
docs/design/objectstore.md. A partition is :mod:`.partition`, the object names and the
chain :mod:`.chain`, a rescaled job's generations :mod:`.generations`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from localstate.errors import ConfigError, CorruptionError, StoreLockedError

from ..base import ChangelogSystem, Generation, check_stream_partitions
from .chain import ObjectName
from .checkpoints import ObjectStoreCheckpointStore
from .client import EXISTS, MISSING, ObjectStoreSettings, connect
from .generations import ObjectStoreGenerations
from .partition import ObjectStoreChangelogPartition

__all__ = [
    "ObjectStoreChangelogSystem",
    "ObjectStoreChangelogPartition",
    "ObjectStoreCheckpointStore",
    "ObjectStoreSettings",
    "ObjectName",
]

log = logging.getLogger("localstate.changelog.objectstore")


class ObjectStoreChangelogSystem(ChangelogSystem):
    """Changelog streams and task checkpoints as immutable objects in one bucket prefix."""

    options_type = ObjectStoreSettings
    pass_through = ("config", "client")

    @classmethod
    def inspect_location(cls, name: str, options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Every job under the bucket prefix ``options["path"]`` names (with the system's
        other ``systems.<name>.*`` options)."""
        from .inspect import inspect_objectstore

        return inspect_objectstore(name, options)

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings: ObjectStoreSettings = self.parse_settings(name, options)
        self.store = connect(self.settings, name)
        self._open: set[tuple[str, int]] = set()
        self._streams: dict[str, int] = {}
        self._stream_ids: dict[str, str] = {}
        self._generations = ObjectStoreGenerations(self.store, job)
        self._checkpoints = ObjectStoreCheckpointStore(self)

    def describe(self) -> str:
        return f"objectstore changelog at {self.settings.url}"

    def generation_prefix(self) -> str:
        return self._generations.prefix

    def generation(self) -> Generation:
        """The job's current generation: the highest ``_generations/<job>/<n>`` (one LIST
        when the system first needs it; 0 when there is none)."""
        return self._generations.current()

    rescales_in_generations = True

    def drop_generation(self, generation: Generation, streams: list[str]) -> bool:
        self._generations.drop(generation, streams)
        return True

    def pin_generation(self, generation: Generation) -> None:
        """Read and write ``generation`` from here on (rescale writes the next one with it)."""
        self._generations.pin(generation)
        self._streams.clear()

    def generation_used(self, generation: Generation, streams: list[str]) -> bool:
        """Whether anything of ``generation`` exists already (a crashed earlier attempt)."""
        return self._generations.used(generation, streams)

    def claim_generation(self, number: int) -> bool:
        """Reserve generation ``number`` for one rescale (create-only ``<n>.writing``): False
        if another rescale (running, or crashed) took it, so two never write one prefix."""
        return self._generations.claim(number)

    def write_generation(self, generation: Generation) -> None:
        """Record ``generation`` as the job's current one (create-only): the commit point of
        a rescale. :class:`ChangelogError` if another rescale recorded that number first."""
        self._generations.write(generation)

    def _check_stream(self, stream: str, partitions: int) -> None:
        if self._streams.get(stream) == partitions:
            return
        key = f"{stream}/stream.json"
        # the stream's identity, made once with it: a prefix deleted and written again by a
        # new run of the job is another log, whose offsets may line up with the old one's
        body = json.dumps({"partitions": partitions, "id": uuid.uuid4().hex}).encode()
        try:
            data = self.store.get(key)  # a GET first: it costs a twelfth of a PUT on S3
        except MISSING:
            try:
                self.store.put(key, body, create=True)
                data = body
            except EXISTS:
                data = self.store.get(key)  # another task of the job created it meanwhile
        check_stream_partitions(stream, self.store.where(key), data, partitions,
                                "Set job.partitions back, or use a new changelog stream.")
        self._stream_ids[stream] = str(json.loads(data).get("id", ""))  # "": made before streams had ids
        self._streams[stream] = partitions

    def stream_id(self, stream: str) -> str:
        """The identity ``stream/stream.json`` was created with (``""``: none recorded, or
        no such stream yet). Read (never created) when the stream was not opened for
        writing here, so a read-only reader names the same log as its writer."""
        if stream not in self._stream_ids:
            try:
                data = self.store.get(f"{stream}/stream.json")
            except MISSING:
                return ""
            try:
                self._stream_ids[stream] = str(json.loads(data).get("id", ""))
            except (ValueError, AttributeError):
                return ""
        return self._stream_ids[stream]

    def stream_partitions(self, stream: str) -> int | None:
        """The partition count the current generation's ``stream.json`` records (read
        only; None when the stream has none yet)."""
        key = f"{self.generation().stream(stream)}/stream.json"
        try:
            data = self.store.get(key)
        except MISSING:
            return None
        try:
            return int(json.loads(data)["partitions"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{self.store.where(key)} is damaged ({e}); it records the stream's "
                                  "partition count") from e

    def open_partition(self, stream: str, partition: int, partitions: int, *,
                       readonly: bool = False) -> ObjectStoreChangelogPartition:
        if not 0 <= partition < partitions:
            raise ConfigError(f"partition {partition} is out of range for job.partitions = {partitions}")
        if readonly:
            return ObjectStoreChangelogPartition(self, stream, partition, readonly=True)
        if (stream, partition) in self._open:
            raise StoreLockedError(f"{self.store.where(f'{stream}/{partition}')} is already open for writing in this task")
        self._check_stream(self.generation().stream(stream), partitions)
        self._open.add((stream, partition))
        try:
            return ObjectStoreChangelogPartition(self, stream, partition)
        except BaseException:
            self._open.discard((stream, partition))
            raise

    def _release(self, stream: str, partition: int) -> None:
        self._open.discard((stream, partition))

    def checkpoints(self) -> ObjectStoreCheckpointStore:
        return self._checkpoints

    def requests(self) -> dict[str, int]:
        """Requests and bytes this system sent so far (for the cost model and benchmarks)."""
        return {**self.store.requests, "bytes_put": self.store.bytes_put, "bytes_got": self.store.bytes_got}
