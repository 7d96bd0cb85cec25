"""Standby replicas on Spark: the registry's standbys, and a real cluster losing an executor.

The registry's standby proposals and the sweep that keeps standby copies are tested
directly; the run is ``local-cluster[3,1,1024]`` (:mod:`localstate.testing.spark_cluster_driver`,
rocksdb key count, 6 tasks, each executor with its own state dir, the file changelog
shared) with ``job.standby.replicas = 1``: one executor JVM is SIGKILLed while one of its
task runs sleeps after opening its storage, from the micro-batch after the standbys are
warm. One run serves every assertion about it.
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

import pyarrow as pa
import pytest
from localstate import Config
from localstate.contrib.spark.placement import Placement, sweep_copies
from localstate.contrib.spark.runner import TaskRun, executor_state_dir, run_partition
from localstate.contrib.spark.streaming import committed_batches
from localstate.copies import COPIES, copy_record_path, read_copy_record
from localstate.layout import store_dir
from localstate.standby import FOLLOWED, follow
from localstate.testing.processes import descendants, executor_jvms, kill_all
from localstate.testing.spark import key_count_task, read_counts
from localstate.testing.spark_cluster_driver import (
    STANDBY_FOLLOWS,
    cluster_config,
    event_batch,
    fresh_state,
    kill_mid_task,
    read_events,
    write_input,
)

pytestmark = pytest.mark.spark


# -- the registry ------------------------------------------------------------------------------------
def test_standbys_are_spread_and_never_the_owner() -> None:
    placement = Placement(6)
    placement.record({0: "0", 1: "1", 2: "2", 3: "0", 4: "1", 5: "2"})
    standbys = placement.assign_standbys(["0", "1", "2"], 1)
    assert all(s is not None and s != placement.owners[p] for p, s in enumerate(standbys))
    assert Counter(standbys) == {"0": 2, "1": 2, "2": 2}
    assert placement.assign_standbys(["0", "1", "2"], 1) == standbys  # stable
    assert placement.assign_standbys(["0", "1", "2"], 0) == [None] * 6
    assert placement.assign_standbys(["0"], 1) == [None] * 6 and placement.standbys == {}


def test_a_lost_executors_partitions_go_to_their_standbys() -> None:
    placement = Placement(6)
    placement.record({0: "0", 1: "1", 2: "2", 3: "0", 4: "1", 5: "2"})
    standbys = placement.assign_standbys(["0", "1", "2"], 1)
    after_loss = placement.assign(["0", "1"])
    for p in (2, 5):
        assert after_loss[p] == standbys[p]
    assert [after_loss[p] for p in (0, 1, 3, 4)] == ["0", "1", "0", "1"]
    placement.record(dict(enumerate(after_loss)))
    # The standbys that became owners are replaced, by the executor that ran the partition
    # before when it is live; the partitions the next run moves to a re-launched executor
    # (their owners hold more than their share) get it as their standby first.
    again = placement.assign_standbys(["0", "1", "3"], 1)
    assert all(s != placement.owners[p] for p, s in enumerate(again))
    rebalanced = placement.assign(["0", "1", "3"])
    moving = [p for p in range(6) if rebalanced[p] != placement.owners[p]]
    assert moving and all(rebalanced[p] == again[p] == "3" for p in moving)
    placement.record(dict(enumerate(rebalanced)))
    settled = placement.assign_standbys(["0", "1", "3"], 1)
    assert placement.assign_standbys(["0", "1", "3"], 1) == settled  # stable: a moved standby starts cold
    placement.forget()
    assert placement.standbys == {}


def test_a_move_for_balance_waits_until_its_target_holds_a_standby() -> None:
    placement = Placement(6)
    placement.record({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"})
    placement.assign_standbys(["a", "b"], 1)
    # c joined after the last follow: nothing moves to it before it holds a standby copy
    assert placement.assign(["a", "b", "c"]) == ["a", "a", "a", "b", "b", "b"]
    standbys = placement.assign_standbys(["a", "b", "c"], 1)
    moving = [p for p, e in enumerate(placement.assign(["a", "b", "c"])) if e == "c"]
    assert moving and all(standbys[p] == "c" for p in moving)
    # a lost owner's partitions do not wait
    assert "b" not in placement.assign(["a", "c"])


def test_a_new_standby_is_the_previous_owner_which_holds_a_copy() -> None:
    placement = Placement(2)
    placement.record({0: "a", 1: "b"})
    assert placement.assign_standbys(["a", "b", "c"], 1)[0] == "b"
    placement.record({0: "c"})  # partition 0 ran on c (a was busy): a still holds a copy
    assert placement.assign_standbys(["a", "b", "c"], 1)[0] == "b"  # b's standby stays warm
    assert placement.assign_standbys(["a", "c"], 1)[0] == "a"  # b lost: a, not a cold executor


SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64())])


def _run(config: Config, partition: int, version: int, keys: list[str]) -> None:
    run = TaskRun(config, key_count_task("user_id"), SCHEMA, batch_id=version, lock_wait_s=10.0)
    for _ in run_partition(run, partition, iter([pa.RecordBatch.from_pydict({"user_id": keys})])):
        pass


def test_the_sweep_keeps_a_standby_copy(tmp_path: Path) -> None:
    shared = cluster_config(tmp_path, partitions=2)
    on_a, on_b = executor_state_dir(shared, "a"), executor_state_dir(shared, "b")
    _run(on_a, 0, 0, ["x", "y"])
    assert follow(on_b, 0, executor="b").status == FOLLOWED
    _run(on_a, 0, 1, ["x"])
    assert read_copy_record(copy_record_path(on_b, 0))["role"] == "standby"
    assert sweep_copies(on_b, {0: "a"}, "b", {0: "b"}) == []  # b keeps partition 0's standby
    assert store_dir(on_b, "counts", 0).is_dir()
    assert sweep_copies(on_b, {0: "a"}, "b", {0: "c"}) == [0]  # no longer its standby: swept


# -- a cluster losing an executor --------------------------------------------------------------------
PARTITIONS = 6
EXECUTORS = 3
FILES = 7
KILL_FROM_BATCH = 3
TASK_SLEEP_S = 0.6
DRIVER_TIMEOUT_S = 900.0


def _all_executors(driver: int) -> dict[str, int]:
    """The executor JVMs of ``driver``'s cluster while all of them are up, else none: an
    executor is killed only while two others can take its tasks over."""
    jvms = executor_jvms(driver)
    return jvms if len(jvms) == EXECUTORS else {}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("standby")
    files = write_input(root / "input", FILES, rows_per_file=1500, keys=900, seed=5)
    cmd = [sys.executable, "-m", "localstate.testing.spark_cluster_driver", "stream", "--root", str(root),
           "--input", str(root / "input"), "--partitions", str(PARTITIONS),
           "--master", f"local-cluster[{EXECUTORS},1,1024]", "--locality-wait", "10s",
           "--task-sleep", str(TASK_SLEEP_S), "--standby-replicas", "1"]
    log = root / "driver.log"
    seen: dict[int, int] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        try:
            victim = kill_mid_task(root / "stream", lambda: proc.poll() is None, lambda: _all_executors(proc.pid),
                                   from_batch=KILL_FROM_BATCH, sleep_s=TASK_SLEEP_S, timeout_s=DRIVER_TIMEOUT_S)
            seen.update(descendants(proc.pid))
            proc.wait(timeout=DRIVER_TIMEOUT_S)
        finally:
            seen.update(descendants(proc.pid))
            kill_all(seen)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    result = json.loads((root / "result.json").read_text()) if (root / "result.json").exists() else {}
    assert proc.returncode == 0 and result.get("status") == "ok", log.read_text(errors="replace")[-4000:]
    assert victim is not None, "no task run of a later micro-batch was found to kill"
    import shutil

    import pyspark

    shutil.rmtree(Path(pyspark.__file__).parent / "work" / result["app_id"], ignore_errors=True)
    return {"root": root / "stream", "files": files, "victim": victim, "result": result}


def _timeline(stream: Path) -> str:
    """Every task run's open (partition, executor, version it started from, records
    replayed) and every follow, in order: what a failure here needs to be understood."""
    lines = [f"{e['time'] % 1000:7.1f} open p{e['partition']} on {e['executor']} from v{e['previous_version']} "
             f"replayed {e['restore_records']}" for e in read_events(stream) if e["phase"] == "start"]
    path = stream / STANDBY_FOLLOWS
    for v, done in (json.loads(path.read_text()).items() if path.exists() else []):
        lines.append(f"follow after v{v} ({done['seconds']:.2f}s): " + ", ".join(
            f"p{r.get('partition')}->{r['executor']} {r['status']} {r.get('records')}" for r in done["reports"]))
    return "\n".join(lines)


@pytest.mark.slow
def test_a_lost_executors_partitions_move_to_their_warm_standbys(killed_run: dict[str, Any]) -> None:
    stream, files, victim = killed_run["root"], killed_run["files"], killed_run["victim"]
    print(f"\nkilled {victim}\n" + _timeline(stream))
    # Exact: every partition committed the last micro-batch, the state is the count of all
    # input, and every micro-batch's output is exact.
    config = cluster_config(stream, partitions=PARTITIONS)
    assert committed_batches(config) == dict.fromkeys(range(PARTITIONS), FILES - 1)
    assert read_counts(fresh_state(config, stream)) == sum(files, Counter())
    running: Counter[str] = Counter()
    for b, counts in enumerate(files):
        running.update(counts)
        rows = json.loads((stream / "output" / f"batch-{b}.json").read_text())
        assert dict(rows) == {k: running[k] for k in counts} and len(rows) == len(counts), f"batch {b}"

    follows = {int(v): f["reports"] for v, f in json.loads((stream / STANDBY_FOLLOWS).read_text()).items()}
    events = read_events(stream)
    closes = [e for e in events if e["phase"] == "close" and e["version"] == event_batch(e)]
    before = [e for e in closes if e["time"] < victim["kill_time"]]
    kill_batch = event_batch(victim)
    # Before the kill, every follow brought every standby to the micro-batch just committed,
    # on another executor than the partition's owner.
    owner = {(e["version"], e["partition"]): e["executor"] for e in before}
    for version in range(kill_batch):
        reports = {r["partition"]: r for r in follows[version]}
        assert sorted(reports) == list(range(PARTITIONS)), (version, follows[version])
        for p, r in reports.items():
            assert r["status"] in ("followed", "current") and r["version"] == version, r
            assert r["executor"] != owner[(version, p)], r
    # The killed run's partition was retried, in the same micro-batch, where the last commit
    # was (its previous executor or the standby that followed it: the run prefers both) and
    # replayed at most one run's records (none: its run had not committed). Spark's
    # scheduler may still send a run elsewhere when both stay busy past
    # spark.locality.wait (then it restores in full, as without a standby); the timeline
    # printed above shows every open.
    size: dict[int, int] = {}
    offsets = {(e["partition"], e["version"]): e["committed_offset"] for e in closes}
    for (p, v), end in offsets.items():
        if (p, v - 1) in offsets:
            size[p] = max(size.get(p, 0), end - offsets[(p, v - 1)])
    p = victim["partition"]
    warm = {r["executor"] for r in follows[kill_batch - 1] if r["partition"] == p} | {
        e["executor"] for e in before if e["partition"] == p and e["version"] == kill_batch - 1}
    starts_after = [e for e in events if e["phase"] == "start" and e["time"] > victim["kill_time"]]
    retry = next(e for e in starts_after if e["partition"] == p)
    assert retry["executor"] in warm - {victim["executor"]} and event_batch(retry) == kill_batch, (retry, warm)
    assert retry["restore_records"] <= size[p], (retry, size[p])
    assert not [e for e in closes if e["time"] > victim["kill_time"] and e["executor"] == victim["executor"]]
    # The benchmark's figures (localstate bench --suite cluster, "standby_move_replayed")
    # read the same events the same way.
    from localstate.benchmarks.spark_standby import move_figures

    assert move_figures(events, victim)[p] == {"executor": retry["executor"], "replayed": retry["restore_records"],
                                               "changelog": retry["restore_committed"]}
    print(f"\nkilled executor {victim['executor']} in batch {kill_batch}; partition {p} retried on "
          f"{retry['executor']}, replayed {retry['restore_records']}; run sizes {size}")

    # After the kill the follows go on, on live executors; each standby keeps its copy.
    last = max(follows)
    final = {r["partition"]: r for r in follows[last]}
    assert sorted(final) == list(range(PARTITIONS)) and victim["executor"] not in {r["executor"] for r in final.values()}
    assert all(r["status"] in ("followed", "current") and r["version"] == last for r in final.values()), final
    for p, r in final.items():
        record = read_copy_record(stream / "state" / r["executor"] / "cluster" / COPIES / f"partition-{p}.json")
        assert record is not None and record["role"] == "standby" and record["version"] == last, (p, record)
