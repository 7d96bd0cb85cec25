"""Crash-trial plans: what one trial does (:class:`TrialPlan`), which fault points it may
kill at, and the job config it runs under. The harness that runs plans is
:mod:`localstate.testing.torture`; the workloads are :mod:`localstate.testing.torture_adapters`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localstate.errors import ConfigError

from .torture_adapters import adapter_for

__all__ = [
    "STORE", "CRASH_POINTS", "COMMIT_POINTS", "OBJECTSTORE_POINTS", "TORTURE_BUCKET",
    "TrialPlan", "plan_trial", "kill_plan", "reproducer", "engine_slug",
]

STORE = "s"
CRASH_POINTS = (
    "commit.before_changelog_flush",
    "commit.after_changelog_flush",
    "commit.after_engine_checkpoint",
    "checkpoint.before_rename",
    "checkpoint.after_rename",
    "changelog.append",
    "snapshot.mid",
    "compaction.before_rename",
    "compaction.mid",
    "restore.mid",
)
"""Named fault points a trial may kill at (``timer`` kills after a random delay)."""
COMMIT_POINTS = (
    "commit.before_changelog_flush",
    "commit.after_changelog_flush",
    "commit.after_engine_checkpoint",
    "checkpoint.before_rename",
    "changelog.append",
)
"""The fault points every commit passes, whatever the engine."""
OBJECTSTORE_POINTS = ("objectstore.after_put", "objectstore.rollup.after_put",
                      "objectstore.discard_tail.before_delete")
"""Extra fault points of objectstore trials (after an upload, a roll-up, inside the tail cut)."""
SHIP_POINTS = ("snapshot.ship.before_manifest",)
"""Extra fault points of rocksdb trials: between a shipped snapshot's files and its manifest."""
MOVE_SHARE = 0.4
"""The chance that the task moves to another machine (an empty state dir) after a crash
round: the next child restores from the snapshots shipped beside the changelog."""
_ONCE_PER_OPEN = frozenset({"objectstore.discard_tail.before_delete"})
ZOMBIE_SHARE = 0.35
"""The share of objectstore trials with a zombie round."""
TORTURE_BUCKET = "localstate-torture"


# -- plans ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialPlan:
    """Everything that determines one trial; ``localstate torture --trials 1 --seed S`` rebuilds it."""

    seed: int
    engine: str
    changelog: str
    batches: int
    ops: int
    keys: int
    compact_every: int
    retention_ms: int
    faults: tuple[str, ...]
    """Per crash round: ``"<point>=kill@N"``, ``"timer:<seconds>"`` or, on the objectstore
    changelog, ``"zombie:<k>@<seconds>"`` (the child is stopped that long after its k-th
    commit and goes on beside the next one; at most one per trial)."""
    fsync: bool = False
    """``systems.file.fsync``: a SIGKILL loses no page-cache data, so process-crash trials
    do not need it (power loss is outside what a process-level trial can cause); the
    checkpoint file is fsync'd either way."""
    snapshot_interval: int = 0
    """``rocksdb.snapshot.interval.records`` of a rocksdb trial: ``0`` snapshots at every
    commit (each named snapshot point is reached), more defers snapshots between commits
    (reopens replay from an older snapshot)."""
    workload: str | None = None
    """A named workload (``localstate torture --workload``, e.g. ``ttl-timers``) used instead
    of the engine's own adapter (:func:`~localstate.testing.torture_adapters.adapter_for`)."""
    moves: tuple[int, ...] = ()
    """Crash rounds after which the task moves to another machine (a new empty state dir,
    as a task whose executor was lost): the next child restores from the changelog and
    the snapshots shipped beside it."""

    def values(self, root: Path, bootstrap: str | None, tag: str, *, changelog: str | None = None,
               namespace: str = "") -> dict[str, Any]:
        """The job config of this trial under ``root``; ``tag`` and ``namespace`` keep job
        names (and so Kafka topics and checkpoint keys on a shared broker) apart."""
        system = changelog or self.changelog
        job = f"torture{self.seed}{tag}-{engine_slug(self.engine)}-{namespace}"
        values: dict[str, Any] = {
            "job.name": job,
            "job.state.dir": str(root / "state"),
            "job.changelog.system": system,
            "systems.file.path": str(root / "changelog"),
            "systems.file.segment.bytes": 4096,
            "systems.file.delete.retention.ms": self.retention_ms,
            "systems.file.fsync": self.fsync,
            f"stores.{STORE}.factory": self.engine,
            f"stores.{STORE}.changelog": f"{system}.{job}-{STORE}",
        }
        if system == "kafka":
            if not bootstrap:
                raise ConfigError("kafka trials need bootstrap servers (--bootstrap, or let torture start tansu)")
            # A checkpoint topic per trial: a trial killed inside its checkpoint transaction
            # leaves it open until its next child fences it, and a reader of a shared topic
            # waits for that (KafkaCheckpointStore.read); separate topics keep two trials
            # running side by side from waiting on each other's kills.
            values.update({"systems.kafka.bootstrap.servers": bootstrap, "systems.kafka.timeout.ms": 10000,
                           "systems.kafka.checkpoint.topic": f"localstate-torture-checkpoints-{job}",
                           "systems.kafka.snapshots.path": f"file://{root.resolve()}/shipped"})
        if system == "objectstore":
            # ``bootstrap`` is the S3 endpoint here (a bucket TORTURE_BUCKET on it), or a
            # file:// directory when none is given; roll-ups and snapshot uploads made frequent
            values.update({"systems.objectstore.rollup.objects": 3, "systems.objectstore.snapshot.every": 2,
                           "systems.objectstore.retries": 3,
                           "systems.objectstore.timeout.ms": 10000})
            if bootstrap:
                from localstate.testing.s3 import objectstore_options

                values.update(objectstore_options(bootstrap, TORTURE_BUCKET, job, system="objectstore"))
            else:
                values["systems.objectstore.path"] = f"file://{root.resolve()}/objects"
        adapter = adapter_for(self.engine, self.workload)
        for k, v in adapter.store_options.items():
            values[f"stores.{STORE}.{k}"] = v
        for store, options in adapter.extra_stores.items():  # on the engine under test unless set
            values[f"stores.{store}.factory"] = self.engine
            values[f"stores.{store}.changelog"] = f"{system}.{job}-{store}"
            values.update({f"stores.{store}.{k}": v for k, v in options.items()})
        for store in (STORE, *adapter.extra_stores):
            if values[f"stores.{store}.factory"] == "rocksdb":
                values[f"stores.{store}.rocksdb.snapshot.interval.records"] = self.snapshot_interval
        return values


