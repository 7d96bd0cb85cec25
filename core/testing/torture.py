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
Plans (fault points, configs, reproducers) are :mod:`localstate.testing.torture_plans`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from localstate.config import Config
from localstate.errors import ConfigError, LocalStateError
from localstate.kv import KeyValueStore
from localstate.registry import available, did_you_mean
from localstate.storage import TaskStorage

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
]

CHILD_TIMEOUT_S = 180.0


# -- running the workload (reference run and child) ------------------------------------------------
def _batch_rng(seed: int, batch: int) -> random.Random:
    return random.Random(f"work:{seed}:{batch}")


def _norm(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True))


def _logged_keys(storage: TaskStorage) -> set[bytes]:
    changelog = storage.changelog(STORE)
    ckpt = storage.checkpoint
    if changelog is None or ckpt is None:
        return set()
    return {k for k, _ in changelog.read(0, ckpt.offsets.get(STORE, 0))}


def _fingerprint(storage: TaskStorage, keys: set[bytes]) -> dict[str, str]:
    """The engine's committed change record for each key (hex), tombstones left out."""
    return {k.hex(): v.hex() for k, v in storage.engine(STORE).current(sorted(keys)) if v is not None}


_RESUMED = "LOCALSTATE_TORTURE_RESUMED"
"""A zombie child's environment: a file that exists once it has been resumed beside a newer
instance; from then on each of its batches gets more operations before its commit (its
input moved on), so records it never committed differ from the ones the newer instance
commits at the same offsets."""


def _work(storage: TaskStorage, plan: TrialPlan, adapter: WorkloadAdapter,
          after_commit: Callable[[int], None] | None = None) -> None:
    start = storage.checkpoint.input_position if storage.checkpoint else 0
    store = storage.store(STORE)
    resumed = os.environ.get(_RESUMED)
    for batch in range(int(start or 0) + 1, plan.batches + 1):
        adapter.apply_batch(store, batch, _batch_rng(plan.seed, batch), plan.ops, plan.keys)
        if resumed and os.path.exists(resumed):
            adapter.apply_batch(store, batch, _batch_rng(plan.seed + 7919, batch), plan.ops, plan.keys)
        storage.commit(input_position=batch)
        if plan.compact_every and batch % plan.compact_every == 0:
            storage.compact()
        if after_commit is not None:
            after_commit(batch)


@dataclass
class Reference:
    states: list[Any]
    """``states[p]``: what the store shows after committing input batch ``p``."""
    fingerprint: dict[str, str]
    logged: set[bytes]
    seconds: float


def reference_run(plan: TrialPlan, root: Path) -> Reference:
    """Run ``plan`` without faults in this process, on the file changelog without fsync
    (the reference state does not depend on the changelog system)."""
    adapter = adapter_for(plan.engine, plan.workload)
    values = plan.values(root, None, "ref", changelog="file")
    values["systems.file.fsync"] = False
    config = Config.from_dict(values)
    t0 = time.perf_counter()
    states: list[Any] = []
    with TaskStorage(config) as storage:
        _check_adapter(storage, plan.engine, adapter)
        adapter.open(storage)
        store = storage.store(STORE)
        states.append(_norm(adapter.observe(store, plan.keys)))
        _work(storage, plan, adapter, lambda _b: states.append(_norm(adapter.observe(store, plan.keys))))
        logged = _logged_keys(storage)
        fp = _fingerprint(storage, logged)
    return Reference(states, fp, logged, time.perf_counter() - t0)


def _check_adapter(storage: TaskStorage, engine: str, adapter: WorkloadAdapter) -> None:
    if adapter.key_value and not isinstance(storage.engine(STORE), KeyValueStore):
        raise ConfigError(
            f"engine {engine!r} is not a key-value engine and has no torture workload adapter; "
            "register one with localstate.testing.torture.register_adapter()"
        )


