"""A stateful stream on a Spark cluster vs the same stream on one machine.

The rocksdb key count of :mod:`localstate.testing.spark_cluster_driver` (file changelog
shared, ``job.state.dir`` per executor), 6 tasks, one Parquet file per micro-batch, the
state growing every batch: batch ``b`` brings ``new`` keys never seen before and
``repeat`` rows of keys seen earlier (full size: 12 batches of 200k new + 100k repeated,
2.4M keys at the end; quick: 4 of 2k + 1k). The same input runs on
``local-cluster[3,1,1024]`` (3 executor JVMs, each with its own state dir; the Spark
default ``spark.locality.wait``), on ``local[3]``, and on the cluster again with the
job's affinity off, interleaved (cluster, local, cluster without affinity, cluster, …),
each in its own driver process (one SparkContext per process), and the same stream with
no state at all on both masters (the floor: shuffle by key, count each Arrow batch in
Python, write the rows the same way), so the cluster's own price and the price of state
are told apart; the full suite also
runs it on a standalone cluster of a master and 3 workers started from the PySpark
installation (state in each worker's own directory; ``LOCALSTATE_CLUSTER_STANDALONE=0``
leaves it out).

Rows per master: ``cluster_batch_ms`` (median micro-batch ``triggerExecution`` over the
data batches after the first two; a cluster row carries the ratio to ``local[3]``, a
stateful row the ratio to its master's floor, and every row the median parts of a
micro-batch: the driver's own, the Spark stages' wall and task time, the scheduling and
gaps between them),
``cluster_moves`` (the share of task runs on another executor than the partition's
previous run, in %), ``cluster_replayed`` (changelog records replayed per micro-batch,
the mean over the batches after the first), each with the machine load (``uptime``) at
the start and end of its runs in the notes; ``cluster_disk`` (the largest executor's
state dir against its share of the state: one copy of every partition over the
executors; ``1.0`` = it holds exactly its share). Then the standby rows of
:mod:`localstate.benchmarks.spark_standby` (``LOCALSTATE_CLUSTER_STANDBY=0`` leaves them out).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runner import make_row
from .timing import Stopwatch

__all__ = ["ClusterSizes", "CLUSTER_FULL", "STANDALONE", "NO_AFFINITY", "CLUSTER_QUICK", "write_growing_input", "ClusterRun", "drive",
           "moves_and_replay", "run", "main"]

TASKS = 6
LOCAL_CLUSTER = "local-cluster[3,1,1024]"
LOCAL = "local[3]"
STANDALONE = "standalone[3 workers]"
"""A Spark standalone cluster of a master and 3 workers (1 core, 1 GiB each), started for
the run (:class:`~localstate.testing.spark_standalone.StandaloneCluster`)."""
STANDALONE_ENV = "LOCALSTATE_CLUSTER_STANDALONE"
"""``0``: leave the standalone cluster's runs out of the full suite."""
STANDBY_ENV = "LOCALSTATE_CLUSTER_STANDBY"
"""``0``: leave the standby runs (:mod:`localstate.benchmarks.spark_standby`: an executor
killed with and without standby replicas) out of the suite."""
SKIPPED_BATCHES = 2
"""Data batches left out of the batch time (the first visits of the Python workers)."""


@dataclass(frozen=True)
class ClusterSizes:
    batches: int
    new: int
    repeat: int


CLUSTER_FULL = ClusterSizes(batches=12, new=200_000, repeat=100_000)
CLUSTER_QUICK = ClusterSizes(batches=4, new=2_000, repeat=1_000)


