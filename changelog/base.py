"""The changelog contract shared by every backend (``file``, ``kafka``, a user's own).

A changelog is a set of streams with one partition per task. A store's changelog
partition has exactly one writer (its task). Offsets are dense record positions
starting at 0, like Kafka's; compaction may remove records but never renumbers the
survivors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from localstate.checkpoint import Checkpoint
from localstate.engine import ChangeRecord

__all__ = ["ChangelogPartition", "ChangelogSystem", "CheckpointStore", "CurrentFn"]

CurrentFn = Callable[[Iterable[bytes]], Iterable[ChangeRecord]]
"""``engine.current``: the committed change record for each change-record key."""


class ChangelogPartition(ABC):
    """One partition of one changelog stream, opened by its single writer."""

    stream: str
    partition: int

    @abstractmethod
    def append(self, records: list[ChangeRecord]) -> None:
        """Append records (buffered; not durable until :meth:`flush`)."""

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

    def min_valid_snapshot_offset(self) -> int:
        """Compaction horizon: a local snapshot at an offset below this must not be used
        (tombstones before it may be gone, so replaying from there could resurrect keys)."""
        return 0

    def compact(self, up_to: int) -> dict[str, int]:
        """Compact records below ``up_to`` (committed); returns counters. Optional."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Release the partition (idempotent). Does not flush."""


class CheckpointStore(ABC):
    """Where task checkpoints live (beside the changelog, so a moved task finds them)."""

    @abstractmethod
    def read(self, job: str, partition: int) -> Checkpoint | None:
        """The last committed checkpoint, ``None`` if the task never committed.

        A corrupt latest checkpoint falls back to the previous one (with a warning),
        never to "empty"; if none is readable, raise :class:`CorruptionError`.
        """

    @abstractmethod
    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` atomically and durably (the commit point)."""

    def close(self) -> None:
        """Release resources (idempotent)."""


class ChangelogSystem(ABC):
    """A changelog backend, configured by ``systems.<name>.*`` keys.

    ``options_keys`` lists accepted keys (``*`` suffix = a pass-through prefix such as
    ``producer.*``); other keys are rejected up front with a suggestion.
    """

    options_keys: ClassVar[tuple[str, ...]] = ()

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

    def close(self) -> None:
        """Release resources (idempotent)."""
