"""A Spark standalone cluster (a master and 3 workers started with ``spark-class`` from
the PySpark installation, each worker with its own work and state directories): an
executor killed mid-stream moves only its own partitions, and the result is exact.

The stream (:mod:`localstate.testing.spark_cluster_driver`, rocksdb key count, 6 tasks,
file changelog shared) keeps its state in the worker's directory
(``job.state.dir = {env:LOCALSTATE_WORKER_STATE_DIR}``). The test SIGKILLs the executor
JVM of one worker while one of its task runs sleeps after opening its storage; that
worker launches a new executor (a new id) for the application, and the placement
registry gives the lost executor's partitions to the least loaded executors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from localstate.contrib.spark.streaming import committed_batches
from localstate.testing.spark import read_counts
from localstate.testing.spark_cluster_driver import (
    cluster_config,
    event_batch,
    fresh_state,
    kill_mid_task,
    read_events,
    write_input,
)
from localstate.testing.spark_standalone import WORKER_STATE_ENV, StandaloneCluster

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds executor JVMs through /proc"),
]

PARTITIONS = 6
WORKERS = 3
FILES = 7
KILL_FROM_BATCH = 2
TASK_SLEEP_S = 0.5
DRIVER_TIMEOUT_S = 900.0


@pytest.mark.slow
def test_an_executor_killed_mid_stream_moves_only_its_partitions(tmp_path: Path) -> None:
    files = write_input(tmp_path / "input", FILES, rows_per_file=1200, keys=600, seed=3)
    with StandaloneCluster(tmp_path / "cluster", workers=WORKERS) as cluster:
        cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream", "--root", str(tmp_path),
               "--input", str(tmp_path / "input"), "--partitions", str(PARTITIONS), "--master", cluster.url,
               "--executors", str(WORKERS), "--task-sleep", str(TASK_SLEEP_S), "--locality-wait", "10s",
               "--state-dir", f"{{env:{WORKER_STATE_ENV}}}"]
        log = tmp_path / "driver.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
            try:
                victim = kill_mid_task(tmp_path / "stream", lambda: proc.poll() is None,
                                       lambda: {k: v[1] for k, v in cluster.executors().items()},
                                       from_batch=KILL_FROM_BATCH, sleep_s=TASK_SLEEP_S, timeout_s=DRIVER_TIMEOUT_S)
                proc.wait(timeout=DRIVER_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    result = json.loads((tmp_path / "result.json").read_text()) if (tmp_path / "result.json").exists() else {}
    assert proc.returncode == 0 and result.get("status") == "ok", log.read_text(errors="replace")[-4000:]
    assert victim is not None, "no task run of a later micro-batch was found to kill"

    # Exact: every partition committed the last micro-batch, the state rebuilt from the
    # changelog is the count of all input, and every micro-batch's output is exact.
    stream = tmp_path / "stream"
    config = cluster_config(stream, partitions=PARTITIONS)
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS), FILES - 1)
    assert read_counts(fresh_state(config, stream)) == sum(files, Counter())
    running: Counter[str] = Counter()
    for b, counts in enumerate(files):
        running.update(counts)
        rows = json.loads((stream / "output" / f"batch-{b}.json").read_text())
        assert dict(rows) == {k: running[k] for k in counts} and len(rows) == len(counts), f"batch {b}"

    # Only the killed executor's partitions moved.
    events = read_events(stream)
    closes = [e for e in events if e["phase"] == "close" and e["version"] == event_batch(e)]
    before = [e for e in closes if e["time"] < victim["kill_time"]]
    home = {e["partition"]: e["executor"] for e in before}
    lost = {p for p, ex in home.items() if ex == victim["executor"]}
    after = [e for e in closes if e["time"] > victim["kill_time"]]
    moved = [(event_batch(e), e["partition"], home[e["partition"]], e["executor"]) for e in after
             if e["partition"] not in lost and e["executor"] != home[e["partition"]]]
    print(f"\nkilled executor {victim['executor']} (partitions {sorted(lost)}) in batch {event_batch(victim)}; "
          f"runs after: {[(event_batch(e), e['partition'], e['executor']) for e in after]}")
    assert lost and victim["partition"] in lost
    assert not moved, f"partitions of live executors moved: {moved}"
    assert not [e for e in after if e["executor"] == victim["executor"]]
    # A moved partition's first open fetched the snapshot shipped after its last commit
    # (a snapshot at every commit here) and replayed nothing of its history.
    firsts: dict[int, dict[str, Any]] = {}
    for e in sorted((e for e in events if e["phase"] == "start" and e["time"] > victim["kill_time"]
                     and e["partition"] in lost and e["executor"] != victim["executor"]), key=lambda e: e["time"]):
        firsts.setdefault(e["partition"], e)
    print(f"moved partitions' first opens: {[(p, e['restore_start'], e['restore_records']) for p, e in firsts.items()]}")
    assert firsts and all(e["restore_records"] == 0 and e["restore_start"] > 0 for e in firsts.values()), firsts
    # The state stayed in the workers' directories.
    assert {Path(e["state_dir"]).parent.name for e in closes} <= {f"worker-{i}" for i in range(WORKERS)}