def write_growing_input(directory: Path, sizes: ClusterSizes, seed: int = 5) -> int:
    """One Parquet file per micro-batch (oldest mtime first), rows ``{"user_id"}``;
    returns the number of distinct keys at the end."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    base = time.time() - sizes.batches - 10
    for b in range(sizes.batches):
        fresh = np.arange(b * sizes.new, (b + 1) * sizes.new)
        old = rng.integers(0, max(b * sizes.new, 1), sizes.repeat) if b else rng.integers(0, sizes.new, sizes.repeat)
        ids = rng.permutation(np.concatenate([fresh, old]))
        names = pa.array([f"user-{i:08d}" for i in ids.tolist()], pa.string())
        path = directory / f"part-{b:04d}.parquet"
        pq.write_table(pa.table({"user_id": names}), path)
        os.utime(path, (base + b, base + b))
    return sizes.batches * sizes.new


def _load() -> str:
    return os.getloadavg().__repr__()


@dataclass
class ClusterRun:
    master: str
    batch_ms: list[float]
    moves: int
    runs: int
    replayed: list[int]
    load: tuple[str, str]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def disk_per_executor(state_dirs: list[Path], job: str) -> tuple[dict[str, int], float]:
    """Bytes of ``job``'s store copies in each executor's state dir, and the largest one
    over its share (one copy of every store partition — the largest of its copies, the
    newest in a growing state — divided by the number of executors)."""
    from localstate.inspect import dir_size

    per_executor: dict[str, int] = {}
    copy_size: dict[str, int] = {}
    for state in state_dirs:
        total = 0
        for pdir in sorted((state / job).glob("*/[0-9]*")):
            if pdir.is_dir():
                _, size = dir_size(pdir)
                total += size
                key = f"{pdir.parent.name}/{pdir.name}"
                copy_size[key] = max(copy_size.get(key, 0), size)
        per_executor[state.name if state.name != "state" else state.parent.name] = total
    share = sum(copy_size.values()) / max(1, len(state_dirs))
    return per_executor, (max(per_executor.values(), default=0) / share if share else 0.0)


def moves_and_replay(events: list[dict[str, Any]]) -> tuple[int, int, list[int]]:
    """(moved runs, runs that had a previous run, records replayed per micro-batch) of
    the committed runs in ``events``."""
    from localstate.testing.spark_cluster_driver import event_batch

    last: dict[int, str] = {}
    moves = runs = 0
    replayed: dict[int, int] = {}
    for e in events:
        if e["phase"] == "start":
            replayed[event_batch(e)] = replayed.get(event_batch(e), 0) + e["restore_records"]
        elif e["version"] is not None and e["version"] == event_batch(e):
            p = e["partition"]
            if p in last:
                runs += 1
                moves += last[p] != e["executor"]
            last[p] = e["executor"]
    return moves, runs, [replayed[b] for b in sorted(replayed)]


NO_AFFINITY = " (affinity off)"
"""Suffix of a master's name in the rows when the job ran with ``affinity=False``."""
FLOOR = " (no state)"
"""Suffix of a master's name in the rows of the floor: the same stream with no state
(:func:`~localstate.testing.spark_cluster_driver.run_floor`)."""


def drive(master: str, input_dir: Path, root: Path) -> ClusterRun:
    """The stream over ``input_dir`` on ``master`` (with :data:`NO_AFFINITY` at its end:
    ``StatefulJob(affinity=False)``), in a driver process of its own."""
    from localstate.testing.spark_cluster_driver import JOB_NAME, read_events
    from localstate.testing.spark_standalone import WORKER_STATE_ENV, StandaloneCluster

    cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream", "--root", str(root),
           "--input", str(input_dir), "--input-format", "parquet", "--partitions", str(TASKS),
           "--locality-wait", "3s"]
    if master.endswith(NO_AFFINITY):
        cmd.append("--no-affinity")
    if master.endswith(FLOOR):
        cmd.append("--floor")
    before = _load()
    with Stopwatch() as watch:
        log = root.with_suffix(".log")
        cluster = None
        if _base(master) == STANDALONE:
            cluster = StandaloneCluster(root.with_name(root.name + "-cluster"), workers=3).start()
            cmd += ["--master", cluster.url, "--executors", "3", "--state-dir", f"{{env:{WORKER_STATE_ENV}}}"]
        else:
            cmd += ["--master", _base(master)]
        try:
            with log.open("wb") as out:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        finally:
            if cluster is not None:
                cluster.stop()
        result = json.loads((root / "result.json").read_text()) if (root / "result.json").exists() else {}
        if proc.returncode != 0 or result.get("status") != "ok":
            raise RuntimeError(f"the {master} driver failed ({proc.returncode}): {result.get('error')}; log {log}")
        moves, runs, replayed = moves_and_replay(read_events(root / "stream"))
        data = [ms for ms, rows in zip(result["batch_ms"], result["batch_rows"]) if rows]
        if cluster is not None:
            state_dirs = sorted(root.with_name(root.name + "-cluster").glob("worker-*/state"))
        else:
            state_dirs = sorted(p for p in (root / "stream" / "state").glob("*") if p.is_dir() and master != LOCAL)
        disk = disk_per_executor(state_dirs, JOB_NAME) if state_dirs else ({}, 0.0)
    return ClusterRun(master, data, moves, runs, replayed, (before, _load()), watch.wall,
                      {"app_id": result.get("app_id"), "disk": disk, "parts": batch_parts(result)})


