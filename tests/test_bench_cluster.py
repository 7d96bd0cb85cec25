"""``localstate bench --suite cluster``: its floor (the same stream with no state) runs and
is set against the stateful job, and each micro-batch's parts come from Spark's status
store.

The full suite starts local-cluster and standalone clusters (minutes each); here the
floor's driver runs once at the quick size on ``local[2]``, and the rows are built from
runs of known figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localstate.benchmarks.spark_cluster import (
    CLUSTER_QUICK,
    FLOOR,
    ClusterRun,
    _rows,
    drive,
    write_growing_input,
)

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark


def test_the_floor_counts_each_micro_batch_and_reports_its_parts(tmp_path: Path) -> None:
    write_growing_input(tmp_path / "input", CLUSTER_QUICK)
    run = drive("local[2]" + FLOOR, tmp_path / "input", tmp_path / "run")
    assert len(run.batch_ms) == CLUSTER_QUICK.batches and min(run.batch_ms) > 0
    assert run.moves == run.runs == 0 and run.replayed == []  # no state: no task runs to follow
    parts = run.extra["parts"]
    assert set(parts) == {"driver", "stages wall", "stages task", "scheduling and gaps"}
    assert parts["stages wall"] > 0 and parts["stages task"] > 0
    # each micro-batch's rows are its own per-key counts
    import pyarrow.parquet as pq

    for b, path in enumerate(sorted((tmp_path / "input").glob("*.parquet"))):
        names = pq.read_table(path).column("user_id").to_pylist()
        expected = {k: names.count(k) for k in set(names)}
        rows = json.loads((tmp_path / "run" / "stream" / "output" / f"batch-{b}.json").read_text())
        assert dict(rows) == expected and len(rows) == len(expected)


def _run(master: str, ms: float) -> ClusterRun:
    parts = {"driver": 100.0, "stages wall": ms / 2, "stages task": ms, "scheduling and gaps": ms / 4}
    return ClusterRun(master, [ms] * 6, 0, 30, [0] * 6, ("0", "0"), 1.0, {"parts": parts, "disk": ({}, 0.0)})


def test_rows_set_each_master_against_one_machine_and_its_floor() -> None:
    runs = [_run("local-cluster[2,1,1024]", 3000), _run("local[2]", 2500),
            _run("local-cluster[2,1,1024]" + FLOOR, 2000), _run("local[2]" + FLOOR, 1600)]
    rows = {(r["workload"], r["engine"]): r for r in _rows(runs, CLUSTER_QUICK, 100)}
    cluster = rows["cluster_batch_ms", "local-cluster[2,1,1024]"]["notes"]
    assert cluster.startswith("1.20x local[2]; 1.50x local-cluster[2,1,1024] (no state);"), cluster
    assert "stages wall 1500" in cluster
    assert rows["cluster_batch_ms", "local[2]"]["notes"].startswith("1.56x local[2] (no state);")
    assert rows["cluster_batch_ms", "local-cluster[2,1,1024]" + FLOOR]["notes"].startswith("1.25x local[2] (no state);")
    # the floor has no task runs: no moves, replay or disk rows
    assert ("cluster_moves", "local-cluster[2,1,1024]" + FLOOR) not in rows
    assert rows["cluster_moves", "local-cluster[2,1,1024]"]["median"] == 0.0
