"""The Spark runner on ``local-cluster[2,1,1024]``: executor JVMs killed mid-stream.

The driver runs in its own process (:mod:`localstate.testing.spark_cluster_driver`:
a process holds one SparkContext and the shared ``spark`` fixture is ``local[2]``).
Each executor has its own ``job.state.dir`` (``{executor}``) while the file changelog
is shared, so a task that moves to another executor really restores from the
changelog. One Spark application runs a batch job, then a streaming job with one
input file per micro-batch. During the stream this test SIGKILLs an executor JVM
while one of its tasks runs (before its commit), and later another while a task
sleeps after its commit (localstate committed the batch, Spark has not: the re-run
must roll back). Spark re-launches executors and re-runs the work; the final state,
every micro-batch's output and every restore must be exact. ``LOCALSTATE_FULL=1``:
24 micro-batches and five kills.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from localstate import Config
from localstate.contrib.spark.streaming import committed_batches
from localstate.contrib.spark.task_run import EXECUTOR_PLACEHOLDER, executor_id, executor_state_dir
from localstate.testing import FULL
from localstate.testing.processes import descendants, executor_jvms, kill_all, kill_tree
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
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds executor JVMs through /proc"),
]

FILES = 24 if FULL else 7
"""Input files = micro-batches of the streaming job."""
ROWS_PER_FILE = 1500
KEYS = 300
PARTITIONS = 4
TASK_SLEEP_S = 0.4
"""Each task run sleeps this long after opening its storage (a window to kill it mid-task) …"""
COMMIT_SLEEP_S = 0.4
"""… and this long after its commit, before its Spark task ends (a window to kill it there)."""
DRIVER_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class KillPlan:
    """Kill the executor of a streaming task run of micro-batch ``from_batch`` or later:
    ``"task"`` while it runs (before its commit), ``"commit"`` after localstate
    committed it but before Spark knows the task finished (its re-run must roll back).
    Only a run whose starting state no other live executor holds locally is a victim,
    so the run that takes over must restore from the changelog."""

    mode: str
    from_batch: int


KILLS = (
    [KillPlan("task", 1), KillPlan("commit", 5), KillPlan("task", 9), KillPlan("commit", 13),
     KillPlan("task", 17)]
    if FULL else [KillPlan("task", 1), KillPlan("commit", 3)]
)


# -- processes (Linux /proc) ---------------------------------------------------------------------
# -- the run -----------------------------------------------------------------------------------------
@dataclass
class Kill:
    plan: KillPlan
    executor: str
    victim: dict[str, Any]
    """The ``start`` (mode task) or ``close`` (mode commit) event of the killed run."""
    time: float

    @property
    def batch(self) -> int:
        return event_batch(self.victim)


@dataclass
class ClusterRun:
    root: Path
    files: list[Counter[str]]
    result: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    kills: list[Kill] = field(default_factory=list)

    def total(self) -> Counter[str]:
        return sum(self.files, Counter())



class LocalCopies:
    """The events replayed against a model of where state lives.

    ``committed[(partition, version)]`` is the changelog offset committed with that
    version (the latest commit of it: a rolled-back batch is committed again);
    ``local[(executor, partition)]`` the offset of that executor's local copy and the
    identity of the log it was built from: a run restores its local copy to the offset of
    the version it starts from, a commit moves it to the committed offset. ``log[partition]``
    counts the log's identities: a run that starts behind the partition's log end (a
    rollback) cuts that tail, which gives the log a new identity, and the copy that run
    restored carries it; a copy of the old identity (a snapshot of the cut tail, or one of
    the same offsets written again elsewhere) is never used.
    """

    def __init__(self) -> None:
        self.committed: dict[tuple[int, int | None], int] = {}
        self.local: dict[tuple[str, int], tuple[int, int]] = {}
        self.end: dict[int, int] = {}
        self.log: dict[int, int] = {}

    def target(self, start: dict[str, Any]) -> int:
        """The offset the run of ``start`` must restore to."""
        return self.committed.get((start["partition"], start["previous_version"]), 0)

    def is_local(self, start: dict[str, Any]) -> bool:
        """Whether the executor of ``start`` already held that state locally, built from
        the partition's current log."""
        p = start["partition"]
        return self.local.get((start["executor"], p), (0, 0)) == (self.target(start), self.log.get(p, 0))

    def apply(self, e: dict[str, Any]) -> None:
        where = (e["executor"], e["partition"])
        p = e["partition"]
        if e["phase"] == "start":
            if self.target(e) < self.end.get(p, 0):  # a rollback cuts the tail past the target
                self.log[p] = self.log.get(p, 0) + 1
                self.end[p] = self.target(e)
            self.local[where] = (self.target(e), self.log.get(p, 0))
        elif e["version"] != e["previous_version"]:
            self.committed[(p, e["version"])] = e["committed_offset"]
            self.local[where] = (e["committed_offset"], self.log.get(p, 0))
            self.end[p] = e["committed_offset"]

    @classmethod
    def of(cls, events: list[dict[str, Any]]) -> LocalCopies:
        model = cls()
        for e in events:
            model.apply(e)
        return model


