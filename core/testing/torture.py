"""Crash trials: kill a task at random moments and at named fault points, verify no loss.

One **trial** (``seed``) on one engine × changelog system:

1. a *reference run* applies the seed's deterministic workload — ``batches`` input
   batches of puts, read-modify-write increments and deletes (or the engine's own
   operations), one commit per batch with ``input_position = batch`` — in this
   process without faults, recording what the store shows after every commit;
2. a *child process* (``python -c ...child_main``) runs the same workload on fresh
   directories and is SIGKILLed, either at a named fault point armed through
   ``LOCALSTATE_FAULTS`` (``commit.after_changelog_flush=kill@3``, ``restore.mid``,
   ``compaction.mid``, ...) or by the parent after a random delay; this repeats for
   1–3 crash rounds, each new child restoring from what the killed one left behind;
3. every child, right after it reopened the task, reports the checkpoint's
   ``input_position`` ``p`` and what the store shows; it must equal the reference at
   ``p`` (exact restore to the last commit), then the child replays the input from
   ``p + 1`` on;
4. a last child runs without faults to the end; the parent reopens the task and
   checks the final state (the user-level view and the engine's change records for
   every key ever logged) against the reference.

On the objectstore changelog a crash round may instead make a **zombie** (``zombie:<k>@<s>``):
the child is stopped (SIGSTOP) ``s`` seconds after its ``k``-th commit, the next child
takes the task over, and once that one has opened the stopped child is resumed: it goes
on uploading, rolling up and committing beside the new owner (with other operations: its
input moved on) until its commit fails with ``FencedError`` (the only way it may end
besides finishing first). Whatever it still lands, on the store or in its own local copy,
must change nothing the later children (which run on the zombie's machine) and the final
check see.

Any difference is a **divergence**, classified as lost / duplicated / resurrected /
differing keys and reported with the command that reproduces it
(``localstate torture --engine E --changelog C --trials 1 --seed S``; timer kills
depend on timing, named fault points are exact).

Workloads reach the engine through a :class:`WorkloadAdapter`
(:mod:`localstate.testing.torture_adapters`): key-value engines through the
KeyValueStore API, other engines through an adapter for their API, registered with
:func:`register_adapter`. A named workload (``--workload ttl-timers``) drives a feature
over each key-value engine instead: TTL expiry and timers, killed around the sweep and
the firing (see :class:`~localstate.testing.torture_adapters.TtlTimersWorkload`).
Plans (fault points, configs, reproducers) are :mod:`localstate.testing.torture_plans`;
the workload in one process and the reference run :mod:`~localstate.testing.torture_work`;
the child processes :mod:`~localstate.testing.torture_children`; one trial
:mod:`~localstate.testing.torture_trial`. This module runs many trials and is the
``localstate torture`` command.
"""


from __future__ import annotations

import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from localstate.registry import available, did_you_mean

from .torture_adapters import (
    BloomWorkload,
    HyperLogLogWorkload,
    KeyValueWorkload,
    SearchWorkload,
    TopNWorkload,
    WorkloadAdapter,
    adapter_for,
    register_adapter,
    torture_engines,
    workloads,
)
from .torture_children import run_child
from .torture_plans import (
    COMMIT_POINTS,
    CRASH_POINTS,
    OBJECTSTORE_POINTS,
    STORE,
    TORTURE_BUCKET,
    TrialPlan,
    engine_slug,
    kill_plan,
    plan_trial,
    reproducer,
)
from .torture_trial import TrialResult, run_trial
from .torture_work import child_main, reference_run

__all__ = [
    "STORE",
    "CRASH_POINTS",
    "COMMIT_POINTS",
    "OBJECTSTORE_POINTS",
    "TrialPlan",
    "TrialResult",
    "TortureReport",
    "WorkloadAdapter",
    "KeyValueWorkload",
    "TopNWorkload",
    "HyperLogLogWorkload",
    "BloomWorkload",
    "SearchWorkload",
    "register_adapter",
    "adapter_for",
    "torture_engines",
    "plan_trial",
    "kill_plan",
    "reference_run",
    "run_child",
    "run_trial",
    "run_trials",
    "child_main",
    "torture",
    "reproducer",
]


