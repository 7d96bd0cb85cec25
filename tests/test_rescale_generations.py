"""Rescale on the Kafka and objectstore changelogs — the rescaled job written beside the old
one as its next generation — and the stale local copies a reset or a cut tail must never
let back in (file, Kafka, objectstore). Real tansu broker, moto S3, RocksDB, SIGKILL."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from localstate import (
    ChangelogError,
    Config,
    CorruptionError,
    InvalidValueError,
    LocalStateError,
    StoreLockedError,
    TaskStorage,
)
from localstate.partitioning import task_for
from localstate.rescale import rescale
from localstate.storage import Recovery
from localstate.testing.rescale_jobs import (
    USERS,
    expected,
    job_values,
    rescale_in_child,
    run_tasks,
    seeded_values,
    state_of,
)

# -- kafka and objectstore: the rescaled job is written as the next generation -------------------------
FAST_KAFKA = {"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 100}
FAST_S3 = {"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 20}


@pytest.fixture(params=["kafka", "objectstore"])
def remote(request) -> Any:
    """``remote(root, job)``: config values of a job whose state is in a kafka topic or an
    S3 bucket (moto), at 4 partitions. Each call: its own job, streams and checkpoint topic."""
    make = _remote_maker(request, request.param)
    make.kind = request.param  # type: ignore[attr-defined]
    return make


@pytest.mark.parametrize("to", [6, 3])
def test_kafka_and_objectstore_rescale_equals_a_job_run_at_the_new_count(tmp_path, remote, to):
    """The 4 -> 6 and 4 -> 3 proof of the file changelog on kafka and objectstore: rescaled
    (with an uncommitted tail in every old task), run on, and compared with a job run at
    the new count from the start; the old count is refused afterwards."""
    config = seeded_values(remote(tmp_path / "a"))
    for p in range(4):  # a crashed attempt's uncommitted tail: never part of the rescaled state
        with TaskStorage(config, p) as storage:
            storage.store("counts")["user-0"] = {"n": -1}
            storage.store("counts")["ghost"] = {"n": -1}
            storage.store("counts").flush()
            storage.changelog("counts").flush()
    direct = seeded_values(remote(tmp_path / "b", partitions=to))
    result = rescale(config, to)
    assert (result.from_partitions, result.to_partitions, result.version, result.records) == (4, to, 1, {"counts": 150})
    new = result.config
    assert state_of(new) == expected(to)
    more = {u: {"n": 7} for u in USERS[100:180]}
    run_tasks(new, more, version=2)
    run_tasks(direct, more, version=2)
    assert state_of(new) == state_of(direct)
    with TaskStorage(new, 0) as storage:
        assert storage.checkpoint.version == 2 and storage.changelog("counts").stream.endswith("-counts.gen1")
    with pytest.raises(ChangelogError, match=f"has {to} partition"):
        TaskStorage(config, 0)
    again = rescale(config, to)  # a re-run finds it done
    assert again.already_done and state_of(new) == state_of(direct)


def test_kafka_and_objectstore_rescale_back_and_a_stale_local_copy(tmp_path, remote):
    """Two rescales in a row (generation 2), with a local RocksDB copy of an old task put
    back after each (another machine's disk): never loaded for the new task."""
    config = seeded_values(remote(tmp_path, factory="rocksdb"))
    local = tmp_path / "state" / config.job_name / "counts" / "0"
    shutil.copytree(local, tmp_path / "elsewhere")
    six = rescale(config, 6).config
    shutil.copytree(tmp_path / "elsewhere", local)
    assert state_of(six) == expected(6)
    shutil.rmtree(tmp_path / "elsewhere")
    shutil.copytree(local, tmp_path / "elsewhere")
    two = rescale(six, 2).config
    shutil.copytree(tmp_path / "elsewhere", local, dirs_exist_ok=True)
    assert state_of(two) == expected(2)
    with TaskStorage(two, 1) as storage:
        assert storage.changelog("counts").stream.endswith("-counts.gen2")


@pytest.mark.parametrize("fault", ["rescale.staging=kill@3", "rescale.before_manifest=kill"])
def test_kafka_and_objectstore_kill_mid_rescale_leaves_the_old_job_intact(tmp_path, remote, fault):
    values = remote(tmp_path)
    config = seeded_values(values)
    before = state_of(config)
    assert rescale_in_child(tmp_path, 6, fault, values) == -9
    assert state_of(config) == before  # the old job runs on, untouched
    run_tasks(config, {"user-3": {"n": 33}}, version=2)
    result = rescale(config, 6)  # the re-run skips the half-written generation
    want = expected(6)
    want[task_for("user-3", 6)]["user-3"] = {"n": 33}
    assert state_of(result.config) == want
    with TaskStorage(result.config, 0) as storage:
        assert storage.checkpoint.version == 2 and storage.changelog("counts").stream.endswith("-counts.gen2")


def test_kafka_and_objectstore_kill_after_the_switch_is_finished_by_a_re_run(tmp_path, remote):
    values = remote(tmp_path)
    config = seeded_values(values)
    assert rescale_in_child(tmp_path, 3, "rescale.after_manifest=kill", values) == -9
    result = rescale(config, 3)
    assert result.already_done
    assert state_of(result.config) == expected(3)
    with pytest.raises(ChangelogError, match="rescaled to 3 partitions .* rescale from the count the state is at"):
        rescale(config, 5)


def test_kafka_and_objectstore_refusals_change_nothing(tmp_path, remote):
    config = seeded_values(remote(tmp_path))
    mine = next(u for u in USERS[:50] if task_for(u, 4) == 1)
    with TaskStorage(config, 1) as storage:  # task 1 one commit ahead
        storage.store("counts")[mine] = {"n": 5}
        storage.commit("same", version=2)
    with pytest.raises(LocalStateError, match="not at one commit"):
        rescale(config, 6)
    with pytest.raises(InvalidValueError, match="an int >= 1"):
        rescale(config, 2.0)
    with TaskStorage(config, 3):
        with pytest.raises(StoreLockedError, match=f"while it runs: task {config.job_name}/partition 3"):
            rescale(config, 6)
    with TaskStorage(config, 0) as storage:  # the old job is where it was
        assert storage.changelog("counts").stream == f"{config.job_name}-counts"
    run_tasks(config, {}, version=3)
    assert state_of(rescale(config, 6).config) == {
        q: {**want, **({mine: {"n": 5}} if task_for(mine, 6) == q else {})} for q, want in expected(6).items()}


# -- `localstate restore --reset STORE` with a local copy of the old state left elsewhere --------------
def test_reset_never_resurrects_a_local_copy_left_on_another_machine(tmp_path):
    """Machine B holds a RocksDB copy of the store at its last commit; the operator resets
    the store on machine A. When the task moves back to B, the copy must be discarded
    (before the fix the file and objectstore logs accepted a snapshot at the reset log's
    end, and replaying the empty log over it brought the whole state back)."""
    _reset_on_a_then_open_on_b(tmp_path, job_values(tmp_path, "rocksdb", 1))


def test_kafka_and_objectstore_reset_never_resurrects_a_local_copy(tmp_path, remote):
    _reset_on_a_then_open_on_b(tmp_path, remote(tmp_path, 1, "rocksdb"))


def _reset_on_a_then_open_on_b(tmp_path: Path, values: dict[str, Any]) -> None:
    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-a")})
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-b")})
    with TaskStorage(machine_b, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS})
        storage.commit("p1")
    with TaskStorage(machine_b, 0) as storage:  # a second commit with nothing new: snapshot at the end
        storage.commit("p2")
    with TaskStorage(machine_a, 0, recovery=Recovery(reset={"counts"})) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {}
        storage.commit("p3")
    with TaskStorage(machine_b, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {}, "the reset state came back from machine B's local copy"
        storage.store("counts")["new"] = {"n": 2}
        storage.commit("p4")
    with TaskStorage(machine_a, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {"new": {"n": 2}}


def test_a_snapshot_of_a_discarded_tail_left_on_another_machine_is_never_loaded(tmp_path):
    """Machine B persists a RocksDB snapshot of its uncommitted writes and dies before its
    checkpoint; the task restores on machine A, which cuts that tail, writes on past its
    offsets and commits; the task moves back to B. B's snapshot must be rebuilt, not
    loaded (before the fix B showed the uncommitted values and missed A's commits: the
    file and objectstore logs write the cut offsets again)."""
    _tail_on_b_then_commits_on_a(tmp_path, job_values(tmp_path, "rocksdb", 1))


def test_kafka_and_objectstore_snapshot_of_a_discarded_tail_is_never_loaded(tmp_path, remote):
    _tail_on_b_then_commits_on_a(tmp_path, remote(tmp_path, 1, "rocksdb"))


def _tail_on_b_then_commits_on_a(tmp_path: Path, values: dict[str, Any]) -> None:
    from localstate.faults import InjectedFault, configure

    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-a")})
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-b")})
    with TaskStorage(machine_b, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS[:10]})
        storage.commit("p1")
    storage = TaskStorage(machine_b, 0)
    storage.store("counts").put_all({u: {"n": -1} for u in USERS[:10]})
    configure("commit.after_engine_checkpoint=raise")  # B dies between its snapshot and its checkpoint
    try:
        with pytest.raises(InjectedFault):
            storage.commit("p2")
    finally:
        configure("")
        storage.close()
    with TaskStorage(machine_a, 0) as storage:
        assert storage.store("counts")[USERS[0]] == {"n": 1}
        storage.store("counts").put_all({u: {"n": 2} for u in USERS[100:130]})
        storage.commit("p3")
    with TaskStorage(machine_b, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {**{u: {"n": 1} for u in USERS[:10]}, **{u: {"n": 2} for u in USERS[100:130]}}


def test_a_corrupt_generation_record_is_an_error_naming_it(tmp_path, remote):
    """The record that says where a rescaled job's state is: damaged, every open refuses
    (naming it) instead of falling back to the old generation's stale state."""
    config = seeded_values(remote(tmp_path))
    new = rescale(config, 2).config
    if remote.kind == "kafka":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": config.systems["kafka"]["bootstrap.servers"]})
        producer.produce(f"{config.job_name}-checkpoints", b"{not json", f"{config.job_name}/generation".encode(), 0)
        producer.flush(10)
        where = f"{config.job_name}/generation in kafka topic"
    else:
        from localstate.storage import open_system

        system = open_system(new, "s3")
        key = f"_generations/{config.job_name}/{1:010d}"
        system.store.put(key, b"{not json")
        system.close()
        where = key
    with pytest.raises(CorruptionError, match=f"generation record .*{where}.* is corrupt"):
        TaskStorage(new, 0)
    with pytest.raises(CorruptionError, match="generation record"):
        rescale(new, 3)


def test_an_objectstore_generation_taken_by_another_rescale_is_skipped(tmp_path, s3_server):
    """Two rescales never write one generation's prefixes: a number another rescale
    reserved (``<n>.writing``, created with If-None-Match) is skipped."""
    from localstate.storage import open_system
    from localstate.testing.s3 import objectstore_options

    values = {**job_values(tmp_path), "job.changelog.system": "s3", "stores.counts.changelog": "s3.clicks-counts",
              **objectstore_options(s3_server.endpoint, s3_server.create_bucket(), "jobs", **FAST_S3)}
    config = seeded_values(values)
    system = open_system(config, "s3")
    try:
        assert system.claim_generation(1) and not system.claim_generation(1)
    finally:
        system.close()
    new = rescale(config, 6).config
    assert state_of(new) == expected(6)
    with TaskStorage(new, 0) as storage:
        assert storage.changelog("counts").stream == "clicks-counts.gen2"


# -- a local copy of an old task on a disk the rescale could not reach ---------------------------------
@pytest.fixture(params=["file", "kafka", "objectstore"])
def any_changelog(request, tmp_path) -> Any:
    """``any_changelog(partitions, factory, **extra)``: config values of a job on each changelog."""
    if request.param == "file":
        return lambda partitions, factory, **extra: job_values(tmp_path, factory, partitions, **extra)
    make = _remote_maker(request, request.param)
    return lambda partitions, factory, **extra: {**make(tmp_path, partitions, factory), **extra}


def _remote_maker(request: Any, kind: str) -> Any:
    """Per call: config values of a fresh job on ``kind`` (its own streams, checkpoints)."""
    if kind == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker")

        def system(job: str) -> dict[str, Any]:
            return {"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": bootstrap,
                    "systems.kafka.checkpoint.topic": f"{job}-checkpoints", "stores.counts.changelog": f"kafka.{job}-counts",
                    **{f"systems.kafka.{k}": v for k, v in FAST_KAFKA.items()}}
    else:
        from localstate.testing.s3 import objectstore_options

        server = request.getfixturevalue("s3_server")
        bucket = server.create_bucket()

        def system(job: str) -> dict[str, Any]:
            return {"job.changelog.system": "s3", **objectstore_options(server.endpoint, bucket, job, **FAST_S3),
                    "stores.counts.changelog": f"s3.{job}-counts"}

    def make(root: Path, partitions: int = 4, factory: str = "memory") -> dict[str, Any]:
        job = f"clicks-{os.urandom(4).hex()}"
        return {**job_values(root, factory, partitions), "job.name": job, **system(job)}

    return make


@pytest.mark.parametrize("interval", [None, 0], ids=["default", "snapshot-every-commit"])
def test_an_old_tasks_copy_on_an_unreachable_disk_is_rebuilt_for_the_new_task(tmp_path, any_changelog, interval):
    """2 tasks, 50 commits each on machine A; A's state dir is unreachable during
    ``rescale(config, 1)``; the new task 0 runs on machine B until its changelog reaches
    the old task 0's offsets, then on A. A's RocksDB copy (live database with its
    clean-close claim; or, with a snapshot at every commit, a snapshot tagged with an
    offset of the old log) belongs to another log and must be rebuilt, never kept or
    replayed on."""
    extra = {} if interval is None else {"stores.counts.rocksdb.snapshot.interval.records": interval}
    _old_copy_on_machine_a(tmp_path, any_changelog(2, "rocksdb", **extra), 0 if interval is None else 5)


def test_an_old_tasks_leveldb_copy_is_rebuilt_too(tmp_path):
    """The same with LevelDB's copy (its database and persisted offset), file changelog:
    the tag is one check for every engine, before it opens."""
    _old_copy_on_machine_a(tmp_path, job_values(tmp_path, "leveldb", 2), 0)


def _old_copy_on_machine_a(tmp_path: Path, values: dict[str, Any], past: int) -> None:
    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-a")})
    keys = {p: [u for u in USERS if task_for(u, 2) == p][:20] for p in range(2)}
    committed: dict[str, Any] = {}
    for i in range(50):  # one record per commit: old task p's log ends at offset 50
        for p in range(2):
            with TaskStorage(machine_a, p) as storage:
                key = keys[p][i % 20]
                storage.store("counts")[key] = {"n": i}
                committed[key] = {"n": i}
                storage.commit("same", version=i)
    with TaskStorage(machine_a, 0) as storage:
        old_end = storage.changelog("counts").end_offset()
    assert old_end >= 50  # (kafka: a transaction marker per commit too)
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-b")})
    one = rescale(machine_b, 1).config  # machine A is unreachable: its copies stay
    on_b = one.with_overrides({"job.state.dir": str(tmp_path / "machine-b")})
    on_a = one.with_overrides({"job.state.dir": str(tmp_path / "machine-a")})
    target = old_end + past
    n = 0
    while True:
        with TaskStorage(on_b, 0) as storage:
            if storage.changelog("counts").end_offset() >= target:
                break
            key = f"new-{n}"
            storage.store("counts")[key] = {"n": n}
            committed[key] = {"n": n}
            n += 1
            storage.commit("same", version=100 + n)
    with TaskStorage(on_a, 0) as storage:
        with storage.store("counts").all() as items:
            got = dict(items)
    assert len(got) == len(committed) == 40 + n
    assert got == committed, f"{sum(got.get(k) != v for k, v in committed.items())} keys wrong on machine A"