def _in_window(plan: KillPlan, event: dict[str, Any]) -> bool:
    """Whether ``event`` (a run's start for a ``task`` kill, its commit's close for a
    ``commit`` kill) is recent enough that a kill now lands inside the run's sleep."""
    window = TASK_SLEEP_S if plan.mode == "task" else COMMIT_SLEEP_S
    return time.time() - event["time"] < window / 2


def _kill_target(
    plan: KillPlan, events: list[dict[str, Any]], taken: set[str], executors: Callable[[], dict[str, int]]
) -> tuple[dict[str, Any], int] | None:
    """(event, executor JVM pid) of a run inside the sleep window ``plan`` aims at whose
    starting state no other live executor holds locally, while another executor is
    alive; None if there is none now. ``executors()``: the live executor JVMs."""
    if plan.mode == "task":
        closed = {e["run"] for e in events if e["phase"] == "close"}
        candidates = [e for e in events if e["phase"] == "start" and e["run"] not in closed and _in_window(plan, e)]
    else:
        candidates = [e for e in events if e["phase"] == "close" and e["version"] == event_batch(e)
                      and _in_window(plan, e)]
    candidates = [e for e in candidates if e["run"] not in taken and event_batch(e) >= plan.from_batch]
    if not candidates:
        return None
    jvms = executors()
    model = LocalCopies.of(events)
    for e in candidates:
        others = set(jvms) - {e["executor"]}
        if e["executor"] in jvms and others and not [
            x for x in others if model.local.get((x, e["partition"]), (0, 0))[0] == e["restore_committed"]
        ]:
            return e, jvms[e["executor"]]
    return None


def _run_cluster(root: Path, kills: list[KillPlan]) -> ClusterRun:
    """Run the driver (batch, then stream) and carry out ``kills`` one after another,
    each only while another executor is alive to take the task over."""
    input_dir = root / "input"
    run = ClusterRun(root, write_input(input_dir, FILES, rows_per_file=ROWS_PER_FILE, keys=KEYS, seed=6))
    log_path = root / "driver.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [
        sys.executable, "-m", "localstate.testing.spark_cluster_driver", "all",
        "--root", str(root), "--input", str(input_dir), "--partitions", str(PARTITIONS),
        "--task-sleep", str(TASK_SLEEP_S), "--commit-sleep", str(COMMIT_SLEEP_S),
        "--master", "local-cluster[2,1,1024]",
    ]
    t0 = time.monotonic()
    seen: dict[int, int] = {}
    pending = list(kills)
    taken: set[str] = set()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            last_scan = 0.0
            while proc.poll() is None:
                now = time.monotonic()
                if now - t0 > DRIVER_TIMEOUT_S:
                    pytest.fail(f"the driver did not finish within {DRIVER_TIMEOUT_S:.0f}s; log: {log_path}")
                if now - last_scan >= 1.0:
                    seen.update(descendants(proc.pid))  # to kill orphans too, at the end
                    last_scan = now
                if pending:
                    found = _kill_target(
                        pending[0], read_events(root / "stream"), taken, lambda: executor_jvms(proc.pid)
                    )
                    if found is not None:
                        target, jvm = found
                        if _in_window(pending[0], target):  # finding the target took a while under load
                            kill_tree(jvm)
                            run.kills.append(Kill(pending.pop(0), target["executor"], target, time.time()))
                            taken.add(target["run"])
                time.sleep(0.05)
        finally:
            seen.update(descendants(proc.pid))
            kill_all(seen)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    run.seconds = time.monotonic() - t0
    result_path = root / "result.json"
    run.result = json.loads(result_path.read_text()) if result_path.exists() else {}
    assert proc.returncode == 0 and run.result.get("status") == "ok", (
        f"driver exited with {proc.returncode}, result {run.result}; log tail:\n"
        + log_path.read_text(errors="replace")[-4000:]
    )
    return run