def plan_trial(seed: int, engine: str, changelog: str, *, batches: int = 12, ops: int = 40,
               keys: int = 30, fsync: bool = False, workload: str | None = None) -> TrialPlan:
    """The plan of trial ``seed``: fault points (the workload's own included), crash
    rounds and workload shape."""
    extra_points = adapter_for(engine, workload).crash_points if workload else ()
    rng = random.Random(f"plan:{seed}")
    rounds = rng.choice((1, 1, 2, 3))
    faults = []
    for r in range(rounds):
        points = [p for p in CRASH_POINTS if r > 0 or p != "restore.mid"]
        if changelog == "objectstore":
            points += OBJECTSTORE_POINTS
        if engine == "rocksdb":
            points += SHIP_POINTS
        points += extra_points
        if rng.random() < 0.3:
            faults.append(f"timer:{rng.uniform(0.0, 1.0):.3f}")
        else:
            point = rng.choice(points)
            # the tail cut runs once per open: a later hit would never come
            hit = 1 if point in _ONCE_PER_OPEN else rng.randint(1, max(1, batches // 2))
            faults.append(f"{point}=kill@{hit}")
    if changelog == "objectstore":
        # a zombie round in about a third of the trials (its own generator: the other
        # rounds of a seed stay what they were)
        zrng = random.Random(f"zombie:{seed}")
        if zrng.random() < ZOMBIE_SHARE:
            faults[zrng.randrange(len(faults))] = f"zombie:{zrng.randint(0, max(0, batches // 2))}@{zrng.uniform(0.0, 0.05):.3f}"
    # moves after crash rounds (their own generator: the other rounds of a seed stay what they were)
    mrng = random.Random(f"move:{seed}")
    moves = tuple(r for r in range(len(faults)) if mrng.random() < MOVE_SHARE)
    return TrialPlan(
        seed=seed, engine=engine, changelog=changelog, batches=batches, ops=ops, keys=keys,
        compact_every=rng.choice((0, 2, 3)), retention_ms=rng.choice((0, 86_400_000)),
        faults=tuple(faults), fsync=fsync, snapshot_interval=rng.choice((0, 25, 100)), workload=workload,
        moves=moves,
    )


def kill_plan(engine: str, faults: tuple[str, ...], *, changelog: str = "file", batches: int | None = None,
              ops: int = 40, keys: int = 30, seed: int = 1, workload: str | None = None) -> TrialPlan:
    """A trial that crashes exactly at ``faults`` (one child per fault, each resuming
    from what the one before left), for tests of named crash points. ``batches``
    defaults to four per fault plus two, so every ``kill@N`` with ``N <= 4`` is reached."""
    return TrialPlan(seed=seed, engine=engine, changelog=changelog,
                     batches=batches if batches is not None else 4 * len(faults) + 2, ops=ops, keys=keys,
                     compact_every=0, retention_ms=86_400_000, faults=tuple(faults), workload=workload)


def reproducer(plan: TrialPlan) -> str:
    return (f"localstate torture --engine {plan.engine} --changelog {plan.changelog} --trials 1 "
            f"--seed {plan.seed} --batches {plan.batches} --ops {plan.ops}" + (" --fsync" if plan.fsync else "")
            + (f" --workload {plan.workload}" if plan.workload else ""))


def engine_slug(engine: str) -> str:
    """The last name of an engine reference (``pkg.mod:Factory`` → ``Factory``), for paths and job names."""
    return engine.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
