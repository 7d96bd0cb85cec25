"""A stopped job being rescaled, and the strategy its changelog system writes it with.

:mod:`localstate.rescale` decides what is refused and where each record goes; *how* the
new job is written and switched to belongs to the changelog system, which declares it
with :meth:`~localstate.changelog.base.ChangelogSystem.rescale_strategy`:

* the file changelog stages the new job beside the old one and swaps directories
  (``localstate.changelog.file.rescale``);
* a system that cannot swap streams in place (Kafka, object stores) writes the next
  generation and switches with one record (:mod:`localstate.rescale_generations`).

A strategy gets a :class:`RescalePlan`: the steps every system shares (the refusals, the
old tasks' checkpoints, staging the routed records locally or on Spark, the result).
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .config import Config
from .engine import StoreSpec

if TYPE_CHECKING:
    from .locking import FileLock
    from .rescale import RescaleResult

__all__ = [
    "RescaleJob",
    "RescalePlan",
    "RescaleStrategy",
    "Stage",
    "carried_event_time",
    "drop_local_copies",
    "streams",
]

Stage = Callable[[Any], tuple[dict[str, list[int]], dict[str, int]]]
"""Writes every new changelog partition of every store into a target (the strategy's:
a staging area, a generation); returns ``(end offsets per store per new task, records
per store)``."""


@dataclass
class RescaleJob:
    """A stopped job being rescaled from ``old`` to ``new`` tasks."""

    config: Config
    old: int
    new: int
    system: Any
    """The open changelog system holding every logged store and the checkpoints."""
    stores: dict[str, StoreSpec]
    """Every store of the job (each has a changelog: rescale refuses unlogged stores)."""
    strategy: RescaleStrategy


class RescalePlan(ABC):
    """The steps of a rescale every changelog system shares, handed to its strategy."""

    job: RescaleJob

    @abstractmethod
    def prepare(self) -> tuple[dict[int, Checkpoint], int, Any]:
        """The refusals, before anything is written; returns the old tasks' checkpoints
        (all at one commit), that commit's version and the new tasks' input position."""

    @abstractmethod
    def stage(self, ckpts: Mapping[int, Checkpoint]) -> Stage:
        """A :data:`Stage` that routes the committed records of ``ckpts`` to the new tasks
        and writes each new partition with :meth:`RescaleStrategy.write_partition`, in
        this process or on Spark executors."""

    @abstractmethod
    def done(self, version: int, records: Mapping[str, int], from_partitions: int | None = None) -> RescaleResult:
        """The result of a rescale that wrote ``records`` per store at ``version``."""

    @abstractmethod
    def already_done(self, ckpt: Checkpoint | None) -> RescaleResult:
        """The result of a re-run that finds the state already at the new count."""


class RescaleStrategy(ABC):
    """How one changelog system writes a rescaled job and switches to it."""

    def locks(self, job: RescaleJob) -> list[FileLock]:
        """Locks of the system's own (beside every old task's state-dir lock) held for the
        whole rescale; the caller releases them. None by default."""
        return []

    @abstractmethod
    def run(self, job: RescaleJob, plan: RescalePlan) -> RescaleResult:
        """Write the new job and switch to it (or finish a switch a crash interrupted).
        A refusal changes nothing the old job reads."""

    @abstractmethod
    def write_partition(self, job: RescaleJob, target: Any, name: str, q: int, records: Mapping[bytes, bytes]) -> int:
        """Write new task ``q``'s records of store ``name`` into ``target`` (what the
        strategy's :meth:`run` staged into); returns the partition's end offset. Runs in
        the driver or on a Spark executor."""


def streams(job: RescaleJob) -> list[str]:
    """The changelog streams of the job's stores."""
    return sorted({s.changelog[1] for s in job.stores.values()})  # type: ignore[index]


def carried_event_time(ckpts: Mapping[int, Checkpoint]) -> int | None:
    """The new tasks' event-time clock: the latest of the old tasks' clocks. A key's new
    task then never runs behind the task that held it, so an entry that had expired there
    (event-time TTL) stays expired and a timer that had fired does not wait again; entries
    of a task whose clock was behind may expire up to that skew earlier."""
    times = [c.event_time for c in ckpts.values() if c.event_time is not None]
    return max(times) if times else None


def drop_local_copies(config: Config) -> None:
    """Delete every reachable local copy of the job's stores (all partitions): they hold
    the old tasks' keys. With ``{executor}`` in ``job.state.dir`` every executor's
    directory on this file system is found by pattern."""
    state_dir = str(config.state_dir)
    if "{executor}" in state_dir:
        parent = Path(state_dir.split("{executor}")[0]).parent
        pattern = state_dir.replace("{executor}", "*")
        roots = [p for p in parent.glob(str(Path(pattern).relative_to(parent)))] if parent.exists() else []
    else:
        roots = [config.state_dir]
    for root in roots:
        for name in config.stores:
            d = root / config.job_name / name
            if d.exists():
                shutil.rmtree(d)
