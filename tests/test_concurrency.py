"""Concurrency: one writer per task partition, zombies fenced, readers harmless.

* a second process (or a second TaskStorage in the same process) opening the same task
  partition is refused with StoreLockedError naming the holder's pid; the lock dies
  with its holder (SIGKILL) so a restart is never blocked by a stale lock;
* a zombie writer — a task instance paused (SIGSTOP) while a new instance on another
  machine took over through Kafka — is fenced when it wakes up and tries to commit;
* ``localstate inspect`` running over and over against a live, committing task never
  changes or corrupts its files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import Config, TaskStorage
from localstate.cli import cli
from localstate.errors import StoreLockedError

HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from localstate import Config, TaskStorage
    config = Config.from_dict(json.loads(sys.argv[1]))
    commits, pause = int(sys.argv[2]), float(sys.argv[3])
    try:
        with TaskStorage(config) as s:
            kv = s.store("kv")
            start = (s.checkpoint.input_position or 0) if s.checkpoint else 0
            print(json.dumps({"opened": True, "start": start}), flush=True)
            for batch in range(start + 1, commits + 1):
                for i in range(50):
                    kv.put(f"k{(batch * 7 + i) % 120}", f"{batch}.{i}")
                if batch % 5 == 0:
                    kv.delete(f"k{batch % 120}")
                s.commit(input_position=batch)
                print(json.dumps({"committed": batch}), flush=True)
                time.sleep(pause)
            print(json.dumps({"done": True}), flush=True)
            sys.stdin.readline()  # hold the task open until told to go
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
        sys.exit(7)
    """
)


def model(commits: int) -> dict[str, str]:
    state: dict[str, str] = {}
    for batch in range(1, commits + 1):
        for i in range(50):
            state[f"k{(batch * 7 + i) % 120}"] = f"{batch}.{i}"
        if batch % 5 == 0:
            state.pop(f"k{batch % 120}", None)
    return state


