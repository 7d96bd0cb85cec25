"""``localstate bench --suite spark`` at its quick size: every figure of issue 6 (and the
Spark state-store comparison of issue 7, issue 17's streaming and Kafka shapes, and the
streaming shape's stateless floors and Flink peer) is produced, positive, without error
cells.

Runs the CLI in a subprocess: the suite starts its own ``local[2]`` session, which cannot
coexist with the session-scoped ``spark`` fixture of other tests in this process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("rocksdict")


def run_quick_suite(tmp_path: Path, suite: str) -> list[dict[str, Any]]:
    """The rows of ``localstate bench --quick --repeats 1 --suite SUITE --strict``, run in a
    subprocess (a suite's own Spark session cannot share this process with the ``spark``
    fixture); fails on a non-zero exit or any error cell."""
    out = tmp_path / "out"
    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, "-c", "from localstate.cli import main; main()", "bench", "--quick", "--repeats", "1",
         "--suite", suite, "--out", str(out), "--strict"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads((out / "results.json").read_text())["rows"]
    assert not [r for r in rows if r["error"]], [r["error"] for r in rows if r["error"]]
    return rows


@pytest.mark.spark
@pytest.mark.slow
def test_spark_suite_runs_quick_and_reports_every_figure(tmp_path: Path) -> None:
    rows = run_quick_suite(tmp_path, "spark")
    cells = {(r["workload"], r["engine"], r["unit"]): r for r in rows}
    for row in rows:
        assert row["suite"] == "spark" and row["median"] > 0 and len(row["runs"]) >= 1, row
    spark_store = "spark structured streaming (RocksDBStateStoreProvider)"
    e2e = cells[("windowed_e2e", "localstate arrow (StatefulJob on Spark)", "events/s")]
    assert e2e["baseline"] == spark_store and e2e["ratio"] == pytest.approx(
        e2e["median"] / cells[("windowed_e2e", spark_store, "events/s")]["median"])
    assert "WARNING" not in cells[("windowed_e2e", spark_store, "events/s")]["notes"]  # read every event
    assert ("windowed_e2e", "localstate per-record (StatefulJob on Spark)", "events/s") in cells
    for path in ("arrow", "per-record"):
        assert ("windowed_state_work", f"localstate {path} (in Spark tasks)", "events/s per core") in cells
        assert ("windowed_state_work", f"localstate {path} (in Spark tasks)", "events/s on 2 cores") in cells
    no_spark = {e for (w, e, _u) in cells if w == "windowed_state_work" and "no Spark" in e}
    assert len(no_spark) == 4
    restores = [r for r in rows if r["workload"] == "windowed_restore" and r["unit"] == "records/s"]
    assert len(restores) == 2 and all(r["params"]["restored_records"] > 0 for r in restores)
    assert cells[("spark_session_start", "local[2]", "s")]["median"] > 0
    # issue 17's streaming shapes: same session, the peers in the same run
    stream = {r["engine"]: r for r in rows if r["workload"] == "stream_e2e"}
    ours = next(r for r in stream.values() if r["baseline"])
    assert "checked identical" in ours["notes"], ours
    assert ours["ratio"] == pytest.approx(ours["median"] / stream[spark_store]["median"])
    # the stateless floors in the same run, and ours / floor per interleaved round
    floors = [e for e in stream if e.startswith("spark, no state")]
    assert len(floors) == 2 and any("mapInArrow" in e for e in floors), stream
    for workload in ("stream_e2e.vs_floor", "stream_e2e.vs_jvm_floor"):
        (versus,) = [r for r in rows if r["workload"] == workload]
        assert versus["baseline"] in floors and versus["unit"] == "x" and versus["median"] > 0
    # Flink runs only where LOCALSTATE_FLINK_PYTHON names a Python with apache-flink; else ours says why
    flink = [e for e in stream if e.startswith("flink")]
    if os.environ.get("LOCALSTATE_FLINK_PYTHON"):
        assert len(flink) == 1 and "same" in stream[flink[0]]["notes"]
        assert [r for r in rows if r["workload"] == "stream_e2e.vs_flink"]
    else:
        assert not flink and "Flink not run: LOCALSTATE_FLINK_PYTHON is not set" in ours["notes"]
    assert len(stream) == 4 + len(flink)
    assert {r["unit"] for r in rows if r["workload"] == "stream_batch_latency"} == {"ms (median)", "ms (p95)"}
    breakdown = [r for r in rows if r["workload"] == "stream_breakdown"]
    assert len(breakdown) == 3 and "python task-s: commit" in breakdown[0]["notes"]
    # the tasks' close (memtable flush, clean-close claim) is in the breakdown, from the runner's
    # closeTimeMs; it may round to 0 ms at this size: a task run that parks its storage for its
    # next micro-batch closes nothing, and the parked storages close after the query
    close_ms = re.search(r"python task-s: close \(memtable flush, clean-close claim\) ([\d,.]+) ms", breakdown[0]["notes"])
    assert close_ms is not None, breakdown[0]["notes"]
    kafka = [r for r in rows if r["workload"] == "kafka_e2e"]
    assert kafka and "localstate-kafka" in kafka[0]["engine"] and "users" in kafka[0]["notes"]
    # Spark's Kafka connector, shuffled and co-partitioned, beside localstate's own source
    from localstate.benchmarks.spark_kafka import CO_PARTITIONED, CONNECTOR, FLOOR, FLOOR_JVM

    assert [r["engine"] for r in kafka[1:5]] == [CONNECTOR, CO_PARTITIONED, FLOOR, FLOOR_JVM]
    # the stateless floors counted every message, and ours / floor is given per round
    for floor_row in kafka[3:5]:
        assert "every message counted" in floor_row["notes"] and "this floor per round" in floor_row["notes"]
        assert floor_row["median"] > 0
    # the Quix peer runs only where quixstreams is installed (LOCALSTATE_QUIX_PYTHON or this venv)
    assert len(kafka) == 6 or (len(kafka) == 5 and "Quix not run" in kafka[0]["notes"])
    assert "windowed_e2e" in (tmp_path / "out" / "results.md").read_text()
