"""SIGKILL in the runs a ticking Spark job makes without input, through the one crash harness.

``localstate torture --workload ticks`` (:class:`~localstate.testing.torture_ticks.TickSessionsWorkload`):
a task whose sessions close by processing-time timers, where two runs in three have no
input and only fire timers and commit — what each task does at a tick of
``run_stream(timer_interval_ms=T)``. A child process runs it and is killed with a real
SIGKILL after a timer fired (``timers.after_fire``, mostly in a tick run) and inside the
commit; every reopen must equal the crash-free reference at the committed position, so a
session closed twice, or a close lost, is a divergence.
"""

from __future__ import annotations

from typing import Any

import pytest
from localstate.testing import FULL
from localstate.testing.torture import kill_plan, reference_run, run_trial, run_trials
from localstate.testing.torture_ticks import TickSessionsWorkload

WORKLOAD = "ticks"


def test_sessions_close_in_runs_without_input(tmp_path: Any) -> None:
    """The reference run itself: sessions open in data runs and close, once each, in ticks."""
    ref = reference_run(kill_plan("rocksdb", (), batches=10, workload=WORKLOAD), tmp_path)
    closes = [{k: v for k, v in state.items() if k.startswith("closed:")} for state in ref.states]
    final = ref.states[-1]
    assert len(closes[-1]) > 10 and {v["n"] for v in closes[-1].values()} == {1}
    ticks_that_closed = [b for b in range(1, len(closes)) if b % 3 and len(closes[b]) > len(closes[b - 1])]
    assert len(ticks_that_closed) >= 3, ticks_that_closed
    assert any(k.startswith("open:") for k in final) and any(k.startswith("timer:") for k in final)


def test_a_session_closed_twice_or_lost_is_classified() -> None:
    adapter = TickSessionsWorkload()
    expected = {"closed:k1@250": {"n": 1, "events": 2}, "closed:k2@350": {"n": 1, "events": 1}}
    actual = {"closed:k1@250": {"n": 2, "events": 2}}
    diff = adapter.classify(expected, actual)
    assert diff["duplicated"] == ["closed:k1@250"] and diff["lost"] == ["closed:k2@350"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["rocksdb", "memory"])
def test_kills_in_tick_runs_lose_no_close_and_close_nothing_twice(engine: str, tmp_path: Any) -> None:
    faults = ("timers.after_fire=kill@2", "commit.after_changelog_flush=kill@2", "timers.after_fire=kill@9",
              "checkpoint.before_rename=kill@3")
    if not FULL:
        faults = faults[:3]
    result = run_trial(kill_plan(engine, faults, workload=WORKLOAD), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == len(faults), "a fault point was not reached: the kill did not happen"


@pytest.mark.slow
def test_random_trials_of_the_workload(tmp_path: Any) -> None:
    report = run_trials("rocksdb", "file", 6 if FULL else 2, seed=31, batches=12, workload=WORKLOAD,
                        workdir=tmp_path)
    assert not report.divergences, report.summary()["first_divergence"]
