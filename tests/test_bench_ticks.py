"""``localstate bench --suite ticks`` at its quick size: ms per tick micro-batch, the
foreachBatch part of it and changelog bytes per tick, positive and without error cells.

Runs the CLI in a subprocess: the suite starts its own ``local[2]`` session, which cannot
coexist with the session-scoped ``spark`` fixture of other tests in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("rocksdict")

from tests.test_bench_spark import run_quick_suite  # noqa: E402


@pytest.mark.spark
@pytest.mark.slow
def test_ticks_suite_runs_quick(tmp_path: Path) -> None:
    rows = run_quick_suite(tmp_path, "ticks")
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
