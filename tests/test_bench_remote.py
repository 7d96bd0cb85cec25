"""The remote suite's quick form: local state, Redis and PostgreSQL (both started by the
suite on 127.0.0.1) give positive rows and ratios, the same join result, and a chart."""

from __future__ import annotations

import math

from localstate.benchmarks import remote_stores
from localstate.benchmarks.registry import SUITES
from localstate.benchmarks.runner import normalize_row


def test_remote_suite_quick_rows(tmp_path):
    chart = tmp_path / "remote.png"
    rows = [normalize_row(r, "remote") for r in remote_stores.run(quick=True, repeats=3, chart=chart)]
    errors = [(r["workload"], r["engine"], r["error"]) for r in rows if r["error"]]
    assert not errors
    by = {(r["workload"], r["engine"]): r for r in rows}
    for mode in remote_stores.MODES:
        for engine in (remote_stores.LOCAL, *remote_stores.REMOTES):
            assert by[(f"lookups {mode}", engine)]["unit"] == "lookups/s"
            assert by[(f"join {mode}", engine)]["unit"] == "events/s"
            assert by[(f"updates {mode}", engine)]["unit"] == "ms/batch"
        for engine in remote_stores.REMOTES:
            ratio = by[(f"local state × lookups {mode}", engine)]
            assert len(ratio["runs"]) == 3 and ratio["unit"] == "×"
            assert (f"local state × join {mode}", engine) in by
    assert len(rows) == 2 * (3 * 3 + 2 * 2)
    assert all(r["median"] > 0 and math.isfinite(r["median"]) and len(r["runs"]) >= 3 for r in rows)
    assert chart.stat().st_size > 0
    assert SUITES["remote"][0] == "localstate.benchmarks.remote_stores"


def test_a_missing_server_is_an_error_row(monkeypatch):
    """No redis-server on PATH: its rows are error cells naming it; the others still run."""
    monkeypatch.setattr(remote_stores.shutil, "which", lambda name: None)
    monkeypatch.setattr(remote_stores, "_PG_DIRS", ())
    monkeypatch.setattr(remote_stores, "QUICK_VIEWS", 1000)
    rows = remote_stores.run(quick=True, repeats=3)
    by = {(r["workload"], r["engine"]): r for r in rows}
    assert "redis-server not found" in by[("lookups per request", "redis")]["error"]
    assert "initdb and postgres not found" in by[("lookups batched", "postgresql")]["error"]
    assert "redis-server" in by[("local state × lookups batched", "redis")]["error"]
    assert by[("lookups batched", remote_stores.LOCAL)]["error"] is None
    assert by[("lookups batched", remote_stores.LOCAL)]["median"] > 0
