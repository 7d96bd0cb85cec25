"""``localstate verify``: check a job's changelogs against its checkpoints, read-only.

Opening a task already refuses damage it meets (docs/design/protocol.md); but a damaged *closed*
segment is only read when a store is rebuilt, so while a valid local copy (RocksDB,
LevelDB) serves the task, damage can sit unnoticed until the moment the log is needed.
``verify`` finds it on a schedule instead:

- every task checkpoint (latest and previous) parses and passes its CRC;
- every changelogged store the config names has a committed offset, and no changelog
  holds records that no checkpoint explains;
- each committed offset is within its changelog (file: segment chain dense; Kafka:
  topic exists and its end is at or past the offset);
- file changelogs: every record batch of every segment passes its CRC32 (reads the
  whole log once, sequentially; ``deep=False`` checks ends only);
- Kafka with ``deep=True``: every record up to the end is read back.

It takes no locks and writes nothing, so it runs beside live tasks (a commit landing
mid-check can show as a checkpoint ahead of the end it read first: re-run to confirm).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint
from .config import Config
from .errors import CorruptionError, LocalStateError
from .reader import read_checkpoint_readonly

__all__ = ["StoreCheck", "verify_job"]


@dataclass
class StoreCheck:
    """What ``verify`` found for one store of one task partition."""

    store: str
    partition: int
    committed: int | None = None
    end_offset: int | None = None
    batches: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "partition": self.partition, "committed": self.committed,
                "end_offset": self.end_offset, "batches": self.batches, "bytes": self.bytes,
                "seconds": round(self.seconds, 4), "ok": self.ok, "problems": list(self.problems)}


def _read_checkpoints(store: Any, job: str, partition: int) -> tuple[Checkpoint | None, list[str]]:
    problems: list[str] = []
    ckpt: Checkpoint | None = None
    try:
        ckpt = read_checkpoint_readonly(store, job, partition)
    except LocalStateError as e:
        problems.append(f"latest checkpoint: {e}")
    if ckpt is None and not problems:
        # nothing committed yet (verify writes nothing, so the previous checkpoint is not
        # asked where reading would create its place); a changelog holding records is
        # still a problem, found by the store's check
        return None, []
    try:
        store.previous(job, partition)
    except LocalStateError as e:
        problems.append(f"previous checkpoint: {e}")
    return ckpt, problems


def verify_job(config: Config, partitions: list[int] | None = None, *, deep: bool = True,
               system: str | None = None) -> list[StoreCheck]:
    """One :class:`StoreCheck` per changelogged store and task partition of ``config``
    (``system``: only the stores whose changelog is on that system)."""
    from .rescale_copies import check_layout
    from .store_open import open_system

    systems: dict[str, Any] = {}

    def opened(name: str) -> Any:
        if name not in systems:
            systems[name] = open_system(config, name)
            check_layout(config, systems[name])
        return systems[name]

    out: list[StoreCheck] = []
    wanted = partitions if partitions is not None else range(config.partitions)
    try:
        try:
            ckpt_store = opened(config.checkpoint_system).checkpoints()
        except CorruptionError as e:  # damage found opening the job (a lost generation record): a problem
            return [StoreCheck(spec.name, p, problems=[str(e)]) for p in wanted for spec in config.stores.values()
                    if spec.changelog is not None and system in (None, spec.changelog[0])]
        for p in wanted:
            ckpt, ckpt_problems = _read_checkpoints(ckpt_store, config.job_name, p)
            for spec in config.stores.values():
                if spec.changelog is None or system not in (None, spec.changelog[0]):
                    continue
                check = StoreCheck(spec.name, p, problems=list(ckpt_problems))
                out.append(check)
                t0 = time.perf_counter()
                try:
                    _check_store(opened(spec.changelog[0]), spec.changelog[1], p, config.partitions,
                                 ckpt, check, deep)
                except LocalStateError as e:
                    check.problems.append(str(e))
                check.seconds = time.perf_counter() - t0
    finally:
        for s in systems.values():
            s.close()
    return out


def _check_store(system: Any, stream: str, p: int, partitions: int, ckpt: Checkpoint | None,
                 check: StoreCheck, deep: bool) -> None:
    if not system.stream_exists(stream):
        check.committed = ckpt.offsets.get(check.store) if ckpt else None
        if check.committed:
            check.problems.append(f"changelog topic {stream!r} is missing but offset {check.committed} was committed")
        return
    try:
        part = system.open_partition(stream, p, partitions, readonly=True)
    except TypeError:
        check.problems.append(f"{type(system).__name__} cannot open a partition read-only; not checked")
        return
    try:
        if deep:
            report = part.verify()
            check.problems.extend(report.get("problems", []))
            check.batches = int(report.get("batches", 0))
            check.bytes = int(report.get("bytes", 0))
            end = int(report["end_offset"])
        else:
            end = part.end_offset()
        check.end_offset = end
        committed = ckpt.offsets.get(check.store) if ckpt else None
        check.committed = committed
        if committed is None:
            if end:
                check.problems.append(
                    f"{part.describe()} holds records up to offset {end} but no checkpoint names the store "
                    f"(`localstate restore --accept-log-end {check.store}` or `--reset {check.store}`)"
                )
        elif committed > end:
            check.problems.append(str(part.missing_committed(committed)))
    finally:
        part.close()
