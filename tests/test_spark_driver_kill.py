"""Structured Streaming with the driver SIGKILLed and restarted from its checkpoint.

The driver (:mod:`localstate.testing.spark_cluster_driver`, ``stream`` mode on
``local[2]``) runs the :class:`~localstate.testing.spark.KeyCount` job over a
directory of JSON-lines files, one file per micro-batch, with a rocksdb store and the
file changelog. The test SIGKILLs the driver's whole process group — the Python
driver, its Spark JVM and the Python workers, so nothing gets to clean up — at
chosen moments, checks that no process of it survives, and starts it again with the
same checkpoint location and state dir, until the input is consumed:

* ``task`` — while a task of micro-batch B runs, before it commits;
* ``commit`` — after a task committed B in localstate, before its Spark task ended
  (so Spark has not committed B: the restarted query re-runs B, which must roll the
  partition back to B - 1 first);
* ``output`` — after B's output was handed to the sink, before or after Spark's commit
  log (either way the restart is exact).

Then the committed state, rebuilt from the changelog alone and read from the local
copies the driver left, must equal an exact count of all input, and every micro-batch
must have emitted exactly the running totals of its file's keys: a lost or doubly
applied record would show in both. ``LOCALSTATE_FULL=1`` runs more files and kills.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from localstate.contrib.spark.streaming import committed_batches
from localstate.testing import FULL
from localstate.testing.processes import run_process_group
from localstate.testing.spark import read_counts
from localstate.testing.spark_cluster_driver import (
    cluster_config,
    event_batch,
    fresh_state,
    read_events,
    write_input,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the driver's processes through /proc"),
]

FILES = 14 if FULL else 6
"""Input files = micro-batches."""
ROWS_PER_FILE = 1000
KEYS = 200
PARTITIONS = 4
TASK_SLEEP_S = 0.5
"""Each task run sleeps this long after opening its storage (the window of a ``task`` kill) …"""
COMMIT_SLEEP_S = 0.5
"""… and this long after its commit, before its Spark task ends (the window of a ``commit`` kill)."""
RUN_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Kill:
    """SIGKILL the driver at the first moment of ``mode`` in micro-batch ``batch`` or later."""

    mode: str
    batch: int


KILLS = (
    [Kill("task", 1), Kill("commit", 2), Kill("output", 4), Kill("commit", 6), Kill("task", 8),
     Kill("commit", 10), Kill("output", 12)]
    if FULL else [Kill("task", 1), Kill("commit", 2), Kill("output", 4)]
)



def _moment(kill: Kill, root: Path) -> dict[str, Any] | None:
    """The event (or output file) that opens ``kill``'s window now, if any."""
    now = time.time()
    if kill.mode == "output":
        for path in sorted((root / "output").glob("batch-*.json")):
            b = int(path.stem.split("-")[1])
            if b >= kill.batch:
                return {"batch": b, "output": path.name}
        return None
    events = read_events(root)
    if kill.mode == "task":
        closed = {e["run"] for e in events if e["phase"] == "close"}
        found = [e for e in events if e["phase"] == "start" and e["run"] not in closed
                 and event_batch(e) >= kill.batch and now - e["time"] < TASK_SLEEP_S / 2]
    else:
        found = [e for e in events if e["phase"] == "close" and e["version"] == event_batch(e)
                 and e["version"] >= kill.batch and now - e["time"] < COMMIT_SLEEP_S / 2]
    return {**found[0], "batch": event_batch(found[0])} if found else None


@dataclass
class DriverRun:
    kill: Kill | None
    moment: dict[str, Any] | None
    returncode: int
    seconds: float
    survivors: dict[int, int]


