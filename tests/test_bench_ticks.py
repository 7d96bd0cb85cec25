"""``localstate bench --suite ticks`` at its quick size: ms per tick micro-batch, the
foreachBatch part of it and changelog bytes per tick, positive and without error cells.

Runs the CLI in a subprocess: the suite starts its own ``local[2]`` session, which cannot
coexist with the session-scoped ``spark`` fixture of other tests in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("rocksdict")


@pytest.mark.spark
@pytest.mark.slow
def test_ticks_suite_runs_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, "-c", "from localstate.cli import main; main()", "bench", "--quick", "--repeats", "1",
         "--suite", "ticks", "--out", str(out), "--strict"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert not [r for r in rows if r["error"]], [r["error"] for r in rows if r["error"]]
    cells = {(r["workload"], r["engine"]): r for r in rows}
    ours, floor = "rocksdb + file changelog", "spark floor (no localstate)"
    assert set(cells) == {("tick_batch", ours), ("tick_batch", floor), ("tick_batch_addBatch", ours),
                          ("tick_batch_addBatch", floor), ("tick_changelog_bytes", ours)}
    for row in rows:
        assert row["suite"] == "ticks" and len(row["runs"]) == 1, row
    for name in ("tick_batch", "tick_batch_addBatch"):
        assert cells[(name, floor)]["median"] > 0 and cells[(name, ours)]["baseline"] == floor
        assert cells[(name, ours)]["ratio"] == cells[(name, ours)]["median"] / cells[(name, floor)]["median"]
    assert cells[("tick_batch_addBatch", ours)]["median"] <= cells[("tick_batch", ours)]["median"]
    assert abs(cells[("tick_changelog_bytes", ours)]["median"]) < 1000  # a commit without writes adds ~nothing