def child_main() -> None:
    """Entry point of a trial's child process: ``argv[1]`` = plan JSON, ``argv[2]`` = config JSON.

    Prints one JSON line when the task is open (position, restore seconds, state) and
    one when the workload is done; a fault point may SIGKILL it anywhere in between.
    """
    plan = TrialPlan(**{**json.loads(sys.argv[1]), "faults": ()})
    config = Config.from_dict(json.loads(sys.argv[2]))
    adapter = adapter_for(plan.engine, plan.workload)
    t0 = time.perf_counter()
    with TaskStorage(config) as storage:
        opened = time.perf_counter() - t0
        adapter.open(storage)
        ckpt = storage.checkpoint
        restored = storage.last_restore.get(STORE)
        line = {
            "event": "opened",
            "position": int(ckpt.input_position or 0) if ckpt else 0,
            "restore_s": opened,
            "records": restored.records if restored else 0,
            "state": adapter.observe(storage.store(STORE), plan.keys),
        }
        print(json.dumps(line, sort_keys=True), flush=True)
        _work(storage, plan, adapter,
              after_commit=lambda batch: print(json.dumps({"event": "committed", "batch": batch}), flush=True))
    print(json.dumps({"event": "done"}), flush=True)


# -- trials ------------------------------------------------------------------------------------------------
@dataclass
class TrialResult:
    seed: int
    engine: str
    changelog: str
    faults: tuple[str, ...]
    crashes: int = 0
    """Children that were really killed (a fault point may not be reached)."""
    zombies: int = 0
    """Children that went on as zombies beside a newer instance (objectstore)."""
    moves: int = 0
    """Times the task moved to another machine's empty state dir after a crash round."""
    restores: list[float] = field(default_factory=list)
    """Seconds each reopen after a crash took (TaskStorage open incl. restore)."""
    restored_records: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    """The committed input position each child found when it opened the task."""
    divergence: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _divergence(plan: TrialPlan, stage: str, position: int, expected: Any, actual: Any,
                adapter: WorkloadAdapter, **extra: Any) -> dict[str, Any]:
    diff = adapter.classify(expected, actual) if isinstance(expected, dict) and isinstance(actual, dict) else {}
    first = next((k for kind in ("lost", "duplicated", "resurrected", "differs") for k in diff.get(kind, [])), None)
    return {
        "stage": stage,
        "position": position,
        **{kind: keys for kind, keys in diff.items()},
        "first_key": first,
        "expected": expected.get(first) if first is not None and isinstance(expected, dict) else None,
        "actual": actual.get(first) if first is not None and isinstance(actual, dict) else None,
        "reproduce": reproducer(plan),
        **extra,
    }