# -- many trials ------------------------------------------------------------------------------------------
@dataclass
class TortureReport:
    engine: str
    changelog: str
    results: list[TrialResult]
    seconds: float

    @property
    def divergences(self) -> list[TrialResult]:
        return [r for r in self.results if not r.ok]

    def summary(self) -> dict[str, Any]:
        restores = [s for r in self.results for s in r.restores]
        kinds = ("lost", "duplicated", "resurrected", "differs")
        return {
            "engine": self.engine,
            "changelog": self.changelog,
            "trials": len(self.results),
            "crashes": sum(r.crashes for r in self.results),
            "zombies": sum(r.zombies for r in self.results),
            "moves": sum(r.moves for r in self.results),
            "divergences": len(self.divergences),
            **{kind: sum(len((r.divergence or {}).get(kind, [])) for r in self.results) for kind in kinds},
            "restores": len(restores),
            "restore_median_s": statistics.median(restores) if restores else None,
            "restore_max_s": max(restores) if restores else None,
            "seconds": self.seconds,
            "first_divergence": self.divergences[0].divergence if self.divergences else None,
        }


@contextmanager
def _s3_endpoint(endpoint: str | None) -> Iterator[str]:
    """The S3 endpoint of objectstore trials (a moto server started here if none is given),
    with the bucket TORTURE_BUCKET on it."""
    from localstate.testing.s3 import MotoServer

    if endpoint:
        server = MotoServer(int(endpoint.rstrip("/").rsplit(":", 1)[1]))  # not started: a client only
        try:
            server.create_bucket(TORTURE_BUCKET)
        except Exception as e:  # the bucket exists from an earlier run
            if "BucketAlready" not in str(e):
                raise
        yield endpoint
        return
    with MotoServer() as server:
        server.create_bucket(TORTURE_BUCKET)
        yield server.endpoint


