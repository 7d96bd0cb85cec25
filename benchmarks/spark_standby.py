"""Standby replicas on ``local-cluster[3,1,1024]``: what a move costs after an executor
kill, with and without a standby, and what following costs per micro-batch.

The growing rocksdb key count of :mod:`localstate.benchmarks.spark_cluster` (6 tasks,
file changelog shared, a state dir per executor, one Parquet file per micro-batch) runs
twice per round, interleaved: ``job.standby.replicas = 0`` and ``= 1``. In micro-batch
:data:`KILL_BATCH` the executor JVM running the first task run seen starting is
SIGKILLed; Spark re-runs its tasks elsewhere (with standbys: on their standby
executors) and the local-cluster worker launches a new executor.

Rows per variant: ``standby_move_replayed`` (records replayed by the first open of each
partition the kill moved, the mean over those partitions; notes: per partition, and the
partition's changelog size then), ``standby_batch_ms`` (median micro-batch
``triggerExecution`` before the kill, the first :data:`SKIPPED_BATCHES` left out; the
standby row carries the ratio to the one without), ``standby_follow_ms`` (the standby
variant only: the median of the follows' own time per task, from the follow reports),
``standby_kill_batch_ms`` (the micro-batch of the kill), ``standby_follow_job_ms`` (the
standby variant only: the follow job's wall time per micro-batch, what a run waits for),
each with the machine load (``uptime``) in the notes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runner import make_row
from .spark_cluster import SKIPPED_BATCHES, TASKS, ClusterSizes, write_growing_input

__all__ = ["STANDBY_FULL", "STANDBY_QUICK", "KILL_BATCH", "KilledRun", "drive_killed", "move_figures", "run", "main"]

MASTER = "local-cluster[3,1,1024]"
EXECUTORS = 3
STANDBY_FULL = ClusterSizes(batches=8, new=100_000, repeat=50_000)
STANDBY_QUICK = ClusterSizes(batches=6, new=2_000, repeat=1_000)
KILL_BATCH = 5
"""The micro-batch in which an executor is killed (standbys are warm by then)."""
VARIANTS = {"no standby": 0, "standby": 1}


@dataclass
class KilledRun:
    variant: str
    batch_ms: list[float]
    """``triggerExecution`` of every data micro-batch."""
    events: list[dict[str, Any]]
    follows: dict[int, dict[str, Any]]
    """Per version: ``{"seconds": the follow job's wall time, "reports": [...]}``."""
    victim: dict[str, Any]
    load: tuple[str, str]


def _load() -> str:
    return repr(os.getloadavg())


def drive_killed(input_dir: Path, root: Path, replicas: int, kill_batch: int = KILL_BATCH) -> KilledRun:
    """The stream with ``job.standby.replicas = replicas``, the executor of the first run of
    ``kill_batch`` seen starting SIGKILLed (the run may be mid-task or past its commit)."""
    from localstate.testing.processes import descendants, executor_jvms, kill_all
    from localstate.testing.spark_cluster_driver import STANDBY_FOLLOWS, event_batch, read_events

    cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream", "--root", str(root),
           "--input", str(input_dir), "--input-format", "parquet", "--partitions", str(TASKS),
           "--locality-wait", "3s", "--master", MASTER, "--standby-replicas", str(replicas)]
    before = _load()
    log = root.with_suffix(".log")
    victim: dict[str, Any] | None = None
    seen: dict[int, int] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        try:
            while proc.poll() is None:
                if victim is None:
                    for e in read_events(root / "stream"):
                        if e["phase"] == "start" and event_batch(e) == kill_batch:
                            jvms = executor_jvms(proc.pid)
                            if e["executor"] in jvms:
                                os.kill(jvms[e["executor"]], signal.SIGKILL)
                                victim = {**e, "kill_time": time.time()}
                            break
                seen.update(descendants(proc.pid))
                time.sleep(0.02)
        finally:
            seen.update(descendants(proc.pid))
            kill_all(seen)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    result = json.loads((root / "result.json").read_text()) if (root / "result.json").exists() else {}
    if proc.returncode != 0 or result.get("status") != "ok" or victim is None:
        raise RuntimeError(f"the standby={replicas} driver failed ({proc.returncode}, victim {victim}): "
                           f"{result.get('error')}; log {log}")
    import pyspark

    shutil.rmtree(Path(pyspark.__file__).parent / "work" / result["app_id"], ignore_errors=True)
    follows_path = root / "stream" / STANDBY_FOLLOWS
    follows = ({int(v): r for v, r in json.loads(follows_path.read_text()).items()} if follows_path.exists()
               else {})
    data = [ms for ms, rows in zip(result["batch_ms"], result["batch_rows"]) if rows]
    return KilledRun("standby" if replicas else "no standby", data, read_events(root / "stream"), follows, victim,
                     (before, _load()))