def batch_parts(result: dict[str, Any]) -> dict[str, float]:
    """Median ms per data micro-batch (after the first :data:`SKIPPED_BATCHES`) of a
    driver's ``result.json``: the driver's own part (offsets, planning, logs: the trigger
    minus ``addBatch``), the stages' wall time (first task launch to completion, summed),
    the stages' task time (summed over tasks), and the rest of ``addBatch`` (scheduling,
    the gaps between jobs and stages, the driver's ``foreachBatch`` code)."""
    stages = result.get("stages") or {}
    parts: dict[str, list[float]] = {}
    rows = result.get("batch_rows") or []
    data = [i for i, n in enumerate(rows) if n][SKIPPED_BATCHES:]
    for i in data:
        trigger, add = result["batch_ms"][i] or 0, result["batch_add_ms"][i] or 0
        batch = stages.get(str(result["batch_ids"][i]), [])
        wall = 1000 * sum(st["wall"] for st in batch)
        for name, value in (("driver", trigger - add), ("stages wall", wall),
                            ("stages task", 1000 * sum(st["task_s"] for st in batch)),
                            ("scheduling and gaps", add - wall)):
            parts.setdefault(name, []).append(value)
    return {name: float(statistics.median(v)) for name, v in parts.items()}


def _remove_work_dir(app_id: str | None) -> None:
    import pyspark

    if app_id:
        shutil.rmtree(Path(pyspark.__file__).parent / "work" / app_id, ignore_errors=True)


def _local_peer(master: str) -> str:
    """The one-machine master a cluster master's figures are set against: ``local[N]`` with
    N = the cluster's executor cores (``local[3]`` for ``local-cluster[3,1,1024]`` and the
    standalone cluster), the floor's for a floor."""
    suffix = FLOOR if master.endswith(FLOOR) else ""
    match = re.match(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)", master)
    cores = int(match.group(1)) * int(match.group(2)) if match else 3
    return f"local[{cores}]{suffix}"


def _base(master: str) -> str:
    return master.removesuffix(NO_AFFINITY).removesuffix(FLOOR)


