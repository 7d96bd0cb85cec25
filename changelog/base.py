"""The changelog contract shared by every backend (``file``, ``kafka``, a user's own).

A changelog is a set of streams with one partition per task. A store's changelog
partition has exactly one writer (its task). Offsets are dense record positions
starting at 0, like Kafka's; compaction may remove records but never renumbers the
survivors.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, ConfigError, CorruptionError, LocalStateError
from localstate.records import ChangeRecord

if TYPE_CHECKING:
    from localstate.rescale_job import RescaleStrategy

__all__ = [
    "ChangelogPartition",
    "ChangelogSystem",
    "CheckpointStore",
    "CurrentFn",
    "Generation",
    "check_stream_partitions",
]

CurrentFn = Callable[[Iterable[bytes]], Iterable[ChangeRecord]]
"""``engine.current``: the committed change record for each change-record key."""


def check_stream_partitions(stream: str, where: str, data: bytes, partitions: int, fix: str) -> None:
    """Check a stream's recorded partition count (``stream.json`` at ``where``) against
    ``job.partitions``: a corrupt record is a :class:`CorruptionError`, another count a
    :class:`ChangelogError` ending with ``fix``; nothing is changed either way."""
    try:
        have = int(json.loads(data)["partitions"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{where} is corrupt ({e}); nothing was changed") from e
    if have != partitions:
        raise ChangelogError(
            f"changelog stream {stream!r} at {where} has {have} partitions but the job has "
            f"job.partitions = {partitions}; state is partitioned by task, so the counts must "
            f"match. {fix.format(have=have)}"
        )


@dataclass(frozen=True)
class Generation:
    """Which streams and checkpoints a job's state lives in, on a changelog that cannot
    swap them in place (``kafka``: a topic's partitions cannot shrink; ``objectstore``:
    no rename). Generation 0 is the configured names; ``localstate rescale`` writes
    generation ``n`` beside the old one — streams ``<stream>.gen<n>``, checkpoints of
    ``<job>.gen<n>`` — and then records it, the one write that switches the job over.

    ``horizons[stream][p]`` is the first offset a local snapshot of partition ``p`` may
    be tagged with: one past what the rescale wrote, so a local copy of the *old* task
    ``p`` that survived on some machine (tagged with offsets of the old log) is never
    loaded for the new task ``p``.
    """

    number: int = 0
    partitions: int | None = None
    previous_partitions: int | None = None
    horizons: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def stream(self, stream: str) -> str:
        """The physical stream (topic, prefix) of ``stream`` in this generation."""
        return stream if self.number == 0 else f"{stream}.gen{self.number}"

    def job(self, job: str) -> str:
        """The name the job's task checkpoints are kept under in this generation."""
        return job if self.number == 0 else f"{job}.gen{self.number}"

    def horizon(self, stream: str, partition: int) -> int:
        per_task = self.horizons.get(stream, ())
        return int(per_task[partition]) if partition < len(per_task) else 0

    def to_bytes(self) -> bytes:
        return json.dumps({"generation": self.number, "partitions": self.partitions,
                           "previous_partitions": self.previous_partitions,
                           "horizons": {k: list(v) for k, v in self.horizons.items()}}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Generation:
        """Parse a generation record; :class:`CorruptionError` naming ``where``."""
        try:
            d = json.loads(data)
            return cls(int(d["generation"]), int(d["partitions"]),
                       None if d.get("previous_partitions") is None else int(d["previous_partitions"]),
                       {str(k): [int(x) for x in v] for k, v in d.get("horizons", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(
                f"the job's generation record {where} is corrupt ({e}); nothing was changed. It says which "
                "streams a rescaled job's state is in: restore it from a backup"
            ) from e


class ChangelogPartition(ABC):
    """One partition of one changelog stream, opened by its single writer."""

    stream: str
    partition: int

    @abstractmethod
    def append(self, records: list[ChangeRecord]) -> None:
        """Append records (buffered; not durable until :meth:`flush`)."""

    def append_columns(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Append the records ``(keys[i], values[i])``, in order: the same records, offsets
        and stored bytes as ``append(list(zip(keys, values)))``, which is what this default
        does. The change logger hands its batches over this way; a backend overrides it to
        skip building a tuple per record. ``keys`` and ``values`` of different lengths are
        a :class:`ChangelogError`, with nothing appended."""
        if len(keys) != len(values):
            raise ChangelogError(
                f"{self.describe()}: append_columns got {len(keys)} keys but {len(values)} values; "
                "nothing was appended"
            )
        self.append(list(zip(keys, values)))

    @abstractmethod
    def flush(self) -> int:
        """Make every appended record durable and return the end offset.

        Raises :class:`ChangelogError` if any record was not acknowledged.
        """

    @abstractmethod
    def end_offset(self) -> int:
        """The offset the next appended record will get."""

    @abstractmethod
    def read_batches(self, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        """``(records, encoded_bytes)`` batches of the records with offsets in ``[start, stop)``.

        Records come in offset order. Used by restore, so it is the fast path.
        """

    def read(self, start: int, stop: int) -> Iterator[ChangeRecord]:
        """The records with offsets in ``[start, stop)``, in order."""
        for records, _ in self.read_batches(start, stop):
            yield from records

    @abstractmethod
    def discard_tail(self, committed_offset: int, current: CurrentFn) -> None:
        """Remove the uncommitted tail ``[committed_offset, end)`` before the task writes.

        A log that can truncate does so. A log that cannot (Kafka) appends, for every
        change-record key in the tail, ``current(keys)`` — the restored, committed
        record for that key — so that a later full restore and compaction both yield
        the committed state.
        """

    def describe(self) -> str:
        """Where the partition lives, for messages."""
        return f"changelog stream {self.stream!r} partition {self.partition}"

    def missing_committed(self, committed: int) -> CorruptionError:
        """The error for a checkpoint naming offset ``committed`` past the log's end."""
        return CorruptionError(
            f"{self.describe()} ends at offset {self.end_offset()}, but the task checkpoint says offset "
            f"{committed} was committed: committed records are missing. Nothing was changed. Restore the "
            "log; or keep what is left with `localstate restore --accept-log-end STORE`, or give up the "
            "store's state with `localstate restore --reset STORE`."
        )

    def reset(self) -> int:
        """Empty the partition for an explicit ``--reset``: afterwards a restore of
        ``[0, end)`` yields an empty state. Returns the new end offset."""
        raise NotImplementedError(f"{type(self).__name__} does not support reset")

    def min_valid_snapshot_offset(self) -> int:
        """Compaction horizon: a local snapshot at an offset below this must not be used
        (tombstones before it may be gone, so replaying from there could resurrect keys)."""
        return 0

    def log_id(self) -> str:
        """The identity of this log, beyond the job's :class:`Generation`: a local copy
        built from a log with another id is never used (it is rebuilt from this one).
        Default ``""``: the log cannot name itself, so copies are told apart by the
        generation (and offsets) alone. A system whose offsets can be written twice (a
        cut tail) returns a new id from then on."""
        return ""

    def verify(self) -> dict[str, Any]:
        """Check the stored records without changing anything: at least
        ``{"end_offset": int, "problems": [str, ...]}``. Default: the end offset only."""
        return {"end_offset": self.end_offset(), "problems": []}

    def compact(self, up_to: int) -> dict[str, int]:
        """Compact records below ``up_to`` (committed); returns counters. Optional."""
        return {}

    def upload_snapshot(self, engine: Any, offset: int) -> bool:
        """After a commit at ``offset`` (its checkpoint is written): ship the engine's local
        snapshot beside the log, so an open on another machine replays only what follows
        it (``objectstore_snapshots.RemoteSnapshots``). Only an optimization: a failure
        is logged by the caller and the commit stands. Default: nothing shipped (False)."""
        return False

    def shipped_snapshots(self) -> list[int]:
        """The offsets of the engine snapshots shipped beside this log, oldest first
        (what ``localstate inspect`` shows); read-only. Default: none."""
        return []

    def fetch_snapshot(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore to ``committed``: put the newest usable shipped snapshot at
        ``min_valid <= L <= committed`` among the engine's local ones; returns ``L``, or
        None (nothing fetched: the engine's own copy and the replay cover it)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the partition (idempotent). Does not flush."""


class CheckpointStore(ABC):
    """Where task checkpoints live (beside the changelog, so a moved task finds them)."""

    @abstractmethod
    def read(self, job: str, partition: int) -> Checkpoint | None:
        """The latest checkpoint, ``None`` if the task never wrote one.

        A missing-but-expected or corrupt latest checkpoint raises
        :class:`CorruptionError` naming the recovery command; it never falls back
        silently (an older checkpoint with the changelog tail cut would undo a commit,
        and after compaction could describe a state that never existed).
        """

    def read_readonly(self, job: str, partition: int) -> Checkpoint | None:
        """The latest checkpoint as a reader beside a running task reads it: without
        claiming or fencing the task and without creating anything (None when nothing
        was committed, also where reading would create the place checkpoints live). The
        one way read-only tools (state queries, ``verify``, ``inspect``, standbys) read
        a checkpoint. Default: :meth:`read`, for stores whose read claims nothing."""
        return self.read(job, partition)

    def latest_for_kept(self, job: str, partition: int) -> Checkpoint | None:
        """The latest checkpoint as a task kept open between runs re-reads it before it is
        used again (:mod:`localstate.kept_open`), after
        :meth:`ChangelogSystem.renew_task_instance`. Default :meth:`read_readonly`; a
        store may read only what was written since it last read the task's checkpoint."""
        return self.read_readonly(job, partition)

    def previous(self, job: str, partition: int) -> Checkpoint | None:
        """The checkpoint the latest one replaced, for an explicit recovery
        (``localstate restore --use-previous-checkpoint``). Stores that cannot keep
        it reconstructible return None."""
        return None

    @abstractmethod
    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` atomically and durably (the commit point)."""

    def committing(self, job: str, partition: int) -> AbstractContextManager[None]:
        """The span of one task commit, from its first changelog flush to its checkpoint
        :meth:`write`. A store whose checkpoint write can also commit the changelog
        records of the same task in one atomic step (Kafka: one transaction) lets the
        flushes inside the span wait only for the records to be acknowledged; the
        checkpoint write then commits them with it. The default does nothing: every
        flush commits on its own."""
        return nullcontext()

    def close(self) -> None:
        """Release resources (idempotent)."""


NOTHING_WRITTEN: dict[str, Any] = {"segments": 0, "end_offset": 0, "records": 0, "bytes": 0, "tombstone_horizon": 0,
                                   "note": "nothing written yet"}
"""The inspection row of a changelog partition that does not exist yet (its task never wrote)."""

UNREADABLE: dict[str, Any] = {"segments": "?", "end_offset": "?", "records": "?", "bytes": 0, "tombstone_horizon": "?"}
"""The inspection row of a changelog partition that could not be read (with its ``error``)."""


class ChangelogSystem(ABC):
    """A changelog backend, configured by ``systems.<name>.*`` keys.

    Options, like an engine's, are a frozen dataclass ``options_type`` (field
    ``segment_bytes`` is the key ``segment.bytes``; a ``validate(self, prefix)`` method
    runs last), parsed once by :meth:`parse_settings` when the config is validated and
    again, identically, when the system opens (``self.settings``). ``pass_through``
    names key prefixes handed on as string dicts (``producer.linger.ms`` → the field
    ``producer`` = ``{"linger.ms": "10"}``). Unknown keys are rejected up front with a
    suggestion.

    A system without an ``options_type`` takes no options besides ``type``.
    """

    options_type: ClassVar[type | None] = None
    pass_through: ClassVar[tuple[str, ...]] = ()
    exclusive_writer_lock: ClassVar[bool] = False
    """True when a second instance of a task waits for the first one's file lock (asking a
    parked holder to let go) instead of fencing it. A system that fences (Kafka's
    producer epoch, the object store's claims) leaves it False."""
    keeps_open: ClassVar[bool] = False
    """Whether a task's storage may be kept open between runs (:mod:`localstate.kept_open`):
    true of a system whose second instance waits (:attr:`exclusive_writer_lock`), or that
    can make a kept instance the task's newest again (:meth:`renew_task_instance`, which
    fences whoever opened the task meanwhile) before the kept storage re-reads its
    checkpoint. Without either, a kept storage would be an older instance beside a
    concurrent fresh open (a zombie attempt of a re-submitted Spark stage), which the
    fence would let win."""

    def renew_task_instance(self, job: str, partition: int) -> None:
        """Before a task kept open between runs is used again: make this process's instance
        of task ``partition`` of ``job`` its newest, fencing any instance opened since, as
        a fresh open would. Default: nothing (a system whose writers lock each other out
        holds its lock throughout)."""
        return None

    @classmethod
    def parse_settings(cls, name: str, options: Mapping[str, Any]) -> Any:
        """``options`` (the ``systems.<name>.*`` keys) as an ``options_type`` instance;
        :class:`ConfigError` names the full key. None without an ``options_type``."""
        if cls.options_type is None:
            return None
        from localstate.options import parse_options

        raw = {k: v for k, v in options.items() if k != "type"}
        return parse_options(cls.options_type, raw, f"systems.{name}", cls.pass_through)

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        self.name = name
        self.options = dict(options)
        self.job = job

    @abstractmethod
    def open_partition(self, stream: str, partition: int, partitions: int) -> ChangelogPartition:
        """Open ``stream``'s partition for writing (refusing a second live writer)."""

    @abstractmethod
    def checkpoints(self) -> CheckpointStore:
        """The checkpoint store of this system."""

    def describe(self) -> str:
        """Where this system keeps data, for messages (path, bootstrap servers)."""
        return self.name

    def generation(self) -> Generation:
        """The job's current :class:`Generation` (systems that rescale in place: always 0)."""
        return Generation()

    rescales_in_generations: ClassVar[bool] = False
    """Whether ``localstate rescale`` can write the job at its new partition count as the
    next :class:`Generation` beside the current one (the methods below), and switch to it
    in one write (:meth:`write_generation`): the default :meth:`rescale_strategy`."""

    def rescale_strategy(self) -> RescaleStrategy | None:
        """How ``localstate rescale`` writes a job kept in this system at a new partition
        count (:class:`localstate.rescale_job.RescaleStrategy`), or None if it cannot be
        rescaled. Default: by generations when :attr:`rescales_in_generations`; the file
        changelog stages and swaps its directories instead."""
        if not self.rescales_in_generations:
            return None
        from localstate.rescale_generations import GenerationRescale

        return GenerationRescale()

    def pin_generation(self, generation: Generation) -> None:
        """Read and write ``generation`` from here on (rescale writes the next one with it)."""
        raise NotImplementedError(f"{type(self).__name__} does not rescale in generations")

    def generation_used(self, generation: Generation, streams: list[str]) -> bool:
        """Whether anything of ``generation`` exists already (a crashed earlier rescale)."""
        raise NotImplementedError(f"{type(self).__name__} does not rescale in generations")

    def claim_generation(self, number: int) -> bool:
        """Reserve generation ``number`` for one rescale; False if another took it."""
        raise NotImplementedError(f"{type(self).__name__} does not rescale in generations")

    def write_generation(self, generation: Generation) -> None:
        """Record ``generation`` as the job's current one: the commit point of a rescale."""
        raise NotImplementedError(f"{type(self).__name__} does not rescale in generations")

    def drop_generation(self, generation: Generation, streams: list[str]) -> bool:
        """After a rescale committed: delete what ``generation`` (the old one) holds of
        ``streams`` and the job's checkpoints, best effort (what is left is garbage, never
        read again). False when the system leaves that to the operator (the caller says
        so). Default: False."""
        return False

    def stream_exists(self, stream: str) -> bool:
        """Whether ``stream`` exists, asked before a read-only tool opens it where opening
        would create it (a Kafka topic). Default: True (opening a partition read-only
        creates nothing, and reports a missing stream itself)."""
        return True

    def stream_partitions(self, stream: str) -> int | None:
        """The partition count ``stream`` holds, read without writing anything; None when
        the stream does not exist yet or the system cannot tell (then opening a
        partition for writing is where a wrong count is refused)."""
        return None

    # -- read-only inspection (``localstate inspect``, the restore progress bar) -----------------
    def inspect_partition(self, stream: str, physical: str, partition: int, partitions: int) -> dict[str, Any]:
        """One row of ``localstate inspect``'s partitions table for ``stream`` (stored as
        ``physical``), read-only: ``stream, partition, root, path, locked_by, segments,
        end_offset, records, bytes, tombstone_horizon, shipped_snapshots`` (and ``error``
        when it cannot be read). Default: through this interface, reading the records back."""
        row: dict[str, Any] = {"stream": physical, "partition": partition, "root": self.describe(), "locked_by": None}
        if not self.stream_exists(stream):  # a system where reading a stream would create it
            return {**row, **NOTHING_WRITTEN}
        try:
            part = self.open_partition(stream, partition, partitions, readonly=True)
            try:
                end = part.end_offset()
                records = nbytes = 0
                for batch, size in part.read_batches(0, end):
                    records += len(batch)
                    nbytes += size
                row.update(segments="", end_offset=end, records=records, bytes=nbytes, path=part.describe(),
                           tombstone_horizon=part.min_valid_snapshot_offset(),
                           shipped_snapshots=part.shipped_snapshots())
            finally:
                part.close()
        except LocalStateError as e:
            row.update(UNREADABLE, error=str(e))
        return row

    @classmethod
    def inspect_location(cls, name: str, options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Every job's ``checkpoints``, ``partitions`` (and ``generations``) found at the
        location ``options`` name (``path``: a directory, a bucket URL), read-only, for
        ``localstate inspect DIR`` / ``--url``. Default: not supported (inspect a job
        through its config instead)."""
        raise ConfigError(f"a {cls.__name__} cannot be inspected by location: inspect the job with its config (-c)")

    def count_records(self, stream: str, partition: int, partitions: int, start: int, stop: int) -> int | None:
        """How many records ``[start, stop)`` of the partition holds (after compaction fewer
        than the offsets), or None when it cannot tell without reading them. Default: None."""
        return None

    def close(self) -> None:
        """Release resources (idempotent)."""