def _remove_spark_work_dir(app_id: str | None) -> None:
    """local-cluster executors log under $SPARK_HOME/work/<app id>: drop ours once the
    driver succeeded (a failed run keeps them for diagnosis)."""
    import pyspark

    if app_id:
        shutil.rmtree(Path(pyspark.__file__).parent / "work" / app_id, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRun]:
    run = _run_cluster(tmp_path_factory.mktemp("cluster"), KILLS)
    yield run
    _remove_spark_work_dir(run.result.get("app_id"))



# -- tests ---------------------------------------------------------------------------------------------
def test_executor_id_and_per_executor_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("SPARK_EXECUTOR_ID", "SPARK_LOG_URL_STDERR", "CONTAINER_ID"):
        monkeypatch.delenv(var, raising=False)
    assert executor_id() == "driver"
    monkeypatch.setenv("CONTAINER_ID", "container_1_0001_01_000002")
    assert executor_id() == "container_1_0001_01_000002"
    monkeypatch.setenv("SPARK_LOG_URL_STDERR", "http://127.0.0.1:4/logPage/?appId=app-1&executorId=7&logType=stderr")
    assert executor_id() == "7"
    monkeypatch.setenv("SPARK_EXECUTOR_ID", "12")
    assert executor_id() == "12"

    config = cluster_config(tmp_path)
    assert EXECUTOR_PLACEHOLDER in str(config.state_dir)
    assert executor_state_dir(config).state_dir == tmp_path / "state" / "12"
    assert executor_state_dir(config, "a/b").state_dir == tmp_path / "state" / "a_b"
    plain = config.with_overrides({"job.state.dir": str(tmp_path / "state")})
    assert executor_state_dir(plain) is plain


def test_batch_job_on_two_executors_counts_exactly(cluster_run: ClusterRun) -> None:
    root = cluster_run.root / "batch"
    expected = cluster_run.total()
    output = json.loads((root / "output.json").read_text())
    assert len(output) == len(expected)
    assert dict(output) == expected

    config = cluster_config(root, partitions=PARTITIONS)
    assert read_counts(fresh_state(config, cluster_run.root / "batch")) == expected

    events = read_events(root)
    starts = [e for e in events if e["phase"] == "start"]
    assert sorted(e["partition"] for e in starts) == list(range(PARTITIONS))
    assert {e["version"] for e in events if e["phase"] == "close"} == {0}  # the first batch run's version
    # Both executor JVMs ran tasks, each in its own local state dir.
    dirs = {e["executor"]: e["state_dir"] for e in starts}
    assert len(dirs) == 2, f"all tasks ran on one executor: {starts}"
    assert {Path(d).name for d in dirs.values()} == set(dirs)


