"""Per-store counters (cheap integers; read them, or export them as a dict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["StoreMetrics", "RestoreProgress"]


@dataclass
class StoreMetrics:
    """Counters of one store in one task; every layer and the logger add to them."""

    gets: int = 0
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
    restore_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class RestoreProgress:
    """What a restore listener is told: ``done`` is True on the last call of a store."""

    store: str
    partition: int
    records: int
    bytes: int
    seconds: float
    start_offset: int
    stop_offset: int
    done: bool = False

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")