def move_figures(events: list[dict[str, Any]], victim: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per partition the kill moved (those whose last committed run before the kill was
    on the victim's executor, and those with a run there cut short by the kill): the first
    open after the kill — where it ran, the records it replayed, and the committed
    changelog offset it restored to."""
    before = [e for e in events if e["time"] < victim["kill_time"]]
    closed = {e["run"] for e in before if e["phase"] == "close"}
    home: dict[int, str] = {}
    for e in before:
        if e["phase"] == "close" and e["version"] is not None:
            home[e["partition"]] = e["executor"]
    cut = {e["partition"] for e in before if e["phase"] == "start" and e["run"] not in closed
           and e["executor"] == victim["executor"]}
    lost = sorted(cut | {p for p, executor in home.items() if executor == victim["executor"]})
    out = {}
    for p in lost:
        first = next((e for e in events if e["phase"] == "start" and e["partition"] == p
                      and e["time"] > victim["kill_time"]), None)
        if first is not None:
            out[p] = {"executor": first["executor"], "replayed": first["restore_records"],
                      "changelog": first["restore_committed"]}
    return out


def _rows(runs: list[KilledRun], sizes: ClusterSizes) -> list[dict[str, Any]]:
    params = {"tasks": TASKS, "batches": sizes.batches, "rows_per_batch": sizes.new + sizes.repeat,
              "kill_batch": KILL_BATCH}
    rows: list[dict[str, Any]] = []
    steady: dict[str, list[float]] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r.variant == variant]
        if not mine:
            continue
        loads = "; ".join(f"load {a} -> {b}" for r in mine for a, b in [r.load])
        moved = [move_figures(r.events, r.victim) for r in mine]
        replayed = [statistics.mean(m["replayed"] for m in fig.values()) if fig else 0.0 for fig in moved]
        rows.append(make_row("standby_move_replayed", variant, params, "records", replayed, notes=(
            "; ".join(f"partition {p}: {m['replayed']} of {m['changelog']} on executor {m['executor']}"
                      for fig in moved for p, m in fig.items()) + f"; {loads}")))
        steady[variant] = [float(statistics.median(r.batch_ms[SKIPPED_BATCHES:KILL_BATCH] or r.batch_ms))
                           for r in mine]
        notes = f"median micro-batch ms before the kill per run {[round(x) for x in steady[variant]]}; {loads}"
        if variant != "no standby" and steady.get("no standby"):
            ratio = statistics.median(steady[variant]) / statistics.median(steady["no standby"])
            notes = f"{ratio:.2f}x no standby; " + notes
        rows.append(make_row("standby_batch_ms", variant, params, "ms", steady[variant], notes=notes))
        kill_ms = [r.batch_ms[KILL_BATCH] for r in mine if len(r.batch_ms) > KILL_BATCH]
        if kill_ms:
            rows.append(make_row("standby_kill_batch_ms", variant, params, "ms", kill_ms,
                                 notes=f"the micro-batch in which the executor was killed; {loads}"))
        follow_s = [r.get("seconds", 0.0) for run in mine for v, f in run.follows.items() if v < KILL_BATCH
                    for r in f["reports"]]
        if follow_s:
            ms = [1000.0 * x for x in follow_s]
            rows.append(make_row("standby_follow_ms", variant, params, "ms per task", ms,
                                 notes=f"each follow's own time, in the follow job's task; {loads}"))
            job_ms = [1000.0 * f["seconds"] for run in mine for v, f in run.follows.items()
                      if SKIPPED_BATCHES <= v < KILL_BATCH]
            rows.append(make_row("standby_follow_job_ms", variant, params, "ms per micro-batch", job_ms,
                                 notes=f"the follow job's wall time on the driver (what a micro-batch waits); "
                                       f"{loads}"))
    return rows


MAX_ROUNDS = 2


def run(quick: bool = False, repeats: int = 2, variants: list[str] | None = None) -> list[dict[str, Any]]:
    """Interleaved rounds (``variants``, default: no standby, standby): ``min(repeats,
    MAX_ROUNDS)``; ``quick``: one round of the standby variant only (CI's check that the
    suite runs; the cluster rows already show a move without one)."""
    sizes = STANDBY_QUICK if quick else STANDBY_FULL
    repeats = 1 if quick else max(1, min(repeats, MAX_ROUNDS))
    work = Path(tempfile.mkdtemp(prefix="localstate-standby-bench-"))
    try:
        write_growing_input(work / "input", sizes)
        runs = []
        for i in range(repeats):
            for variant in variants or (["standby"] if quick else list(VARIANTS)):
                replicas = VARIANTS[variant]
                root = work / f"run-{i}-{replicas}"
                result = drive_killed(work / "input", root, replicas)
                shutil.rmtree(root, ignore_errors=True)
                runs.append(result)
                print(f"{variant}: batches ms {[round(x) for x in result.batch_ms]}, moved "
                      f"{move_figures(result.events, result.victim)}, load {result.load}", file=sys.stderr)
        return _rows(runs, sizes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=MAX_ROUNDS)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--variants", default=None, help=f"';'-separated, of {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    rows = run(args.quick, args.repeats, args.variants.split(";") if args.variants else None)
    text = json.dumps(rows, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
