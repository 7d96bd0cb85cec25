"""Standby followers (:func:`localstate.standby.follow`) on each changelog system.

Two state dirs stand for two executors sharing one changelog: the task runs and
commits in ``active``; the follower keeps a copy in ``standby``. Then the task moves
(opens in ``standby``): its first open must replay only what was committed after the
last follow, and its state must be the exact committed state, also when the standby
copy is behind or damaged, and while the task commits during a follow. Real RocksDB
and LevelDB files, the file changelog, the session's Kafka broker and moto S3 server.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.copies import copy_record_path, read_copy_record
from localstate.errors import ConfigError, CorruptionError
from localstate.layout import store_dir, task_lock
from localstate.standby import BUSY, CURRENT, FOLLOWED, NOTHING_COMMITTED, follow
from localstate.testing.s3 import QUICK_RETRIES, objectstore_options

STORE = "counts"


def _values(tmp_path: Path, where: str, engine: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    name = f"standby{random.randrange(1 << 30)}"
    values: dict[str, Any] = {
        "job.name": name,
        "job.partitions": 2,
        "systems.file.path": str(tmp_path / "changelog"),
        f"stores.{STORE}.factory": engine,
        f"stores.{STORE}.key.serde": "string",
        f"stores.{STORE}.msg.serde": "long",
        f"stores.{STORE}.object.cache.size": 0,
    }
    values.update(changelog_values(where, STORE, f"{name}-counts", request))
    return values


def changelog_values(where: str, store: str, stream: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The config keys that put ``store``'s changelog (stream ``stream``) and the job's
    checkpoints on ``where``: the file log, the test Kafka broker, or a fresh moto bucket."""
    if where == "kafka":
        return {"job.changelog.system": "kafka",
                "systems.kafka.bootstrap.servers": request.getfixturevalue("kafka_broker"),
                "systems.kafka.timeout.ms": 5000, f"stores.{store}.changelog": f"kafka.{stream}"}
    if where == "objectstore":
        server = request.getfixturevalue("s3_server")
        return {**objectstore_options(server.endpoint, server.create_bucket(), **QUICK_RETRIES),
                "job.changelog.system": "s3", f"stores.{store}.changelog": f"s3.{stream}"}
    return {f"stores.{store}.changelog": f"file.{stream}"}


def _on(values: dict[str, Any], state: Path) -> Config:
    return Config.from_dict({**values, "job.state.dir": str(state)})


class Job:
    """Task 0 run in the ``active`` state dir, the committed state kept as an oracle."""

    def __init__(self, values: dict[str, Any], root: Path) -> None:
        self.active = _on(values, root / "active")
        self.standby = _on(values, root / "standby")
        self.state: dict[str, int] = {}
        self.history: dict[int, dict[str, int]] = {}
        """Committed version → the state it committed."""
        self.rng = random.Random(7)

    def run(self, writes: int, keys: int = 300) -> int:
        """One run: ``writes`` increments and a few deletes, committed. Returns the
        change records it appended."""
        with TaskStorage(self.active, 0) as s:
            store = s.store(STORE)
            before = s.committed_offset(STORE) or 0
            for _ in range(writes):
                k = f"k{self.rng.randrange(keys):04d}"
                self.state[k] = self.state.get(k, 0) + 1
                store[k] = self.state[k]
            for k in self.rng.sample(sorted(self.state), min(3, len(self.state))):
                del self.state[k]
                del store[k]
            self.history[s.commit().version] = dict(self.state)
            return (s.committed_offset(STORE) or 0) - before

    def open_standby(self) -> tuple[dict[str, int], int]:
        """The task opened where the standby is: its state and the records its restore replayed."""
        with TaskStorage(self.standby, 0) as s, s.store(STORE).all() as items:
            return dict(items), s.last_restore[STORE].records


CASES = [("file", "rocksdb"), ("file", "leveldb"), ("kafka", "rocksdb"), ("objectstore", "rocksdb")]