def _run_driver(root: Path, input_dir: Path, kill: Kill | None, n: int, spark_tasks: int | None) -> DriverRun:
    """Start the driver; SIGKILL its process group at ``kill``'s moment (None: let it finish)."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [
        sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream",
        "--root", str(root), "--input", str(input_dir), "--partitions", str(PARTITIONS),
        "--task-sleep", str(TASK_SLEEP_S), "--commit-sleep", str(COMMIT_SLEEP_S), "--master", "local[2]",
        *(["--spark-tasks", str(spark_tasks)] if spark_tasks is not None else []),
    ]
    run = run_process_group(cmd, env, root / f"driver-{n}.log", timeout_s=RUN_TIMEOUT_S, poll_s=0.02, scan_s=0.5,
                            kill_when=None if kill is None else lambda: _moment(kill, root / "stream"))
    if run.timed_out:
        pytest.fail(f"driver run {n} did not finish within {RUN_TIMEOUT_S:.0f}s; log: {root / f'driver-{n}.log'}")
    return DriverRun(kill, run.moment, run.returncode, run.seconds, run.survivors)


SPARK_TASKS = [2, None] if FULL else [2]
"""``StatefulJob(spark_tasks=...)`` of the runs: 2 = two tasks per Spark task (a ``commit``
kill then also lands between the two tasks' commits of one Spark task, the harder case);
None = one Spark task per task (also covered by the executor kills of
``test_spark_cluster.py``)."""


@pytest.fixture(scope="module", params=SPARK_TASKS, ids=lambda n: f"spark_tasks={n}")
def killed_stream(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Counter[str]], list[DriverRun]]:
    root = tmp_path_factory.mktemp("driver-kill")
    files = write_input(root / "input", FILES, rows_per_file=ROWS_PER_FILE, keys=KEYS, seed=11)
    runs = []
    for n, kill in enumerate([*KILLS, None]):
        run = _run_driver(root, root / "input", kill, n, request.param)
        runs.append(run)
        if kill is not None and run.moment is None:
            break  # the driver finished before the moment came: reported by the test
    return root, files, runs



def test_driver_sigkilled_and_restarted_from_its_checkpoint_stays_exactly_once(
    killed_stream: tuple[Path, list[Counter[str]], list[DriverRun]],
) -> None:
    root, files, runs = killed_stream
    stream = root / "stream"
    log_tail = (root / f"driver-{len(runs) - 1}.log").read_text(errors="replace")[-3000:]
    assert [r.kill for r in runs] == [*KILLS, None], (
        f"a kill found no moment (the driver finished first): {[(r.kill, r.moment) for r in runs]}"
    )
    for r in runs:
        assert not r.survivors, f"processes of the killed driver survived {r.kill}: {r.survivors}"
    for r in runs[:-1]:
        assert r.returncode == -signal.SIGKILL, r
    result = json.loads((root / "result.json").read_text())
    assert runs[-1].returncode == 0 and result["status"] == "ok", f"{result}\n{log_tail}"

    # Exactly once: every partition committed the last micro-batch, and the state —
    # rebuilt from the changelog alone, and as the driver's local copies hold it —
    # equals an exact count of all input.
    last = FILES - 1
    config = cluster_config(stream, partitions=PARTITIONS)
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS), last)
    expected = sum(files, Counter())
    assert read_counts(fresh_state(config, root)) == expected
    local = config.with_overrides({"job.state.dir": str(stream / "state" / "driver")})
    assert read_counts(local) == expected

    # Every micro-batch emitted exactly its file's keys with their running totals.
    running: Counter[str] = Counter()
    for b, counts in enumerate(files):
        running.update(counts)
        rows = json.loads((stream / "output" / f"batch-{b}.json").read_text())
        assert len(rows) == len(counts), f"batch {b}"
        assert dict(rows) == {k: running[k] for k in counts}, f"batch {b}"

    events = read_events(stream)
    closes = {e["run"]: e for e in events if e["phase"] == "close"}
    for r in runs[:-1]:
        assert r.kill is not None and r.moment is not None
        batch = r.moment["batch"]
        if r.kill.mode == "task":
            # the run killed mid-task never committed; the restarted driver ran the batch
            assert r.moment["run"] not in closes
        if r.kill.mode == "commit":
            # localstate had committed the batch, Spark had not: after the restart the
            # partition was rolled back to the version before and the batch ran again
            p = r.moment["partition"]
            again = [e for e in events if e["phase"] == "start" and e["partition"] == p
                     and e["time"] > r.moment["time"] and event_batch(e) == batch]
            assert again and again[0]["previous_version"] == batch - 1, again
            assert closes[again[0]["run"]]["version"] == batch
    print(
        f"\n{len(runs) - 1} driver kills {[(r.kill.mode, r.moment['batch']) for r in runs[:-1] if r.kill and r.moment]}; "
        f"driver runs {[round(r.seconds) for r in runs]} s"
    )
