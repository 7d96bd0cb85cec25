"""Host affinity of the Spark runner: the placement registry, and copies left behind.

The registry's proposals are pure logic (tested here directly); the copies are real
rocksdb stores on a shared file changelog, opened by the runner's own task code with
one state dir per "executor". The runs on a real cluster are in
``tests/test_spark_cluster_affinity.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from localstate import Config
from localstate.contrib.spark.placement import Placement, location, sweep_copies
from localstate.contrib.spark.runner import TaskRun, executor_state_dir, run_partition
from localstate.contrib.spark.streaming import committed_batches
from localstate.copies import copy_record_path, read_copy_record
from localstate.layout import store_dir, task_lock
from localstate.testing.spark import key_count_task, read_counts
from localstate.testing.spark_cluster_driver import MisplacingPlacement, cluster_config, fresh_state

pytestmark = pytest.mark.spark


def test_first_proposal_spreads_partitions_evenly() -> None:
    placement = Placement(6)
    proposed = placement.assign(["2", "0", "1"])
    assert Counter(proposed) == {"0": 2, "1": 2, "2": 2}
    assert placement.assign([]) == [None] * 6


def test_partitions_stay_with_the_executor_that_ran_them() -> None:
    placement = Placement(6)
    ran = {0: "1", 1: "1", 2: "2", 3: "0", 4: "0", 5: "2"}
    placement.record(ran)
    for _ in range(3):
        assert placement.assign(["0", "1", "2"]) == [ran[p] for p in range(6)]
        placement.record(ran)
    assert (placement.runs, placement.moves) == (18, 0)


def test_a_lost_executor_moves_only_its_own_partitions_and_a_new_one_takes_them() -> None:
    placement = Placement(6)
    placement.record({0: "0", 1: "1", 2: "2", 3: "0", 4: "1", 5: "2"})
    after_loss = placement.assign(["0", "1"])
    assert [after_loss[p] for p in (0, 1, 3, 4)] == ["0", "1", "0", "1"]
    assert sorted(after_loss[p] for p in (2, 5)) == ["0", "1"]
    placement.record(dict(enumerate(after_loss)))
    # A re-launched executor (a new id) gets the newest arrivals back, nothing else moves.
    with_new = placement.assign(["0", "1", "3"])
    assert [with_new[p] for p in (0, 1, 3, 4)] == ["0", "1", "0", "1"]
    assert [with_new[p] for p in (2, 5)] == ["3", "3"]


def test_an_executor_above_its_share_gives_up_its_newest_partitions() -> None:
    placement = Placement(4)
    placement.record({0: "0", 1: "0"})
    placement.record({2: "0"})  # arrived later, e.g. its own executor was busy
    placement.record({3: "1"})
    assert placement.assign(["0", "1"]) == ["0", "0", "1", "1"]


def test_a_run_elsewhere_is_recorded_where_it_ran() -> None:
    placement = Placement(2)
    placement.record({0: "0", 1: "1"})
    placement.record({0: "1", 1: "1"})
    assert (placement.runs, placement.moves) == (2, 1)
    assert placement.owners == {0: "1", 1: "1"}
    placement.forget()
    assert placement.owners == {} and Counter(placement.assign(["0", "1"])) == {"0": 1, "1": 1}


def test_misplacing_registry_always_proposes_another_executor() -> None:
    placement = MisplacingPlacement(4)
    placement.record({0: "0", 1: "1", 2: "0", 3: "1"})
    assert placement.assign(["0", "1"]) == ["1", "0", "1", "0"]


def test_location_is_sparks_executor_location() -> None:
    assert location("7", "10.0.0.5") == "executor_10.0.0.5_7"


# -- copies left behind ------------------------------------------------------------------------------
SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64())])


def _run(config: Config, partition: int, version: int, keys: list[str]) -> None:
    run = TaskRun(config, key_count_task("user_id"), SCHEMA, batch_id=version, lock_wait_s=10.0)
    for _ in run_partition(run, partition, iter([pa.RecordBatch.from_pydict({"user_id": keys})])):
        pass


@pytest.fixture()
def shared(tmp_path: Path) -> Config:
    return cluster_config(tmp_path, partitions=2)


def test_a_copy_is_deleted_once_its_owner_committed_past_it(shared: Config, tmp_path: Path) -> None:
    on_a, on_b = executor_state_dir(shared, "a"), executor_state_dir(shared, "b")
    _run(on_a, 0, 0, ["x", "y"])
    _run(on_a, 1, 0, ["z"])
    assert read_copy_record(copy_record_path(on_a, 0))["version"] == 0
    # Partition 0 moved to b, which has not committed past a's copy yet: kept.
    assert sweep_copies(on_a, {0: "b", 1: "a"}, "a") == []
    _run(on_b, 0, 1, ["x"])
    # The registry still gives partition 0 to a: kept (a runs it next).
    assert sweep_copies(on_a, {0: "a", 1: "a"}, "a") == []
    # A run of partition 0 holds its lock here: kept.
    lock = task_lock(on_a, 0)
    try:
        assert sweep_copies(on_a, {0: "b", 1: "a"}, "a") == []
    finally:
        lock.release()
    assert store_dir(on_a, "counts", 0).is_dir()
    assert sweep_copies(on_a, {0: "b", 1: "a"}, "a") == [0]
    assert not store_dir(on_a, "counts", 0).exists() and not copy_record_path(on_a, 0).exists()
    assert store_dir(on_a, "counts", 1).is_dir()  # its own partition stays
    # Back on a (a moved task), the partition restores from the changelog, exactly.
    _run(on_a, 0, 2, ["y"])
    assert committed_batches(shared) == {0: 2, 1: 0}
    assert read_counts(fresh_state(shared, tmp_path)) == {"x": 2, "y": 2, "z": 1}


def test_a_copy_without_a_record_is_kept(shared: Config) -> None:
    on_a, on_b = executor_state_dir(shared, "a"), executor_state_dir(shared, "b")
    _run(on_a, 0, 0, ["x"])
    _run(on_b, 0, 1, ["x"])
    copy_record_path(on_a, 0).unlink()
    assert sweep_copies(on_a, {0: "b"}, "a") == []
    assert store_dir(on_a, "counts", 0).is_dir()


def test_inspect_shows_whose_copies_a_state_dir_holds_and_which_are_stale(shared: Config, tmp_path: Path) -> None:
    from localstate.inspect import inspect_path

    on_a, on_b = executor_state_dir(shared, "a"), executor_state_dir(shared, "b")
    _run(on_a, 0, 0, ["x"])
    _run(on_b, 0, 1, ["x"])
    _run(on_a, 1, 0, ["z"])
    copy_record_path(on_a, 1).unlink()
    rows = {(r["root"], r["partition"]): r for r in inspect_path(tmp_path)["stores"]}
    assert {k: (r["copy_version"], r["left_by"], r["copy"]) for k, r in rows.items()} == {
        ("state/a", 0): (0, "driver", "stale (committed version 1)"),
        ("state/b", 0): (1, "driver", "current"),
        ("state/a", 1): (None, None, "no record"),
    }
    # Inspecting the state dir alone: no checkpoint to compare with.
    (row,) = [r for r in inspect_path(tmp_path / "state" / "b")["stores"]]
    assert row["copy"].startswith("unknown") and row["copy_version"] == 1


def test_a_sweep_that_could_not_finish_leaves_no_half_copy_in_use(shared: Config) -> None:
    on_a, on_b = executor_state_dir(shared, "a"), executor_state_dir(shared, "b")
    _run(on_a, 0, 0, ["x"])
    _run(on_b, 0, 1, ["x"])
    leftover = store_dir(on_a, "counts", 0).with_name(".deleting-0-1")
    leftover.mkdir()  # what a delete cut short leaves: out of use, removed by the next sweep
    assert sweep_copies(on_a, {0: "b"}, "a") == [0]
    assert not leftover.exists() and not list(store_dir(on_a, "counts", 0).parent.iterdir())