def _rows(runs: list[ClusterRun], sizes: ClusterSizes, keys: int) -> list[dict[str, Any]]:
    params = {"tasks": TASKS, "batches": sizes.batches, "rows_per_batch": sizes.new + sizes.repeat, "keys": keys}
    rows: list[dict[str, Any]] = []
    by_master: dict[str, list[ClusterRun]] = {}
    for r in runs:
        by_master.setdefault(r.master, []).append(r)
    median_ms = {master: statistics.median(statistics.median(r.batch_ms[SKIPPED_BATCHES:] or r.batch_ms)
                                           for r in mine) for master, mine in by_master.items()}
    for master, mine in by_master.items():
        batch_ms = [float(statistics.median(r.batch_ms[SKIPPED_BATCHES:] or r.batch_ms)) for r in mine]
        loads = "; ".join(f"load {a} -> {b}" for r in mine for a, b in [r.load])
        parts = "; ".join(", ".join(f"{k} {v:.0f}" for k, v in r.extra.get("parts", {}).items()) for r in mine)
        notes = f"median micro-batch ms per run {[round(x) for x in batch_ms]}; parts (median ms) {parts}; {loads}"
        ratios = []
        peer = _local_peer(master)
        if master != peer and peer in median_ms:
            ratios.append(f"{median_ms[master] / median_ms[peer]:.2f}x {peer}")
        floor = _base(master) + FLOOR
        if not master.endswith(FLOOR) and floor in median_ms:
            ratios.append(f"{median_ms[master] / median_ms[floor]:.2f}x {floor}")
        if ratios:
            notes = "; ".join(ratios) + "; " + notes
        rows.append(make_row("cluster_batch_ms", master, params, "ms", batch_ms, notes=notes))
        if master.endswith(FLOOR):
            continue
        share = [100.0 * r.moves / r.runs if r.runs else 0.0 for r in mine]
        rows.append(make_row("cluster_moves", master, params, "% of runs", share,
                             notes="; ".join(f"{r.moves} of {r.runs}" for r in mine)))
        replay = [float(statistics.mean(r.replayed[1:])) if len(r.replayed) > 1 else 0.0 for r in mine]
        rows.append(make_row("cluster_replayed", master, params, "records/batch", replay,
                             notes="; ".join(f"per batch {r.replayed}" for r in mine)))
        disks = [r.extra["disk"] for r in mine if r.extra.get("disk", ({}, 0.0))[0]]
        if disks:
            rows.append(make_row("cluster_disk", master, params, "x share", [ratio for _, ratio in disks],
                                 notes="; ".join(f"bytes per executor {per}" for per, _ in disks)))
    return rows


MAX_ROUNDS = 2
"""Interleaved rounds at most (a full round takes about an hour on 2 busy cores)."""


def run(quick: bool = False, repeats: int = 5, masters: list[str] | None = None) -> list[dict[str, Any]]:
    """Interleaved rounds (each of ``masters`` once per round; default: the cluster, local,
    the floor (no state) on both, the standalone cluster, the cluster without affinity): ``min(repeats, MAX_ROUNDS)``,
    one when ``quick``."""
    sizes = CLUSTER_QUICK if quick else CLUSTER_FULL
    repeats = 1 if quick else max(1, min(repeats, MAX_ROUNDS))
    if masters is None:
        masters = [LOCAL_CLUSTER, LOCAL, LOCAL_CLUSTER + FLOOR, LOCAL + FLOOR]
        masters += [] if quick or os.environ.get(STANDALONE_ENV) == "0" else [STANDALONE]
        masters.append(LOCAL_CLUSTER + NO_AFFINITY)
    work = Path(tempfile.mkdtemp(prefix="localstate-cluster-bench-"))
    try:
        keys = write_growing_input(work / "input", sizes)
        runs = []
        for i in range(repeats):
            for m, master in enumerate(masters):
                result = drive(master, work / "input", work / f"run-{i}-{m}")
                _remove_work_dir(result.extra.get("app_id"))
                shutil.rmtree(work / f"run-{i}-{m}", ignore_errors=True)
                shutil.rmtree(work / f"run-{i}-{m}-cluster", ignore_errors=True)
                runs.append(result)
                parts = {k: round(v) for k, v in result.extra["parts"].items()}
                print(f"{master}: batches ms {[round(x) for x in result.batch_ms]}, moves {result.moves}/"
                      f"{result.runs}, replayed {result.replayed}, parts {parts}, load {result.load}",
                      file=sys.stderr)
        rows = _rows(runs, sizes, keys)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if os.environ.get(STANDBY_ENV) != "0":
        from .spark_standby import run as run_standby

        rows += run_standby(quick, repeats)
    return rows


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=MAX_ROUNDS)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--masters", default=None,
                        help=f"';'-separated, in round order (e.g. '{LOCAL_CLUSTER};{LOCAL}'; "
                             f"'{STANDALONE}', '<master>{NO_AFFINITY}')")
    args = parser.parse_args(argv)
    rows = run(args.quick, args.repeats, args.masters.split(";") if args.masters else None)
    text = json.dumps(rows, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