@pytest.mark.parametrize(("where", "engine"), CASES)
def test_a_moved_task_replays_only_what_was_committed_since_the_last_follow(
        tmp_path: Path, where: str, engine: str, request: pytest.FixtureRequest) -> None:
    job = Job(_values(tmp_path, where, engine, request), tmp_path)
    total = sum(job.run(400) for _ in range(3))
    first = follow(job.standby, 0, executor="b")
    last = max(job.history)
    assert (first.status, first.version) == (FOLLOWED, last) and 0 < first.records <= total  # kafka: offsets of
    # transaction markers hold no record
    again = follow(job.standby, 0, executor="b")
    assert (again.status, again.version, again.records) == (CURRENT, last, 0)
    assert read_copy_record(copy_record_path(job.standby, 0)) | {"written_at": 0} == {
        "version": last, "executor": "b", "role": "standby", "written_at": 0}
    if where == "file":  # `localstate inspect` names the standby copy as such
        from localstate.inspect import inspect_path

        roles = {(Path(r["root"]).name, r["partition"]): (r["copy_role"], r["left_by"])
                 for r in inspect_path(tmp_path)["stores"]}
        assert roles == {("active", 0): (None, None), ("standby", 0): ("standby", "b")}  # no runner: no record
    delta = job.run(150)
    state, replayed = job.open_standby()
    assert state == job.state
    assert 0 < replayed <= delta, f"the moved task replayed {replayed} records, the last run wrote {delta}"


