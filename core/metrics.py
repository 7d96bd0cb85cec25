"""Per-store counters and latency histograms (plain Python numbers, no library).

The put/get path only adds to integers; histograms are observed once per flush,
commit and restore. Exporters (:mod:`localstate.prometheus`, the Spark runner's
per-batch metrics) read these objects; docs/metrics.md lists every name.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .storage import TaskStorage

__all__ = ["StoreMetrics", "TaskMetrics", "LatencyHistogram", "RestoreProgress", "TransferRate", "open_storages", "COUNTER_FIELDS"]

LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Upper bounds (seconds) of the latency buckets: 0.5 ms (a memory-store flush) to a
minute (a large restore); an implicit ``+Inf`` bucket follows."""


@dataclass
class LatencyHistogram:
    """Counts of observations per bucket (not cumulative), their sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` with ``inf`` last (Prometheus' form)."""
        out, total = [], 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out

    def merge(self, other: LatencyHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum
        self.count += other.count


@dataclass
class StoreMetrics:
    """Counters of one store in one task; every layer and the logger add to them."""

    gets_counted: int = 0
    """Point reads counted by the ``metered`` layer (stores without an object cache)."""
    hits: int = 0
    misses: int = 0
    puts: int = 0
    deletes: int = 0
    range_scans: int = 0
    records_logged: int = 0
    bytes_logged: int = 0
    commits: int = 0
    records_restored: int = 0
    bytes_restored: int = 0
    late_records: int = 0
    """Records a window store dropped because their window had closed (:mod:`localstate.windows`)."""
    restore_seconds: float = 0.0
    flush_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Commit steps 1-2 for this store: cache into engine, change logger into a durable changelog."""
    persist_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Commit step 3 for this store: ``engine.persist`` (flush + local snapshot)."""
    restore_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """One observation per restore at open (0 records included)."""

    cache_counts_gets: bool = False
    """Set when an object cache is the task-facing layer and counts every point read as a
    hit or a miss: then :attr:`gets` is ``hits + misses``."""

    @property
    def gets(self) -> int:
        """Point reads (``get``, each key of ``get_all``, ``[]``, ``in``)."""
        return self.gets_counted + (self.hits + self.misses if self.cache_counts_gets else 0)

    def as_dict(self) -> dict[str, Any]:
        return {"gets": self.gets, **asdict(self)}


COUNTER_FIELDS: tuple[str, ...] = (
    "gets", "hits", "misses", "puts", "deletes", "range_scans", "records_logged", "bytes_logged",
    "commits", "records_restored", "bytes_restored", "late_records",
)
"""The :class:`StoreMetrics` fields that only grow (exported as counters)."""


@dataclass
class TaskMetrics:
    """Metrics of a whole task (one :class:`~localstate.TaskStorage`)."""

    commits: int = 0
    commit_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """The whole commit protocol, checkpoint write included."""


_OPEN: weakref.WeakSet[TaskStorage] = weakref.WeakSet()


def track(storage: TaskStorage) -> None:
    """Called by every TaskStorage on open, so exporters find it (held weakly)."""
    _OPEN.add(storage)


def untrack(storage: TaskStorage) -> None:
    _OPEN.discard(storage)


def open_storages() -> list[TaskStorage]:
    """Every TaskStorage open in this process (what the exporters report)."""
    return list(_OPEN)


class TransferRate:
    """Rates of something that moved ``records`` records of ``bytes`` bytes in ``seconds``
    (a mix-in: the dataclass that uses it declares those three fields)."""

    records: int
    bytes: int
    seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class RestoreProgress(TransferRate):
    """What a restore listener is told: ``done`` is True on the last call of a store."""

    store: str
    partition: int
    records: int
    bytes: int
    seconds: float
    start_offset: int
    stop_offset: int
    done: bool = False