def values(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    v = {
        "job.name": "conc",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "systems.file.segment.bytes": 4096,
        "stores.kv.factory": "memory",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "string",
    }
    v.update(extra)
    return v


def start_holder(v: dict[str, Any], commits: int, pause: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(v), str(commits), str(pause)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen[str], key: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited ({proc.wait()}) before reporting {key!r}")
        msg = json.loads(line)
        if key in msg or "error" in msg:
            return msg
    raise AssertionError(f"child did not report {key!r} in {timeout}s")


def finish(proc: subprocess.Popen[str]) -> int:
    assert proc.stdin is not None
    try:
        proc.stdin.write("\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass
    return proc.wait(timeout=60)


def dump(s: TaskStorage) -> dict[str, str]:
    with s.store("kv").all() as it:
        return dict(it)


def test_second_process_is_refused_and_the_lock_dies_with_its_holder(tmp_path):
    v = values(tmp_path)
    holder = start_holder(v, 3)
    try:
        assert wait_for(holder, "done") == {"done": True}
        with pytest.raises(StoreLockedError, match=rf"locked by pid {holder.pid}") as e:
            TaskStorage(Config.from_dict(v))
        assert "partition-0.lock" in str(e.value) and "only one writer" in str(e.value)
        # another state dir on the same changelog: the changelog partition lock refuses it
        other = Config.from_dict({**v, "job.state.dir": str(tmp_path / "state-b")})
        with pytest.raises(StoreLockedError, match=rf"changelog partition .* locked by pid {holder.pid}"):
            TaskStorage(other)
        second = start_holder(v, 3)
        assert wait_for(second, "opened")["error"] == "StoreLockedError"
        assert second.wait(timeout=30) == 7
    finally:
        holder.kill()  # SIGKILL: no cleanup, the flock goes with the process
        holder.wait()
    with TaskStorage(Config.from_dict(v)) as s:
        assert s.checkpoint.input_position == 3 and dump(s) == model(3)


def test_second_open_in_the_same_process_is_refused(tmp_path):
    config = Config.from_dict(values(tmp_path))
    with TaskStorage(config):
        with pytest.raises(StoreLockedError, match=f"locked by pid {os.getpid()}"):
            TaskStorage(config)
    with TaskStorage(config) as s:  # released by close
        assert s.stores == ["kv"]


@pytest.mark.kafka
def test_paused_zombie_is_fenced_when_it_wakes_up(kafka_broker, tmp_path):
    """Instance A commits, is SIGSTOPped (a long GC pause, a partitioned machine);
    instance B on another machine takes the task over via Kafka and commits; A wakes
    up and its next commit fails with FencedError; B's state is what survives."""
    topic = f"conc-kv-{os.getpid()}-{time.monotonic_ns()}"
    kafka = {
        "job.name": f"conc{time.monotonic_ns()}",
        "job.changelog.system": "kafka",
        "stores.kv.changelog": f"kafka.{topic}",
        "systems.kafka.bootstrap.servers": kafka_broker,
        "systems.kafka.timeout.ms": 5000,
        "systems.kafka.retries": 1,
    }
    va = values(tmp_path / "a", **kafka)
    a = start_holder(va, 40, pause=0.2)
    try:
        wait_for(a, "committed")
        os.kill(a.pid, signal.SIGSTOP)
        vb = values(tmp_path / "b", **kafka)
        with TaskStorage(Config.from_dict(vb)) as b:
            taken_at = b.checkpoint.input_position
            assert dump(b) == model(taken_at)
            b.store("kv").put("owner", "b")
            b.commit(input_position=taken_at)
            os.kill(a.pid, signal.SIGCONT)
            msg = wait_for(a, "error", timeout=60)
            assert msg["error"] == "FencedError", msg
            assert "fenced by a newer instance" in msg["message"]
            assert a.wait(timeout=30) == 7
            b.store("kv").put("owner", "b2")
            b.commit(input_position=taken_at)
        with TaskStorage(Config.from_dict(values(tmp_path / "c", **kafka))) as c:
            assert c.checkpoint.input_position == taken_at
            assert dump(c) == {**model(taken_at), "owner": "b2"}
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()


def _snapshot_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_inspect_on_a_live_task_never_changes_or_corrupts_it(tmp_path):
    v = values(tmp_path)
    commits = 60
    holder = start_holder(v, commits, pause=0.01)
    runner = CliRunner()
    reports = 0
    try:
        wait_for(holder, "opened")
        done = False
        while not done:
            r = runner.invoke(cli, ["inspect", "--json", str(tmp_path / "changelog")])
            assert r.exit_code == 0, r.output
            report = json.loads(r.output)
            reports += 1
            ends = {}
            for p in report["partitions"]:
                assert "error" not in p, p["error"]
                assert p["locked_by"] == str(holder.pid)
                ends[p["stream"]] = p["end_offset"]
            for c in report["checkpoints"]:
                assert "error" not in c, c["error"]
                for store, off in c["offsets"].items():
                    assert off <= ends[f"conc-{store}"], "a checkpoint points past its changelog"
            r2 = runner.invoke(cli, ["inspect", "--json", str(tmp_path / "state")])
            assert r2.exit_code == 0, r2.output
            line = holder.stdout.readline()  # one inspection per commit of the writer
            assert line, "the writer died"
            done = '"done"' in line
        before = _snapshot_files(tmp_path / "changelog")
        r = runner.invoke(cli, ["inspect", str(tmp_path / "changelog")])  # the table form too
        assert r.exit_code == 0 and "changelog partitions" in r.output
        assert _snapshot_files(tmp_path / "changelog") == before, "inspect wrote to the changelog"
        assert finish(holder) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert reports >= 3
    with TaskStorage(Config.from_dict(v)) as s:
        assert s.checkpoint.input_position == commits
        assert dump(s) == model(commits)
        assert s.changelog("kv").end_offset() == s.checkpoint.offsets["kv"]
