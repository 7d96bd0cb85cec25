"""Host affinity on ``local-cluster[3,1,1024]``: tasks stay where their state is.

The driver (:mod:`localstate.testing.spark_cluster_driver`, one process per Spark
application) runs the rocksdb key count with 6 tasks on 3 executors, each executor with
its own state dir and the file changelog shared, with Spark's default
``spark.locality.wait``:

* a batch run, then a stream with one input file per micro-batch, during which the
  placement registry is emptied once (what a new driver starts with): apart from the
  runs right after that, no run moves, nothing is replayed, and at the end each
  executor holds copies of its own partitions only;
* a stream whose registry sends every run to another executor than its last (a test
  double: two executors holding copies of one partition and the registry naming the
  stale one, which a working registry never does), with the 6 tasks in 3 Spark tasks:
  every run then starts from a stale copy or none, and the state and every output are
  still exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate.contrib.spark.streaming import committed_batches
from localstate.copies import COPIES
from localstate.testing.spark import read_counts
from localstate.testing.spark_cluster_driver import (
    cluster_config,
    fresh_state,
    read_events,
    write_input,
)

pytestmark = pytest.mark.spark

PARTITIONS = 6
EXECUTORS = 3
FILES = 7
FORGET_AT = 3
"""The registry is emptied after this micro-batch."""
DRIVER_TIMEOUT_S = 900.0


def _drive(root: Path, mode: str, *extra: str, files: int = FILES) -> tuple[list[Counter[str]], dict[str, Any]]:
    counters = write_input(root / "input", files, rows_per_file=1200, keys=600, seed=11)
    cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", mode, "--root", str(root),
           "--input", str(root / "input"), "--partitions", str(PARTITIONS),
           "--master", f"local-cluster[{EXECUTORS},1,1024]", "--locality-wait", "3s", *extra]
    log = root / "driver.log"
    with log.open("wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=DRIVER_TIMEOUT_S,
                              env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, start_new_session=True)
    result = json.loads((root / "result.json").read_text()) if (root / "result.json").exists() else {}
    assert proc.returncode == 0 and result.get("status") == "ok", (
        f"driver exited with {proc.returncode}, result {result}; log tail:\n" + log.read_text(errors="replace")[-4000:])
    _remove_spark_work_dir(result.get("app_id"))
    return counters, result


def _remove_spark_work_dir(app_id: str | None) -> None:
    import shutil

    import pyspark

    if app_id:
        shutil.rmtree(Path(pyspark.__file__).parent / "work" / app_id, ignore_errors=True)


def _assert_exact_stream(root: Path, files: list[Counter[str]]) -> None:
    config = cluster_config(root, partitions=PARTITIONS)
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS), len(files) - 1)
    assert read_counts(fresh_state(config, root)) == sum(files, Counter())
    running: Counter[str] = Counter()
    for b, counts in enumerate(files):
        running.update(counts)
        rows = json.loads((root / "output" / f"batch-{b}.json").read_text())
        assert len(rows) == len(counts) and dict(rows) == {k: running[k] for k in counts}, f"batch {b}"


def _closed_runs(root: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(root) if e["phase"] == "close" and e["version"] is not None]


def _held_copies(root: Path) -> dict[str, set[int]]:
    """Executor → the partitions whose copies its state dir holds."""
    out = {}
    for state in sorted((root / "state").iterdir()):
        counts = state / "cluster" / "counts"
        out[state.name] = {int(d.name) for d in counts.iterdir()} if counts.is_dir() else set()
    return out


def test_tasks_stay_on_their_executor_and_copies_follow_them(tmp_path: Path) -> None:
    files, _result = _drive(tmp_path, "all", "--forget-placement-at", str(FORGET_AT))

    batch = tmp_path / "batch"
    assert dict(json.loads((batch / "output.json").read_text())) == sum(files, Counter())
    assert len({e["executor"] for e in _closed_runs(batch)}) == EXECUTORS

    stream = tmp_path / "stream"
    _assert_exact_stream(stream, files)
    runs = _closed_runs(stream)
    last: dict[int, str] = {}
    moves = []
    for e in runs:
        p, batch_id = e["partition"], e["version"]
        if p in last and last[p] != e["executor"]:
            moves.append((batch_id, p, last[p], e["executor"]))
        last[p] = e["executor"]
    starts = [e for e in read_events(stream) if e["phase"] == "start"]
    steady = [m for m in moves if m[0] != FORGET_AT + 1]
    print(f"\n{len(moves)} of {len(runs) - PARTITIONS} runs moved {moves}; "
          f"records replayed {sum(e['restore_records'] for e in starts)}")
    # Only the runs right after the registry was emptied may move (and any run may go
    # elsewhere when its executor stays busy past spark.locality.wait: at most one here).
    assert len(steady) <= 1, moves
    assert sum(e["restore_records"] for e in starts if e["previous_version"] not in (None, FORGET_AT)) <= (
        max(e["restore_records"] for e in starts) if steady else 0)
    # Each executor holds copies of the partitions it ran last, and no others.
    owners: dict[str, set[int]] = {}
    for p, executor in last.items():
        owners.setdefault(executor, set()).add(p)
    held = _held_copies(stream)
    assert {e: held.get(e, set()) for e in owners} == owners, held
    assert not [p for e, ps in held.items() if e not in owners for p in ps], held
    for executor, partitions in owners.items():
        records = {int(f.stem.split("-")[1]) for f in (stream / "state" / executor / "cluster" / COPIES).glob("*.json")}
        assert records == partitions


@pytest.mark.slow
def test_a_registry_naming_stale_copies_gives_the_exact_state(tmp_path: Path) -> None:
    files, _result = _drive(tmp_path, "stream", "--misplace", "--spark-tasks", "3", files=5)
    stream = tmp_path / "stream"
    _assert_exact_stream(stream, files)
    runs = _closed_runs(stream)
    executors: dict[int, list[str]] = {}
    for e in runs:
        executors.setdefault(e["partition"], []).append(e["executor"])
    moved = sum(a != b for seq in executors.values() for a, b in zip(seq, seq[1:]))
    assert moved >= len(runs) - PARTITIONS - 4, executors  # the double did send the runs elsewhere
    # Each misplaced run found no copy or a stale one, fetched the snapshot its partition's
    # last commit shipped beside the changelog (one at every commit here) and replayed nothing.
    starts = [e for e in read_events(stream) if e["phase"] == "start" and e["previous_version"] is not None]
    assert starts and sum(e["restore_records"] for e in starts) == 0, starts


def test_an_executor_whose_state_dir_is_unusable_is_left_out(tmp_path: Path) -> None:
    # Executor 1's state dir is a regular file: every task opened there fails with a clear
    # error. Spark's exclusion on failure (on in spark_session) sends the retry to another
    # executor, and the registry stops proposing the excluded executor, so every
    # micro-batch commits, exactly, without it.
    state = tmp_path / "stream" / "state"
    state.mkdir(parents=True)
    (state / "1").write_text("not a directory\n")
    files, _result = _drive(tmp_path, "stream", files=4)
    stream = tmp_path / "stream"
    _assert_exact_stream(stream, files)
    runs = _closed_runs(stream)
    assert runs and {e["executor"] for e in runs} == {"0", "2"}, runs
    # Once excluded, executor 1 is proposed no more: the last micro-batch's runs stay
    # where the one before ran.
    before = {e["partition"]: e["executor"] for e in runs if e["version"] == len(files) - 2}
    assert all(before[e["partition"]] == e["executor"] for e in runs if e["version"] == len(files) - 1), runs
