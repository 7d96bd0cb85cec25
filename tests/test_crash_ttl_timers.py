"""SIGKILL around TTL expiry and timer firing: reopen == last commit; nothing fires twice or is lost.

The same method as tests/test_crash_core.py: a child process runs a deterministic
workload and is killed at a named fault point (``LOCALSTATE_FAULTS``, a real SIGKILL);
the parent reopens the task and compares it with a crash-free model. Each input batch
advances event time, writes TTL entries (which expire two batches later: the commit
sweeps them as tombstones) and registers timers; a firing timer counts itself into the
``fired`` store in the same commit, so a timer fired twice shows as a count of 2 and
a lost one as a missing key.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.testing import FULL
from localstate.timers import EVENT_TIME, Timers

WORKLOAD = textwrap.dedent(
    """
    import random
    from localstate.timers import EVENT_TIME, Timers

    def apply_batch(st, batch):
        rng = random.Random(batch)
        st.advance_event_time(batch * 100)
        live, fired = st.store("live"), st.store("fired")
        timers = Timers(st.store("timers"), EVENT_TIME, lambda: st.event_time)
        for _ in range(15):
            k = "k%d" % rng.randrange(25)
            live[k] = batch
            timers.register(k, batch * 100 + rng.choice((50, 150, 250)))

        def on_timer(key, ts):
            name = "%s@%d" % (key, ts)
            fired[name] = fired.get(name, 0) + 1

        timers.fire(on_timer)
    """
)

CHILD = WORKLOAD + textwrap.dedent(
    """
    import json, sys
    from localstate import Config, TaskStorage
    config = Config.from_dict(json.loads(sys.argv[1]))
    with TaskStorage(config) as st:
        start = (st.checkpoint.input_position or 0) if st.checkpoint else 0
        for batch in range(start + 1, int(sys.argv[2]) + 1):
            apply_batch(st, batch)
            st.commit(input_position=batch)
    """
)


def observe(st: TaskStorage) -> dict[str, Any]:
    with st.store("live").all() as it:
        live = dict(it)
    with st.store("fired").all() as it:
        fired = dict(it)
    timers = Timers(st.store("timers"), EVENT_TIME, lambda: st.event_time or 0).pending()
    return {"live": live, "fired": fired, "timers": [list(t) for t in timers], "time": st.event_time}


def model_after(values: dict[str, Any], batches: int, tmp: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(WORKLOAD, namespace)  # the child's own workload, run here without faults
    config = Config.from_dict({**values, "job.state.dir": str(tmp / "model-state"),
                               "systems.file.path": str(tmp / "model-log")})
    with TaskStorage(config) as st:
        for batch in range(1, batches + 1):
            namespace["apply_batch"](st, batch)
            st.commit(input_position=batch)
        return observe(st)


def run_child(values: dict[str, Any], batches: int, faults: str | None) -> int:
    env = dict(os.environ)
    env.pop("LOCALSTATE_FAULTS", None)
    if faults:
        env["LOCALSTATE_FAULTS"] = faults
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(values), str(batches)], env=env).returncode


def reopen(values: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with TaskStorage(Config.from_dict(values)) as st:
        return (st.checkpoint.input_position if st.checkpoint else 0), observe(st)


@pytest.fixture
def values(tmp_path: Any) -> dict[str, Any]:
    return {
        "job.name": "crash-ttl",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.live.factory": "rocksdb",
        "stores.live.key.serde": "string",
        "stores.live.msg.serde": "json",
        "stores.live.ttl.ms": 200,
        "stores.live.ttl.time": "event",
        "stores.live.object.cache.size": 16,
        "stores.live.write.batch.size": 8,
        "stores.fired.factory": "memory",
        "stores.fired.key.serde": "string",
        "stores.fired.msg.serde": "json",
        "stores.timers.factory": "rocksdb",
        "stores.timers.object.cache.size": 16,
        "stores.timers.write.batch.size": 8,
    }


@pytest.mark.slow
def test_kills_around_expiry_and_firing_lose_nothing_and_fire_nothing_twice(values, tmp_path):
    batches = 12 if FULL else 8
    rounds = 16 if FULL else 5
    rng = random.Random(11)
    points = ["commit.before_changelog_flush", "commit.after_changelog_flush", "commit.after_engine_checkpoint",
              "checkpoint.before_rename", "checkpoint.after_rename", "changelog.append",
              "ttl.after_sweep", "timers.after_fire"]  # mid-sweep and mid-firing, before the commit
    models = {b: model_after(values, b, tmp_path / f"model{b}") for b in range(batches + 1)}
    killed = 0
    plan = ["ttl.after_sweep", "timers.after_fire"] + [rng.choice(points) for _ in range(rounds - 2)]
    for point in plan:
        rc = run_child(values, batches, f"{point}=kill@{rng.randint(1, 4)}")
        killed += rc == -9
        pos, state = reopen(values)
        assert state == models[pos], f"after a kill the task at batch {pos} differs from the model"
    assert killed >= 2, "the children were not killed: the fault points did not fire"
    assert run_child(values, batches, None) == 0
    pos, state = reopen(values)
    assert (pos, state) == (batches, models[batches])
    assert state["fired"] and set(state["fired"].values()) == {1}  # every due timer fired exactly once
    assert all(v >= batches - 1 for v in state["live"].values())  # older entries expired (ttl = 2 batches)
