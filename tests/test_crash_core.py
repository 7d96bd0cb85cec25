"""SIGKILL before, during and after each commit step: reopen == last commit, input position matches.

Runs on the crash-trial harness (:mod:`localstate.testing.torture`): a child process
runs the seeded workload and is killed by a named fault point (``LOCALSTATE_FAULTS``,
a real SIGKILL: no cleanup runs); the next child reopens the task, reports what it
found, and must equal the crash-free reference at that input position.
"""

from __future__ import annotations

import random

import pytest
from localstate.testing.torture import kill_plan, run_trial


@pytest.mark.parametrize(
    "point, committed",
    [
        ("commit.before_changelog_flush", 2),
        ("commit.after_changelog_flush", 2),
        ("commit.after_engine_checkpoint", 2),
        ("checkpoint.before_rename", 2),
        ("checkpoint.after_rename", 3),
        ("changelog.append", None),
    ],
)
def test_kill_inside_commit_then_reopen_equals_last_commit(tmp_path, point, committed):
    result = run_trial(kill_plan("memory", (f"{point}=kill@3",), batches=6), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == 1, "the child should have been SIGKILLed at the fault point"
    if committed is not None:
        assert result.positions == [0, committed]  # then resumed from there to the end


def test_kill_during_restore_then_reopen(tmp_path):
    faults = ("checkpoint.after_rename=kill@4", "restore.mid=kill")
    result = run_trial(kill_plan("memory", faults, batches=6), tmp_path)
    assert result.ok, result.divergence
    # the second child dies inside the restore, before it could report; the third finds 4
    assert result.crashes == 2 and result.positions == [0, 4]


def test_repeated_random_kills_lose_nothing(tmp_path):
    rng = random.Random(7)
    points = ["commit.before_changelog_flush", "commit.after_changelog_flush", "checkpoint.before_rename",
              "checkpoint.after_rename", "changelog.append"]
    faults = tuple(f"{rng.choice(points)}=kill@{rng.randint(1, 3)}" for _ in range(4))
    result = run_trial(kill_plan("memory", faults, batches=14), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == 4