class _Child:
    """One child process of a trial, its output read as it comes (so a zombie round can
    act when the next child has opened the task)."""

    def __init__(self, plan: TrialPlan, values: dict[str, Any], faults: str | None,
                 on_opened: Callable[[], None] | None = None, resumed_flag: Path | None = None) -> None:
        env = dict(os.environ)
        env.pop("LOCALSTATE_FAULTS", None)
        env.pop(_RESUMED, None)
        if faults:
            env["LOCALSTATE_FAULTS"] = faults
        self._flag = resumed_flag
        if resumed_flag is not None:
            env[_RESUMED] = str(resumed_flag)
        cmd = [sys.executable, "-c", "from localstate.testing.torture import child_main; child_main()",
               json.dumps(asdict(plan)), json.dumps(values)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[dict] = []
        self.opened = threading.Event()
        self.commits = 0
        self.committed = threading.Condition()
        self.stopped = False
        self._on_opened = on_opened
        self._err = b""
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line cut by the kill
            self.lines.append(line)
            if line.get("event") == "committed":
                with self.committed:
                    self.commits += 1
                    self.committed.notify_all()
            if line.get("event") == "opened":
                self.opened.set()
                if self._on_opened is not None:
                    self._on_opened()
        self.opened.set()
        with self.committed:
            self.commits = 1 << 30  # ended: nobody waits for more
            self.committed.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self._err = self.proc.stderr.read()

    @property
    def err(self) -> str:
        return self._err.decode(errors="replace")[-2000:]

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> int | None:
        """The exit code (None: killed after ``timeout``), all output read."""
        try:
            rc: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        for t in self._threads:
            t.join(10)
        return rc

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self, *, fenced: bool = False) -> None:
        """Continue a stopped child; ``fenced``: a newer instance has opened the task, so
        the child is a zombie from here on (its input moves on: see ``_RESUMED``)."""
        if self.stopped:
            self.stopped = False
            if fenced and self._flag is not None:
                self._flag.touch()
            os.kill(self.proc.pid, signal.SIGCONT)

    def resume_fenced(self) -> None:
        self.resume(fenced=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_child(plan: TrialPlan, values: dict[str, Any], fault: str | None,
              on_opened: Callable[[], None] | None = None) -> tuple[int | None, list[dict], str]:
    """Run one child with ``fault`` (a fault point spec, ``timer:<s>`` or None) to its end;
    ``on_opened`` is called once it has opened the task."""
    timer = fault is not None and fault.startswith("timer:")
    child = _Child(plan, values, None if timer else fault, on_opened)
    if timer:
        assert fault is not None
        try:
            child.proc.wait(timeout=float(fault.split(":", 1)[1]))
        except subprocess.TimeoutExpired:
            os.kill(child.proc.pid, signal.SIGKILL)
    rc = child.wait()
    return rc, child.lines, child.err


def _zombie_machine(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` on the zombie's machine: a state dir of its own (the next child must not
    meet its task lock)."""
    return {**values, "job.state.dir": str(Path(values["job.state.dir"]).with_name("zombie-state"))}


def _moved_machine(values: dict[str, Any], round_no: int) -> dict[str, Any]:
    """``values`` on the machine the task moves to after round ``round_no``: a state dir
    of its own, empty."""
    return {**values, "job.state.dir": str(Path(values["job.state.dir"]).with_name(f"moved-{round_no}-state"))}


def _start_zombie(plan: TrialPlan, values: dict[str, Any], spec: str) -> _Child:
    """A child on the zombie's machine stopped ``s`` seconds after it opened the task and
    made its ``k``-th commit (``spec`` = ``"k@s"``; unless it ended first)."""
    commits, _, pause = spec.partition("@")
    machine = _zombie_machine(values)
    flag = Path(machine["job.state.dir"]).with_name(f"resumed-{uuid.uuid4().hex[:8]}")
    child = _Child(plan, machine, None, resumed_flag=flag)
    child.opened.wait(CHILD_TIMEOUT_S)  # it claimed the task: the next child fences it
    with child.committed:
        child.committed.wait_for(lambda: child.commits >= int(commits), CHILD_TIMEOUT_S)
    try:
        child.proc.wait(timeout=float(pause or 0))
    except subprocess.TimeoutExpired:
        child.stop()
    return child


def _zombie_ending(zombie: _Child, plan: TrialPlan) -> dict[str, Any] | None:
    """Resume a zombie (if the newer child never opened the task, as the owner it may still
    be) and wait for it: it must finish, or fail its commit with FencedError; anything else
    is a divergence."""
    zombie.resume()
    rc = zombie.wait()
    if rc == 0 and any(x.get("event") == "done" for x in zombie.lines):
        return None
    if rc == 1 and "FencedError" in zombie.err:
        return None
    return {"stage": "zombie (a stopped child resumed beside a newer one)", "returncode": rc,
            "stderr": zombie.err, "reproduce": reproducer(plan)}


def run_trial(plan: TrialPlan, workdir: Path, bootstrap: str | None = None) -> TrialResult:
    """Run one trial in ``workdir`` (created; left for inspection if the trial diverges)."""
    t0 = time.perf_counter()
    adapter = adapter_for(plan.engine, plan.workload)
    result = TrialResult(plan.seed, plan.engine, plan.changelog, plan.faults)
    ref = reference_run(plan, workdir / "ref")
    values = plan.values(workdir / "crash", bootstrap, "", namespace=uuid.uuid4().hex[:8])
    _run_rounds(plan, values, ref, adapter, result)
    if result.divergence is None:
        try:
            result.divergence = _verify_final(plan, values, ref, adapter)
        except LocalStateError as e:  # the last open refused: damage a trial must never leave
            result.divergence = {"stage": "final open", "error": str(e), "reproduce": reproducer(plan)}
    result.seconds = time.perf_counter() - t0
    return result


def _run_rounds(plan: TrialPlan, values: dict[str, Any], ref: Reference, adapter: WorkloadAdapter,
                result: TrialResult) -> None:
    """The crash rounds of one trial and its last child (a divergence ends them)."""
    crashed_before = False
    zombie: _Child | None = None
    try:
        for round_no, fault in enumerate((*plan.faults, None)):
            if fault is not None and fault.startswith("zombie:"):
                if zombie is not None:
                    raise ConfigError(f"{fault}: one zombie round per trial ({reproducer(plan)})")
                child = _start_zombie(plan, values, fault.split(":", 1)[1])
                rc, lines, err = (None if child.stopped else child.wait()), child.lines, ""
            else:
                rc, lines, err = run_child(plan, values, fault, on_opened=zombie.resume_fenced if zombie else None)
                child = None
            if not _round(plan, ref, adapter, result, fault, rc, lines, child.err if child else err,
                          crashed_before, child):
                return
            if child is not None and child.stopped:
                zombie = child
                crashed_before = True
                continue
            crashed_before = crashed_before or rc == -signal.SIGKILL
            if round_no in plan.moves and zombie is None:
                # the task moves: the next child starts on another machine's empty state dir
                values.update(_moved_machine(values, round_no))
                result.moves += 1
            if zombie is not None:
                result.divergence = _zombie_ending(zombie, plan)
                result.zombies += 1
                zombie = None
                if result.divergence is not None:
                    return
                # the rest of the trial (and the final check) runs on the zombie's machine:
                # its local copy, built from records it never committed, must not be trusted
                values.update(_zombie_machine(values))
    finally:
        if zombie is not None:
            zombie.kill()


def _round(plan: TrialPlan, ref: Reference, adapter: WorkloadAdapter, result: TrialResult, fault: str | None,
           rc: int | None, lines: list[dict], err: str, crashed_before: bool, zombie: _Child | None) -> bool:
    """Check one child's round (``zombie``: the child was stopped to go on as a zombie
    later); False, with ``result.divergence`` set, to stop the trial."""
    opened = next((x for x in lines if x.get("event") == "opened"), None)
    if opened is not None:
        pos = opened["position"]
        result.positions.append(pos)
        if crashed_before:
            result.restores.append(opened["restore_s"])
            result.restored_records.append(opened["records"])
        if not 0 <= pos <= plan.batches or _norm(opened["state"]) != ref.states[pos]:
            expected = ref.states[pos] if 0 <= pos <= plan.batches else None
            result.divergence = _divergence(plan, f"reopen after {result.crashes} crash(es)", pos,
                                            expected, _norm(opened["state"]), adapter, fault=fault)
            return False
    if zombie is not None and zombie.stopped:
        result.crashes += 1  # a takeover, as after a kill
        return True
    killed = rc == -signal.SIGKILL
    if rc is None or not (rc == 0 or (killed and fault is not None)):
        result.divergence = {"stage": f"child with fault {fault!r}", "returncode": rc, "stderr": err,
                             "reproduce": reproducer(plan)}
        return False
    if killed:
        result.crashes += 1
    elif not any(x.get("event") == "done" for x in lines):
        result.divergence = {"stage": f"child with fault {fault!r} exited 0 without finishing",
                             "stderr": err, "reproduce": reproducer(plan)}
        return False
    return True


def _verify_final(plan: TrialPlan, values: dict[str, Any], ref: Reference,
                  adapter: WorkloadAdapter) -> dict[str, Any] | None:
    with TaskStorage(Config.from_dict(values)) as storage:
        adapter.open(storage)
        ckpt = storage.checkpoint
        pos = int(ckpt.input_position or 0) if ckpt else 0
        state = _norm(adapter.observe(storage.store(STORE), plan.keys))
        if pos != plan.batches or state != ref.states[-1]:
            return _divergence(plan, "final state", pos, ref.states[-1], state, adapter)
        fp = _fingerprint(storage, ref.logged | _logged_keys(storage))
    if fp != ref.fingerprint:
        return _divergence(plan, "final change records (engine.current)", pos, ref.fingerprint, fp, adapter)
    return None


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
