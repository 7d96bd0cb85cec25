"""SIGKILL around TTL expiry and timer firing, through the one crash harness.

The trials are ``localstate torture --workload ttl-timers`` (core/testing/torture.py with
:class:`~localstate.testing.torture_adapters.TtlTimersWorkload`): a child process runs the
workload and is killed with a real SIGKILL at a named fault point (``LOCALSTATE_FAULTS``)
— inside the commit, after the TTL sweep logged its tombstones (``ttl.after_sweep``) and
after a timer fired but before the commit (``timers.after_fire``); every reopen must equal
the crash-free reference at the committed position, so a timer fired twice (a count of 2),
a lost firing or a resurrected expired entry is a divergence.
"""

from __future__ import annotations

from typing import Any

import pytest
from localstate import ConfigError
from localstate.testing import FULL
from localstate.testing.torture import kill_plan, reference_run, run_trial, run_trials
from localstate.testing.torture_adapters import TtlTimersWorkload, adapter_for

WORKLOAD = "ttl-timers"


def test_the_workload_expires_entries_and_fires_timers_exactly_once(tmp_path):
    """The reference run itself: the workload really exercises expiry and firing."""
    plan = kill_plan("rocksdb", (), batches=8, workload=WORKLOAD)
    ref = reference_run(plan, tmp_path)
    final = ref.states[-1]
    fired = {k: v for k, v in final.items() if k.startswith("fired:")}
    assert len(fired) > 20 and set(fired.values()) == {1}
    assert any(k.startswith("fired:chain-") for k in fired)  # timers registered while firing fired too
    assert any(k.startswith("timer:") for k in final)  # and later ones are still pending
    live = {k: v for k, v in final.items() if k.startswith("live:")}
    assert live and all(v["batch"] >= 7 for v in live.values())  # older entries expired (ttl = 2 batches)
    written = {k for state in ref.states for k in state if k.startswith("live:")}
    assert len(written) > len(live)
    assert final["event_time"] == 8 * TtlTimersWorkload.STEP_MS


def test_a_second_firing_or_a_lost_one_is_classified():
    adapter = TtlTimersWorkload()
    expected = {"fired:k1@100": 1, "fired:k2@100": 1, "timer:k3@300": 1, "live:k4": {"batch": 2, "op": 0}}
    actual = {"fired:k1@100": 2, "timer:k3@300": 1, "live:k4": {"batch": 2, "op": 0}, "live:k5": {"batch": 1}}
    diff = adapter.classify(expected, actual)
    assert diff["duplicated"] == ["fired:k1@100"]
    assert diff["lost"] == ["fired:k2@100"]
    assert diff["resurrected"] == ["live:k5"]


def test_an_unknown_workload_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match="ttl-timers"):
        adapter_for("rocksdb", "ttl-timer")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["rocksdb", "memory"])
def test_kills_around_expiry_and_firing_lose_nothing_and_fire_nothing_twice(engine, tmp_path):
    faults = ("ttl.after_sweep=kill@2", "timers.after_fire=kill@3", "commit.after_changelog_flush=kill@1",
              "timers.after_fire=kill@20", "checkpoint.before_rename=kill@2")
    if not FULL:
        faults = faults[:3]
    result = run_trial(kill_plan(engine, faults, workload=WORKLOAD), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == len(faults), "a fault point was not reached: the kill did not happen"
    assert result.positions[0] == 0 and max(result.positions) > 0


@pytest.mark.slow
def test_random_trials_of_the_workload(tmp_path: Any):
    report = run_trials("rocksdb", "file", 6 if FULL else 2, seed=160, batches=10, workload=WORKLOAD,
                        workdir=tmp_path)
    assert not report.divergences, report.summary()["first_divergence"]


def test_cli_runs_the_workload_and_its_reproducer_names_it(tmp_path):
    import json

    from click.testing import CliRunner
    from localstate.testing.torture import plan_trial, reproducer, torture

    out = tmp_path / "t.json"
    r = CliRunner().invoke(torture, ["--engine", "leveldb", "--workload", WORKLOAD, "--trials", "1", "--seed", "5",
                                     "--batches", "4", "--ops", "10", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["summaries"][0]["divergences"] == 0
    plan = plan_trial(5, "leveldb", "file", workload=WORKLOAD)
    assert reproducer(plan).endswith(f"--workload {WORKLOAD}")
    bad = CliRunner().invoke(torture, ["--engine", "memory", "--workload", "nosuch"])
    assert bad.exit_code == 2 and "ttl-timers" in bad.output
