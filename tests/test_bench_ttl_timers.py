"""The ttl suite runs end to end at a tiny size and yields well-formed rows with ratios."""

from __future__ import annotations

from localstate.benchmarks import ttl_timers
from localstate.benchmarks.registry import SUITES
from localstate.benchmarks.runner import normalize_row


def test_ttl_suite_rows(monkeypatch):
    monkeypatch.setattr(ttl_timers, "QUICK_RECORDS", 2000)
    rows = [normalize_row(r, "ttl") for r in ttl_timers.run(quick=True, repeats=1, engines=("memory",))]
    by = {(r["workload"], r["engine"]): r for r in rows}
    for op in ("put", "get", "put (fresh values)", "get (fresh values)"):
        ttl, plain = by[(f"ttl {op}", "memory")], by[(f"ttl {op}", "memory (no ttl)")]
        assert ttl["baseline"] == "memory (no ttl)" and ttl["ratio"] == ttl["median"] / plain["median"]
    assert all(r["error"] is None for r in rows)
    for name in ("timers register batch", "timers fire batch", "timers register", "timers fire"):
        assert by[(name, "memory")]["median"] > 0 and by[(name, "memory")]["unit"] == "timers/s"
    assert SUITES["ttl"][0] == "localstate.benchmarks.ttl_timers"


def test_fresh_process_trials_give_rates_and_costs():
    """``python -m localstate.benchmarks.ttl_timers --fresh N``: each trial in its own process."""
    got = ttl_timers.fresh_processes("memory", 1, records=2000)
    assert set(got) == {"put/s", "ttl put/s", "get/s", "ttl get/s", "ttl put cost", "ttl get cost",
                        "timers registered/s", "timers fired/s"}
    assert all(v > 0 for v in got.values())
    assert got["ttl get cost"] == got["get/s"] / got["ttl get/s"]