@pytest.mark.slow
def test_executors_killed_mid_stream_tasks_move_restore_and_stay_exactly_once(
    cluster_run: ClusterRun, leftover_rebuilds: bool = False
) -> None:
    run = cluster_run
    root = run.root / "stream"
    assert [k.plan for k in run.kills] == KILLS, f"not every planned kill found its window: {run.kills}"
    last = FILES - 1
    assert run.result["last_batch"] == last

    # Exactly once: the committed state of every partition is at the last micro-batch
    # and, rebuilt from the changelog alone, equals an exact count of all input.
    config = cluster_config(root, partitions=PARTITIONS)
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS), last)
    expected = run.total()
    assert read_counts(fresh_state(config, root)) == expected

    # Every micro-batch emitted exactly the keys of its file with their running totals
    # (a re-run batch overwrites its output file with the same rows).
    running: Counter[str] = Counter()
    for b, counts in enumerate(run.files):
        running.update(counts)
        rows = json.loads((root / "output" / f"batch-{b}.json").read_text())
        assert len(rows) == len(counts), f"batch {b}"
        assert dict(rows) == {k: running[k] for k in counts}, f"batch {b}"

    events = read_events(root)
    starts = [e for e in events if e["phase"] == "start"]
    closes = {e["run"]: e for e in events if e["phase"] == "close"}
    # Replay the events against the model (LocalCopies). Every run must restore exactly
    # to the offset of the version it started from (after a rollback: the version
    # before the rolled-back batch); a run whose executor held that state locally
    # replays nothing; any other (no local copy, a stale one, or one ahead after a
    # rollback) replays exactly [local snapshot, committed) from the shared changelog.
    model = LocalCopies()
    moved = []
    for e in events:
        if e["phase"] == "start":
            target = model.target(e)
            assert e["restore_committed"] == target, e
            if model.is_local(e):
                # leftover_rebuilds (the objectstore changelog): a killed attempt's upload left
                # in the log makes local copies at or below its end untrusted, so a copy the
                # model calls local may be rebuilt in full instead (conservative, never wrong)
                rebuilt = leftover_rebuilds and e["restore_start"] == 0 and e["restore_records"] == target
                assert e["restore_records"] == 0 or rebuilt, e
            else:
                # from an older local snapshot, or from the snapshot its last commit shipped
                # beside the changelog (then nothing to replay)
                moved.append(e)
                assert e["restore_start"] <= target, e
                assert e["restore_records"] == target - e["restore_start"], e
        model.apply(e)
    assert moved, "no task moved to an executor without its state"

    for kill in run.kills:
        victim, batch = kill.victim, kill.batch
        # The killed JVM ran nothing afterwards.
        assert not [e for e in starts if e["executor"] == kill.executor and e["time"] > kill.time + 1.0]
        if kill.plan.mode == "task":
            assert victim["run"] not in closes, f"the run killed mid-task committed: {closes[victim['run']]}"
        else:
            assert victim["version"] == batch  # localstate had committed the batch
        # Other executors re-ran the victim's partition and batch from the version
        # before it (after a commit kill, that is the rollback); the first re-run restored
        # from shared storage (no live executor held that state locally when the victim
        # was chosen), and one of them committed the batch. (A re-run can fail too:
        # its shuffle input may have been on the killed executor.)
        reruns = [
            e for e in starts
            if e["partition"] == victim["partition"] and e["time"] > kill.time
            and e["executor"] != kill.executor and event_batch(e) == batch
        ]
        assert reruns, f"{kill}: partition {victim['partition']} batch {batch} was not re-run elsewhere"
        assert all(e["previous_version"] == batch - 1 for e in reruns), reruns
        # (from the snapshot the last commit shipped beside the changelog, then the records
        # after it: none when that commit took a snapshot, as this driver's commits do)
        assert reruns[0] in moved, reruns[0]
        assert [e for e in reruns if closes.get(e["run"], {}).get("version") == batch], reruns
    executors = {e["executor"] for e in starts}
    print(
        f"\n{len(run.kills)} kills {[(k.plan.mode, k.executor, k.batch) for k in run.kills]}; "
        f"executors {sorted(executors)}; {len(moved)} of {len(starts)} runs restored from the changelog; "
        f"driver {run.seconds:.0f}s (session {run.result['session_s']:.0f}s)"
    )


def test_attempt_waiting_for_a_zombie_attempt_on_another_executor_rolls_its_commit_back(tmp_path: Path) -> None:
    """Two attempts of one streaming task on executors with separate state dirs: the
    old one (a zombie: its executor was given up, its Python worker still runs) holds
    the partition's changelog lock and commits the batch while the new attempt waits
    for that lock. The new attempt must then roll that commit back, not apply the
    batch a second time."""
    import threading

    import pyarrow as pa
    from localstate import TaskStorage
    from localstate.contrib.spark.runner import TaskRun, run_partition
    from localstate.contrib.spark.streaming import stream_position
    from localstate.testing.spark import key_count_task

    shared = cluster_config(tmp_path, partitions=1)
    on_a, on_b = (shared.with_overrides({"job.state.dir": str(tmp_path / "state" / x)}) for x in "ab")
    task = key_count_task("user_id")
    schema = pa.schema([("key", pa.string()), ("count", pa.int64())])
    batch = pa.RecordBatch.from_pydict({"user_id": ["x", "y", "x"]})

    def attempt(config: Config, batch_id: int) -> None:
        run = TaskRun(config, task, schema, batch_id=batch_id, lock_wait_s=30.0)
        for _ in run_partition(run, 0, iter([batch])):
            pass

    attempt(on_a, 0)
    zombie = TaskStorage(on_a, 0)  # attempt 0 of batch 1, on executor a
    try:
        counts = zombie.store("counts")
        errors: list[BaseException] = []

        def retry() -> None:  # attempt 1 of batch 1, on executor b
            try:
                attempt(on_b, 1)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        thread = threading.Thread(target=retry)
        thread.start()
        time.sleep(1.0)  # the retry is past its version check, waiting for the lock
        assert thread.is_alive()
        counts.put_all([("x", 4), ("y", 2)])
        zombie.commit(stream_position(1, 3, zombie.checkpoint), version=1)
    finally:
        zombie.close()
    thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert committed_batches(shared) == {0: 1}
    assert read_counts(fresh_state(shared, tmp_path)) == {"x": 4, "y": 2}
