"""ChangeLogger: the single fault-tolerance path of every engine.

Engines (or the ``logged`` KV layer) report change records here. Between two
commits the logger keeps only the latest record per key (an insertion-ordered
dict: rewriting a key *is* the dedup), handing batches of at most
``write.batch.size`` records to the changelog partition whenever that many distinct
keys are pending. ``flush()`` at commit appends the rest and makes the partition
durable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .metrics import StoreMetrics
from .records import ChangeRecord

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogPartition

__all__ = ["ChangeLogger", "NullChangeLogger"]


class ChangeLogger:
    """Dedups change records per key and appends them to one changelog partition."""

    __slots__ = ("store", "partition", "batch_size", "metrics", "_pending")

    def __init__(
        self,
        store: str,
        partition: ChangelogPartition,
        batch_size: int,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self.store = store
        self.partition = partition
        self.batch_size = max(1, batch_size)
        self.metrics = metrics or StoreMetrics()
        self._pending: dict[bytes, bytes | None] = {}

    @property
    def enabled(self) -> bool:
        return True

    def pending_count(self) -> int:
        """Change records buffered here, not yet appended to the changelog."""
        return len(self._pending)

    def log(self, key: bytes, value: bytes | None) -> None:
        """Record that ``key`` now has ``value`` (``None``: deleted)."""
        pending = self._pending
        pending[key] = value
        if len(pending) >= self.batch_size:
            self._drain()

    def log_all(self, records: Iterable[ChangeRecord] | Mapping[bytes, bytes | None]) -> None:
        """Record many changes; later records for one key win."""
        pending = self._pending
        if not pending and type(records) is dict and len(records) >= self.batch_size:
            self._drain(records)  # a full batch with nothing pending: appended as it is, not copied
            return
        pending.update(records)
        if len(pending) >= self.batch_size:
            self._drain()

    def log_deletes(self, keys: list[bytes]) -> None:
        """Record that every key of ``keys`` is deleted (a bulk delete: the timers' fired
        chunks, the TTL sweep). With nothing pending, the tombstones' dict becomes the
        pending dict itself instead of being copied into it."""
        pending = self._pending
        if pending:
            pending.update(dict.fromkeys(keys))
        else:
            self._pending = pending = dict.fromkeys(keys)
        if len(pending) >= self.batch_size:
            self._drain()

    def pending(self) -> int:
        return len(self._pending)

    def _drain(self, pending: dict[bytes, bytes | None] | None = None) -> None:
        """Append the pending records (or ``pending``, a batch not kept here) in batches of
        at most ``batch_size``.

        A bulk write of many keys is handed over in one ``log_all``, but the changelog
        still sees batches no larger than ``write.batch.size``, as with single writes.
        The records go over as two columns (keys, values): two lists instead of one
        GC-tracked ``(key, value)`` tuple per record, whose allocations were half of the
        cyclic GC's young collections on the write path
        (:meth:`~localstate.changelog.base.ChangelogPartition.append_columns`; its default
        hands a backend the pairs).
        """
        if pending is None:
            pending = self._pending
            if not pending:
                return
            self._pending = {}
        keys, values = list(pending), list(pending.values())
        append_columns = self.partition.append_columns
        size, n = self.batch_size, len(keys)
        if n <= size:
            append_columns(keys, values)
        else:
            for start in range(0, n, size):
                append_columns(keys[start : start + size], values[start : start + size])
        m = self.metrics
        m.records_logged += n
        # two C-level passes; tombstones (None) have no value bytes
        m.bytes_logged += sum(map(len, keys)) + sum(map(len, filter(None, values)))

    def flush(self) -> int:
        """Append everything pending, make it durable, return the end offset."""
        self._drain()
        return self.partition.flush()

    def discard_pending(self) -> None:
        """Forget unflushed records (the task is being closed without commit)."""
        self._pending = {}


class NullChangeLogger(ChangeLogger):
    """The logger of a store configured without a changelog: records go nowhere."""

    __slots__ = ()

    def __init__(self, store: str, metrics: StoreMetrics | None = None) -> None:
        self.store = store
        self.partition = None  # type: ignore[assignment]
        self.batch_size = 1
        self.metrics = metrics or StoreMetrics()
        self._pending = {}

    @property
    def enabled(self) -> bool:
        return False

    def log(self, key: bytes, value: bytes | None) -> None:
        return None

    def log_all(self, records: Iterable[ChangeRecord] | Mapping[bytes, bytes | None]) -> None:
        return None

    def log_deletes(self, keys: list[bytes]) -> None:
        return None

    def flush(self) -> int:
        return 0

