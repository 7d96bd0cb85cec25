"""SIGKILL before, during and after each commit step: reopen == last commit, input position matches.

A child process runs a deterministic workload and is killed by a named fault point
(``LOCALSTATE_FAULTS``, a real SIGKILL: no cleanup runs). The parent reopens the task
and compares with a model computed without crashes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
from localstate import Config, TaskStorage

CHILD = textwrap.dedent(
    """
    import json, random, sys
    from localstate import Config, TaskStorage
    config = Config.from_dict(json.loads(sys.argv[1]))
    commits = int(sys.argv[2])
    with TaskStorage(config) as s:
        store = s.store("kv")
        start = (s.checkpoint.input_position or 0) if s.checkpoint else 0
        for batch in range(start + 1, commits + 1):
            rng = random.Random(batch)
            for _ in range(40):
                k = "k%d" % rng.randrange(30)
                if rng.random() < 0.2:
                    store.delete(k)
                else:
                    store.put(k, batch * 1000 + rng.randrange(1000))
            s.commit(input_position=batch)
    """
)


def model_after(batches: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for batch in range(1, batches + 1):
        rng = random.Random(batch)
        for _ in range(40):
            k = f"k{rng.randrange(30)}"
            if rng.random() < 0.2:
                state.pop(k, None)
            else:
                state[k] = batch * 1000 + rng.randrange(1000)
    return state


def run_child(values: dict, commits: int, faults: str | None) -> int:
    env = dict(os.environ)
    env.pop("LOCALSTATE_FAULTS", None)
    if faults:
        env["LOCALSTATE_FAULTS"] = faults
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(values), str(commits)], env=env).returncode


def read_state(config: Config) -> tuple[int, dict[str, int]]:
    with TaskStorage(config) as s:
        pos = s.checkpoint.input_position if s.checkpoint else 0
        with s.store("kv").all() as it:
            return pos, dict(it)


@pytest.fixture
def values(tmp_path):
    return {
        "job.name": "crash",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "memory",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.object.cache.size": 16,
        "stores.kv.write.batch.size": 8,
    }


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
def test_kill_inside_commit_then_reopen_equals_last_commit(values, point, committed):
    rc = run_child(values, 6, f"{point}=kill@3")
    assert rc == -9, "the child should have been SIGKILLed at the fault point"
    config = Config.from_dict(values)
    pos, state = read_state(config)
    if committed is not None:
        assert pos == committed
    assert state == model_after(pos)
    # resume from the checkpoint's input position: the final state equals a crash-free run
    assert run_child(values, 6, None) == 0
    assert read_state(config) == (6, model_after(6))


def test_kill_during_restore_then_reopen(values):
    assert run_child(values, 4, None) == 0
    assert run_child(values, 6, "restore.mid=kill") == -9
    config = Config.from_dict(values)
    assert read_state(config) == (4, model_after(4))


def test_repeated_random_kills_lose_nothing(values):
    rng = random.Random(7)
    points = ["commit.before_changelog_flush", "commit.after_changelog_flush", "checkpoint.before_rename",
              "checkpoint.after_rename", "changelog.append"]
    for _ in range(4):
        run_child(values, 12, f"{rng.choice(points)}=kill@{rng.randint(1, 3)}")
        pos, state = read_state(Config.from_dict(values))
        assert state == model_after(pos)
    assert run_child(values, 12, None) == 0
    assert read_state(Config.from_dict(values)) == (12, model_after(12))
