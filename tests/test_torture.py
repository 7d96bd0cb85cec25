"""Crash trials (short CI form) over every installed engine × changelog system.

Each trial SIGKILLs a child task at a named fault point or a random moment, reopens,
replays the input from the checkpoint's input position and compares with a
crash-free reference run (see ``localstate.testing.torture``). ``LOCALSTATE_FULL=1``
runs 25 trials per combination; ``localstate torture --trials 200`` is the full run
recorded in RELIABILITY.md.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner
from localstate.testing import FULL
from localstate.testing import torture as T

TRIALS = 25 if FULL else 2
FILE_ENGINES = T.torture_engines()


def _assert_clean(report: T.TortureReport) -> None:
    s = report.summary()
    assert s["trials"] == len(report.results) > 0
    assert s["divergences"] == 0, json.dumps(s["first_divergence"], indent=2, default=str)
    assert s["lost"] == s["duplicated"] == s["resurrected"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", FILE_ENGINES)
def test_crash_trials_file_changelog(engine, tmp_path):
    report = T.run_trials(engine, "file", TRIALS, seed=1000, workdir=tmp_path, batches=8, ops=30, jobs=2)
    _assert_clean(report)
    assert sum(r.crashes for r in report.results) >= 1, "no trial crashed: the harness tested nothing"


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.parametrize("engine", FILE_ENGINES)
def test_crash_trials_kafka_changelog(engine, tmp_path, kafka_broker):
    report = T.run_trials(engine, "kafka", 10 if FULL else 1 if engine != "memory" else 2, seed=2002,
                          workdir=tmp_path, batches=6, ops=20, bootstrap=kafka_broker, jobs=2)
    _assert_clean(report)


SNAPSHOTTING = {"rocksdb", "search"}
"""Engines that take a local snapshot at commit (so pass ``snapshot.mid``)."""


@pytest.mark.slow
@pytest.mark.parametrize("engine", FILE_ENGINES)
def test_named_commit_kills_reopen_equals_the_committed_reference(engine, tmp_path):
    """Every engine, killed at each step of a commit in turn (each child resuming from
    what the killed one left): every reopen equals the crash-free reference at its
    committed position, and the final state and change records equal it too."""
    points = T.COMMIT_POINTS + (("snapshot.mid",) if engine in SNAPSHOTTING else ())
    faults = tuple(f"{p}=kill@{2 + i % 3}" for i, p in enumerate(points * (2 if FULL else 1)))
    result = T.run_trial(T.kill_plan(engine, faults, ops=30), tmp_path)
    assert result.ok, json.dumps(result.divergence, indent=2, default=str)
    assert result.crashes == len(faults), "a fault point was not reached"
    assert all(a <= b for a, b in zip(result.positions, result.positions[1:])), result.positions


def test_every_named_point_crashes_and_recovers(tmp_path):
    """Each fault point the file changelog + memory engine pass through really kills the child."""
    points = [p for p in T.CRASH_POINTS if p not in ("snapshot.mid",)]
    for i, point in enumerate(points):
        faults = ("commit.after_changelog_flush=kill@2", f"{point}=kill@1") if point == "restore.mid" \
            else (f"{point}=kill@{1 if point.startswith('compaction') else 2}",)
        plan = T.TrialPlan(seed=50 + i, engine="memory", changelog="file", batches=10, ops=40, keys=20,
                           compact_every=2, retention_ms=0, faults=faults)
        res = T.run_trial(plan, tmp_path / point)
        assert res.ok, res.divergence
        assert res.crashes == len(faults), f"{point} was never reached"
        assert len(res.restores) == len(faults) - (point == "restore.mid")  # killed inside its restore


def test_plans_are_deterministic_and_reproducible():
    a = T.plan_trial(7, "memory", "file")
    assert a == T.plan_trial(7, "memory", "file")
    assert "--seed 7" in T.reproducer(a)
    assert {T.plan_trial(s, "memory", "file").faults for s in range(40)} != {a.faults}


def test_classification_of_divergences():
    w = T.KeyValueWorkload()
    expected = {"a": {"n": 2, "ops": ["1.0", "2.0"]}, "b": {"n": 1, "ops": ["1.1"]}, "c": {"n": 1, "ops": ["1.2"]}}
    actual = {"a": {"n": 3, "ops": ["1.0", "2.0", "2.0"]}, "c": {"n": 0, "ops": []}, "d": {"n": 1, "ops": ["x"]}}
    assert w.classify(expected, actual) == {"lost": ["b", "c"], "resurrected": ["d"], "duplicated": ["a"],
                                             "differs": []}


BUGGY = textwrap.dedent(
    '''
    from localstate.engines.memory import MemoryEngine, MemoryEngineFactory

    class ForgetfulEngine(MemoryEngine):
        """Declared test double: its restore drops the last restored record."""
        def restore(self, records, *, into_empty=False):
            records = list(records)
            super().restore(records[:-1], into_empty=into_empty)

    class ForgetfulFactory(MemoryEngineFactory):
        def create(self, spec, context):
            return ForgetfulEngine(spec.name)
    '''
)


def test_harness_reports_a_broken_engine_with_a_reproducer(tmp_path, monkeypatch):
    """A deliberately broken engine (test double: loses one record per restore) must diverge."""
    (tmp_path / "buggy_engine_mod.py").write_text(BUGGY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plan = T.TrialPlan(seed=5, engine="buggy_engine_mod:ForgetfulFactory", changelog="file", batches=6, ops=30,
                       keys=20, compact_every=0, retention_ms=0, faults=("commit.after_changelog_flush=kill@3",))
    res = T.run_trial(plan, tmp_path / "trial")
    assert not res.ok
    d = res.divergence
    assert d["stage"].startswith("reopen after 1 crash")
    assert d["position"] == 2
    assert d["lost"] or d["differs"] or d["resurrected"] or d["duplicated"]
    assert "--seed 5" in d["reproduce"]


def test_cli_runs_trials_and_writes_json(tmp_path):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(T.torture, ["--engine", "memory", "--trials", "2", "--seed", "11", "--batches", "4",
                                       "--ops", "10", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "2 trials" in r.output and "0 divergences" in r.output
    s = json.loads(out.read_text())["summaries"][0]
    assert s["engine"] == "memory" and s["trials"] == 2 and s["divergences"] == 0


def test_cli_rejects_an_engine_that_is_not_installed():
    r = CliRunner().invoke(T.torture, ["--engine", "nosuch", "--trials", "1"])
    assert r.exit_code == 2
    assert "nosuch" in r.output


def test_recovery_benchmark_quick_rows():
    from localstate.benchmarks import reliability

    rows = reliability.run(quick=True, repeats=1)
    engines = {r["engine"] for r in rows}
    assert "memory" in engines
    for r in rows:
        assert r["error"] is None, r["error"]
        assert r["unit"] == "s" and r["median"] > 0 and len(r["runs"]) == 1
    crash = [r for r in rows if r["workload"] == "reopen after SIGKILL"]
    assert crash and all(r["baseline"] == "reopen after clean close" and r["ratio"] > 0 for r in crash)