def test_a_standby_that_fell_behind_replays_the_runs_it_missed_and_is_exact(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    job = Job(_values(tmp_path, "file", "rocksdb", request), tmp_path)
    job.run(300)
    follow(job.standby, 0)
    missed = sum(job.run(200) for _ in range(3))  # three follows skipped
    state, replayed = job.open_standby()
    assert state == job.state and replayed == missed


@pytest.mark.parametrize("target", ["sst", "manifest", "tag"])
def test_a_damaged_standby_copy_gives_the_exact_committed_state(
        tmp_path: Path, request: pytest.FixtureRequest, target: str) -> None:
    job = Job(_values(tmp_path, "file", "rocksdb", request), tmp_path)
    for _ in range(3):
        job.run(300)
    follow(job.standby, 0)
    job.run(100)
    copy = store_dir(job.standby, STORE, 0)
    victims = {
        "sst": sorted(copy.glob("**/*.sst")),
        "manifest": sorted(copy.glob("**/MANIFEST-*")),
        "tag": [copy / "changelog.id"],
    }[target]
    assert victims
    seen: set[int] = set()
    for v in victims:
        if v.stat().st_ino in seen:  # a hard link of a file already damaged (snapshots share SSTs)
            continue
        seen.add(v.stat().st_ino)
        data = bytearray(v.read_bytes())
        data[min(len(data) - 1, 60)] ^= 0x55
        v.write_bytes(bytes(data))
    if target == "sst":
        # a table file of the kept live database damaged in place is found when it is read
        # (RocksDB checks block checksums on reads, not at open): a clear error naming the
        # copy and the fix, and after the fix the exact state
        with pytest.raises(CorruptionError, match=r"restore --wipe"):
            job.open_standby()
        shutil.rmtree(copy)
    state, _ = job.open_standby()  # the copy is set aside (or was wiped) and rebuilt from the changelog
    assert state == job.state


def test_a_follow_skips_a_task_running_here_and_a_task_without_a_commit(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    job = Job(_values(tmp_path, "file", "rocksdb", request), tmp_path)
    assert follow(job.standby, 0).status == NOTHING_COMMITTED
    assert not store_dir(job.standby, STORE, 0).exists()
    job.run(50)
    lock = task_lock(job.standby, 0)
    try:
        assert follow(job.standby, 0).status == BUSY
    finally:
        lock.release()
    assert not store_dir(job.standby, STORE, 0).exists()
    # a first follow fetches the snapshot shipped after the commit: nothing left to replay
    first = follow(job.standby, 0)
    assert first.status == FOLLOWED and first.records == 0 and first.stores[STORE].fetched is not None
    assert follow(job.standby, 0).status == CURRENT


def test_a_follow_writes_nothing_to_the_changelog_or_the_checkpoints(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    job = Job(_values(tmp_path, "file", "rocksdb", request), tmp_path)
    job.run(200)
    shared = tmp_path / "changelog"

    def files() -> dict[str, tuple[bytes, int]]:
        return {str(p.relative_to(shared)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(shared.rglob("*")) if p.is_file()}

    before = files()
    follow(job.standby, 0)
    follow(job.standby, 1)  # a task that never ran: nothing committed
    assert files() == before


def _copy_contents(config: Config, committed: int, scratch: Path) -> dict[str, int]:
    """What this state dir's copy of task 0 holds, read as the task's open would start
    from it (the engine over a copy of the directory: the changelog's writer is busy
    elsewhere). The engine must keep it as the prefix ``[0, committed)``."""
    from localstate.changelogger import NullChangeLogger
    from localstate.engine import StoreContext
    from localstate.metrics import StoreMetrics
    from localstate.registry import resolve_factory
    from localstate.serdes import get_serde

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(store_dir(config, STORE, 0), scratch)
    spec = config.stores[STORE]
    metrics = StoreMetrics()
    context = StoreContext(job=config.job_name, store=STORE, partition=0, partitions=config.partitions,
                           directory=scratch, change_logger=NullChangeLogger(STORE, metrics), metrics=metrics,
                           logged=True)
    engine = resolve_factory(spec.factory).create(spec, context)
    try:
        assert engine.prepare_restore(committed, 0) == committed
        keys, values = get_serde("string"), get_serde("long")
        with engine.all() as items:
            return {keys.decode(k): values.decode(v) for k, v in items}
    finally:
        engine.close()


def test_a_follow_while_the_task_commits_holds_a_committed_state_never_a_mixed_one(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    job = Job(_values(tmp_path, "file", "rocksdb", request), tmp_path)
    job.run(60, keys=80)
    writer = threading.Thread(target=lambda: [job.run(60, keys=80) for _ in range(25)])
    writer.start()
    held: list[tuple[int, dict[str, int]]] = []
    try:
        while writer.is_alive():
            result = follow(job.standby, 0)
            assert result.version is not None
            contents = _copy_contents(job.standby, result.stores[STORE].committed, tmp_path / "view")
            held.append((result.version, contents))
    finally:
        writer.join()
    assert len({v for v, _ in held}) > 1, "the follows all saw one commit: the test did not interleave"
    for version, contents in held:
        assert contents == job.history[version], f"the copy followed to version {version} is not its state"


_FOLLOW_IN_A_PROCESS = """
import json, sys
from localstate import Config
from localstate.standby import follow
follow(Config.from_dict(json.loads(sys.argv[1])), 0, executor="b")
"""


@pytest.mark.parametrize(("where", "engine"), CASES)
@pytest.mark.parametrize("fault", ["standby.mid", "standby.before_snapshot"])
def test_a_follower_killed_mid_follow_leaves_a_copy_the_open_makes_exact(
        tmp_path: Path, request: pytest.FixtureRequest, where: str, engine: str, fault: str) -> None:
    values = _values(tmp_path, where, engine, request)
    job = Job(values, tmp_path)
    job.run(300)
    assert follow(job.standby, 0).status == FOLLOWED
    for _ in range(3):
        job.run(200)
    # SIGKILL in the middle of applying the runs it missed, or after the copy was made
    # durable but before its local snapshot at the commit
    proc = subprocess.run([sys.executable, "-c", _FOLLOW_IN_A_PROCESS,
                           json.dumps({**values, "job.state.dir": str(tmp_path / "standby")})],
                          env={**os.environ, "LOCALSTATE_FAULTS": f"{fault}=kill"}, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode(errors="replace")[-2000:]
    state, _ = job.open_standby()
    assert state == job.state
    # and a follow over what the killed one left brings it to the next commit
    job.run(100)
    assert follow(job.standby, 0).status == FOLLOWED
    state, replayed = job.open_standby()
    assert state == job.state and replayed == 0


def test_job_standby_replicas_is_validated() -> None:
    base = {"job.name": "x"}
    assert Config.from_dict(base).standby_replicas == 0
    assert Config.from_dict({**base, "job.standby.replicas": "1"}).standby_replicas == 1
    for bad in (1.0, 1.5, -1, 2, "two", True):
        with pytest.raises(ConfigError, match="job.standby.replicas"):
            Config.from_dict({**base, "job.standby.replicas": bad})