@contextmanager
def _kafka_bootstrap(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap`` itself, or a broker started here: tansu, or Apache Kafka for ``"apache"``."""
    if bootstrap and bootstrap != "apache":
        yield bootstrap
        return
    from localstate.testing.apache_kafka import ApacheKafkaBroker
    from localstate.testing.kafka import TansuBroker

    with ApacheKafkaBroker() if bootstrap == "apache" else TansuBroker() as broker:
        yield broker.bootstrap


def run_trials(engine: str, changelog: str, trials: int, seed: int, *, batches: int = 12, ops: int = 40,
               bootstrap: str | None = None, workdir: Path | None = None, fail_fast: bool = False,
               fsync: bool = False, jobs: int = 1, workload: str | None = None,
               progress: Callable[[TrialResult], None] | None = None) -> TortureReport:
    """Trials ``seed .. seed + trials - 1`` of ``engine`` × ``changelog``, ``jobs`` at a time."""
    t0 = time.perf_counter()
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="localstate-torture-")) if own else Path(workdir)
    results: list[TrialResult] = []
    stop = threading.Event()

    def one(i: int) -> TrialResult | None:
        if stop.is_set():
            return None
        plan = plan_trial(seed + i, engine, changelog, batches=batches, ops=ops, fsync=fsync, workload=workload)
        tdir = root / f"{engine_slug(engine)}-{changelog}-{plan.seed}"
        res = run_trial(plan, tdir, bootstrap)
        if res.ok:
            shutil.rmtree(tdir, ignore_errors=True)
        else:
            res.divergence["workdir"] = str(tdir)
            if fail_fast:
                stop.set()
        if progress is not None:
            progress(res)
        return res

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for res in pool.map(one, range(trials)):
                if res is not None:
                    results.append(res)
    finally:
        if own and all(r.ok for r in results):
            shutil.rmtree(root, ignore_errors=True)
    return TortureReport(engine, changelog, results, time.perf_counter() - t0)


# -- command line -----------------------------------------------------------------------------------------
@click.command(name="torture")
@click.option("--engine", "engines", multiple=True, default=("memory",), show_default=True,
              help="engine name or module:Factory; 'all' = every installed engine + contrib examples")
@click.option("--changelog", "changelogs", multiple=True, default=("file",), show_default=True,
              type=click.Choice(["file", "kafka", "objectstore", "all"]), help="changelog system(s)")
@click.option("--trials", type=click.IntRange(min=1), default=20, show_default=True, help="trials per engine × changelog")
@click.option("--seed", type=int, default=None, help="first trial seed [default: random, printed]")
@click.option("--batches", type=click.IntRange(min=2), default=12, show_default=True, help="input batches (commits) per trial")
@click.option("--ops", type=click.IntRange(min=1), default=40, show_default=True, help="operations per batch")
@click.option("--bootstrap", default=None, help="Kafka brokers for kafka trials; 'apache' starts an Apache Kafka node [default: start a tansu broker]")
@click.option("--s3-endpoint", default=None,
              help="S3 endpoint (http://host:port) for objectstore trials [default: start a moto server]; "
                   "'file' runs them on file:// directories")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where trials run [default: a temporary directory; diverged trials are kept]")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the summaries and divergences here")
@click.option("--fail-fast/--no-fail-fast", default=False, help="stop an engine's trials at the first divergence")
@click.option("--fsync/--no-fsync", default=False, show_default=True,
              help="fsync the file changelog (a SIGKILL loses no page cache, so trials do not need it)")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True, help="trials run in parallel")
@click.option("--workload", type=click.Choice(workloads()), default=None,
              help="a named workload over each key-value engine instead of its own (ttl-timers: kills "
                   "around TTL expiry and timer firing)")
def torture(engines: tuple[str, ...], changelogs: tuple[str, ...], trials: int, seed: int | None, batches: int,
            ops: int, bootstrap: str | None, s3_endpoint: str | None, workdir: Path | None,
            json_out: Path | None, fail_fast: bool, fsync: bool, jobs: int, workload: str | None) -> None:
    """Crash trials: kill a task at random points, verify no loss.

    Each trial SIGKILLs a task at random moments and named fault points, reopens it,
    replays the input from its checkpoint, and compares with a crash-free run. Exit code 1 if any trial diverged (each divergence prints its reproducer).
    """
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    names = torture_engines() if "all" in engines else list(engines)
    if workload is not None and "all" in engines:  # a named workload runs over key-value engines
        from localstate.config import engine_kind
        from localstate.registry import resolve_factory

        names = [n for n in names if ":" in n or not available()[n]["installed"]
                 or engine_kind(resolve_factory(n)) != "other"]
    systems = ["file", "kafka", "objectstore"] if "all" in changelogs else list(dict.fromkeys(changelogs))
    for name in names:
        if ":" not in name:
            row = available().get(name)
            if row is None:
                raise click.BadParameter(f"unknown engine {name!r}.{did_you_mean(name, available())}",
                                         param_hint="--engine")
            if not row["installed"]:
                raise click.BadParameter(f"engine {name!r} is not installed: {row['hint']}", param_hint="--engine")
    click.echo(f"torture: engines={names} changelogs={systems} trials={trials} seed={seed}")
    summaries = []
    failed = False

    def tick(r: TrialResult) -> None:
        click.echo("." if r.ok else "X", nl=False)

    kafka = _kafka_bootstrap(bootstrap) if "kafka" in systems else None
    brokers = kafka.__enter__() if kafka is not None else None
    s3 = _s3_endpoint(s3_endpoint) if "objectstore" in systems and s3_endpoint != "file" else None
    servers = {"kafka": brokers, "objectstore": s3.__enter__() if s3 is not None else None}
    try:
        for system in systems:
            for name in names:
                click.echo(f"{name} x {system}: ", nl=False)
                report = run_trials(name, system, trials, seed, batches=batches, ops=ops,
                                    bootstrap=servers.get(system),
                                    workdir=workdir, fail_fast=fail_fast, fsync=fsync, jobs=jobs, progress=tick,
                                    workload=workload)
                s = report.summary()
                summaries.append(s)
                med = f"{s['restore_median_s']:.3f}s" if s["restore_median_s"] is not None else "-"
                mx = f"{s['restore_max_s']:.3f}s" if s["restore_max_s"] is not None else "-"
                click.echo(
                    f"\n  {s['trials']} trials, {s['crashes']} crashes"
                    + (f" ({s['zombies']} as zombies)" if s["zombies"] else "")
                    + (f", {s['moves']} moves to another machine" if s["moves"] else "")
                    + f", {s['divergences']} divergences "
                    f"(lost {s['lost']}, duplicated {s['duplicated']}, resurrected {s['resurrected']}), "
                    f"reopen after crash median {med} max {mx}, {s['seconds']:.1f}s"
                )
                if report.divergences:
                    failed = True
                    click.echo(f"  first divergence: {json.dumps(s['first_divergence'], default=str)[:2000]}")
    finally:
        if kafka is not None:
            kafka.__exit__(None, None, None)
        if s3 is not None:
            s3.__exit__(None, None, None)
    if json_out is not None:
        json_out.write_text(json.dumps({"seed": seed, "trials": trials, "summaries": summaries}, indent=2,
                                       default=str))
    if failed:
        raise SystemExit(1)
