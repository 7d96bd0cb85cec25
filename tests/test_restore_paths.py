"""The fast restore paths: a long replay into rocksdb (through a vector memtable, see
engines/rocksdb.py) from the file and the Kafka changelog, failures and a SIGKILL in
the middle of it, and the options a reopened rocksdb database runs with.

``RocksDBEngine.write_batch_records`` is lowered so that a few hundred records take the
long-replay path; the real engine, changelog files and broker are used throughout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from localstate import Config, TaskStorage, faults
from localstate.engine import StoreContext
from localstate.engines.rocksdb import RocksDBEngine, RocksDBOptions
from localstate.faults import InjectedFault

BATCH = 64
"""Write batch of a restore in these tests: replays longer than this take the vector memtable."""


@pytest.fixture(autouse=True)
def _small_restore_batches(monkeypatch):
    monkeypatch.setattr(RocksDBEngine, "write_batch_records", BATCH)


def _values(tmp_path: Path, changelog: str = "file", bootstrap: str = "") -> dict[str, str]:
    job = f"rp-{uuid.uuid4().hex[:8]}"
    values = {
        "job.name": job,
        "job.state.dir": str(tmp_path / "state"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
    }
    if changelog == "kafka":
        values["stores.kv.changelog"] = f"kafka.{job}-kv"
        values["systems.kafka.bootstrap.servers"] = bootstrap
        values["systems.kafka.checkpoint.topic"] = f"{job}-checkpoints"
    else:
        values["stores.kv.changelog"] = f"file.{job}-kv"
        values["systems.file.path"] = str(tmp_path / "changelog")
    return values


def _elsewhere(values: dict[str, str], tmp_path: Path, name: str) -> Config:
    """The same task on a machine with no local state."""
    return Config.from_dict({**values, "job.state.dir": str(tmp_path / name)})


def _write_history(values: dict[str, str], commits: int = 4, per_commit: int = 300, keys: int = 250) -> dict[str, int]:
    """Commits of random puts and deletes over ``keys`` keys (overwrites and tombstones in
    every write batch of the replay), then an uncommitted tail; returns the committed state."""
    rng = random.Random(11)
    model: dict[str, int] = {}
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        for commit in range(1, commits + 1):
            for i in range(per_commit):
                k = f"k{rng.randrange(keys)}"
                if rng.random() < 0.25:
                    kv.delete(k)
                    model.pop(k, None)
                else:
                    kv.put(k, commit * 10_000 + i)
                    model[k] = commit * 10_000 + i
            s.commit(input_position=commit)
        for i in range(200):  # never committed: must not be restored
            kv.put(f"k{i}", -1)
            kv.delete(f"k{i + 20}")
        kv.flush()
    return model


def _dump(storage: TaskStorage) -> dict:
    with storage.store("kv").all() as it:
        return dict(it)


def _newest_options_file(store_dir: Path) -> str:
    return max((store_dir / "db").glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1])).read_text()


def _store_dir(config: Config) -> Path:
    return Path(config.state_dir) / config.job_name / "kv" / "0"


@pytest.mark.parametrize("changelog", ["file", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_long_restore_into_rocksdb_is_exact_and_ends_on_the_normal_memtable(tmp_path, request, monkeypatch, changelog):
    bootstrap = request.getfixturevalue("kafka_broker") if changelog == "kafka" else ""
    values = _values(tmp_path, changelog, bootstrap)
    model = _write_history(values)
    config = _elsewhere(values, tmp_path, "machine-b")
    vector_opens = []
    real = RocksDBEngine._restore_native
    monkeypatch.setattr(RocksDBEngine, "_restore_native", lambda self: vector_opens.append(1) or real(self))
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records > BATCH and vector_opens == [1]
        assert _dump(s) == model
        # the live database is back on the skip list: reads and writes as before
        assert "memtable_factory=SkipListFactory" in _newest_options_file(_store_dir(config))
        s.store("kv").put("after", 1)
        s.commit(input_position=99)
    with TaskStorage(config) as s:  # reopened from its own snapshot: replays nothing
        assert s.last_restore["kv"].records == 0
        assert _dump(s) == {**model, "after": 1}


def test_failure_in_the_middle_of_a_long_restore_changes_nothing(tmp_path):
    values = _values(tmp_path)
    model = _write_history(values)
    config = _elsewhere(values, tmp_path, "machine-b")
    faults.configure("restore.mid=raise")
    try:
        with pytest.raises(InjectedFault):
            TaskStorage(config)
    finally:
        faults.configure(None)
    with TaskStorage(config) as s:
        assert _dump(s) == model


@pytest.mark.parametrize("many_flushes", [False, True], ids=["few-flushes", "many-flushes"])
@pytest.mark.parametrize("point", ["restore.mid", "snapshot.mid"])
def test_sigkill_in_the_middle_of_a_long_restore_then_reopen_is_exact(tmp_path, point, many_flushes):
    """Killed while replaying (the fault point follows the first batch), or after the replay
    while the restored state is being snapshotted (the vector-memtable database already
    flushed and reopened). ``many_flushes``: 64 KiB restore memtables and ~27k change
    records, so dozens of flushed memtables — L0 files compacted only once 16 wait — are on
    disk at the snapshot's kill. The reopen (normal options) is exact and takes more writes."""
    values = _values(tmp_path)
    history = {"commits": 8, "per_commit": 4_000, "keys": 50_000} if many_flushes else {}
    model = _write_history(values, **history)
    memtable_bytes = 64 << 10 if many_flushes else None
    config_values = {**values, "job.state.dir": str(tmp_path / "machine-b")}
    child = textwrap.dedent(f"""
        import json, sys
        from localstate import Config, TaskStorage
        from localstate.engines import rocksdb
        rocksdb.RocksDBEngine.write_batch_records = {BATCH}
        if {memtable_bytes!r} is not None:
            rocksdb._RESTORE_WRITE_BUFFER_BYTES = {memtable_bytes!r}
        TaskStorage(Config.from_dict(json.loads(sys.argv[1])))
        sys.exit(5)  # the kill must come first
    """)
    env = {**os.environ, "LOCALSTATE_FAULTS": f"{point}=kill"}
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(config_values)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    with TaskStorage(Config.from_dict(config_values)) as s:
        assert _dump(s) == model
        s.store("kv").put("after", 1)
        s.commit(input_position=99)
    with TaskStorage(Config.from_dict(config_values)) as s:
        assert _dump(s) == {**model, "after": 1}


def test_a_reopened_rocksdb_database_runs_with_the_configured_options(tmp_path):
    options = RocksDBOptions(block_cache_size_bytes=3 << 20, write_buffer_size_bytes=1 << 20)
    for _ in range(2):  # created, then reopened
        engine = RocksDBEngine(StoreContext.local(tmp_path / "db", "kv"), options)
        try:
            engine.put(b"k", b"v")
            db = engine._require_open()
            assert db.property_int_value("rocksdb.block-cache-capacity") == 3 << 20
        finally:
            engine.close()


def test_a_restore_of_many_flushes_compacts_little_and_reopens_with_the_normal_settings(tmp_path, monkeypatch):
    """A replay that flushes ~100 memtables (64 KiB each here) with overwrites and tombstones:
    its compactions wait for 16 L0 files instead of 4, yet the restored database is exact,
    is left with fewer L0 files than the normal options stop writes at, reopens with the normal
    compaction settings, and takes more writes."""
    from localstate.engines import rocksdb as rocksdb_module

    monkeypatch.setattr(rocksdb_module, "_RESTORE_WRITE_BUFFER_BYTES", 64 << 10)
    rng = random.Random(5)
    keys = [rng.randbytes(16) for _ in range(20_000)]
    records: list[tuple[bytes, bytes | None]] = []
    model: dict[bytes, bytes] = {}
    for i in range(60_000):
        k = keys[rng.randrange(len(keys))]
        v = None if i % 7 == 0 else rng.randbytes(100)
        records.append((k, v))
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v
    context = StoreContext.local(tmp_path / "db", "kv", logged=True)
    engine = RocksDBEngine(context)
    try:
        engine.restore(iter(records), into_empty=True)
        engine.persist(len(records))
        db = engine._require_open()
        assert int(db.property_value("rocksdb.num-files-at-level0")) < 36  # the normal stop-writes trigger
        with engine.all() as it:
            assert dict(it) == model
    finally:
        engine.close()
    options = _newest_options_file(tmp_path / "db")
    assert "level0_file_num_compaction_trigger=4" in options and "disable_auto_compactions=false" in options
    assert "memtable_factory=SkipListFactory" in options
    engine = RocksDBEngine(context)
    try:
        assert engine.prepare_restore(len(records), 0) == len(records)  # its own snapshot, nothing to replay
        with engine.all() as it:
            assert dict(it) == model
        engine.put_all({b"after-" + k: b"x" for k in keys[:1000]})
        assert engine.get(b"after-" + keys[0]) == b"x" and len(engine) == len(model) + 1000
    finally:
        engine.close()


@pytest.mark.parametrize("leftover", ["a key in the memtable", "a key in a table file", "only a tombstone"])
def test_a_full_restore_keeps_a_never_written_live_database_and_wipes_any_other(tmp_path, leftover):
    """No usable snapshot: a live database that never held a write is restored into as it is
    (a first open pays no close, delete and reopen); one holding anything no snapshot covers
    (a crash's leftovers: a key, in memory or on disk, or even a tombstone alone) is rebuilt
    empty before the replay."""
    context = StoreContext.local(tmp_path / "db", "kv", logged=True)
    engine = RocksDBEngine(context)
    try:
        db = engine._require_open()
        assert engine.prepare_restore(5, 0) == 0 and engine._require_open() is db
        engine.restore(iter([(b"a", b"1"), (b"b", b"2"), (b"a", None)]), into_empty=True)
        with engine.all() as it:
            assert dict(it) == {b"b": b"2"}
        engine.wipe()
        db = engine._require_open()
        if leftover == "only a tombstone":
            engine.delete_all([b"gone"])
        else:
            engine.put_all({b"left": b"over"})  # past any commit, and no snapshot covers it
        if leftover != "a key in the memtable":
            engine._require_open().flush(True)
        assert engine.prepare_restore(5, 0) == 0
        assert engine._require_open() is not db and len(engine) == 0  # rebuilt
        assert engine._require_open().property_int_value("rocksdb.total-sst-files-size") == 0
    finally:
        engine.close()


@pytest.mark.kafka
def test_a_keyless_record_in_a_kafka_changelog_is_named_not_restored(tmp_path, kafka_broker):
    """Something other than localstate wrote a record without a key into the changelog:
    the restore (committed range) and the tail check (past the commit) both refuse it with
    an error naming the topic and the offset, and change nothing. Apache Kafka refuses a
    keyless record on a compacted topic, so the damage can only be written on tansu."""
    import dataclasses
    import os

    if os.environ.get("LOCALSTATE_KAFKA_BROKER") == "apache":
        pytest.skip("Apache Kafka refuses a keyless record on a compacted topic: this damage cannot be written")

    from confluent_kafka import Producer
    from localstate.changelog.kafka import KafkaChangelogSystem
    from localstate.errors import CorruptionError

    values = _values(tmp_path, "kafka", kafka_broker)
    _write_history(values, commits=2, per_commit=100)
    topic = values["stores.kv.changelog"].split(".", 1)[1]
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(topic, b"1", None, 0)
    assert producer.flush(10) == 0
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker,
                                            "checkpoint.topic": values["systems.kafka.checkpoint.topic"]},
                                  values["job.name"])
    try:
        part = system.open_partition(topic, 0, 1, readonly=True)
        end = part.end_offset()
        part.close()
        # the uncommitted tail holds it: the tail check at open refuses it
        with pytest.raises(CorruptionError, match=rf"{topic}.*record at offset {end - 1} has no key"):
            TaskStorage(Config.from_dict(values))
        # a checkpoint that covers it (as if committed): the restore refuses it
        checkpoints = system.checkpoints()
        committed = checkpoints.read(values["job.name"], 0)
        checkpoints.write(values["job.name"], 0, dataclasses.replace(
            committed, version=committed.version + 1, offsets={"kv": end}))
    finally:
        system.close()
    with pytest.raises(CorruptionError, match=rf"record at offset {end - 1} has no key"):
        TaskStorage(_elsewhere(values, tmp_path, "machine-b"))
    reader = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker}, "reader")
    try:
        part = reader.open_partition(topic, 0, 1, readonly=True)
        assert part.end_offset() == end  # nothing was appended to the changelog
        part.close()
    finally:
        reader.close()


@pytest.mark.kafka
def test_an_empty_key_is_restored_from_kafka(tmp_path, kafka_broker):
    """An empty key is falsy like a missing one: the keyless-record check must let it through."""
    values = _values(tmp_path, "kafka", kafka_broker)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put_all([("", 0), ("a", 1)])
        s.commit(input_position=1)
    with TaskStorage(_elsewhere(values, tmp_path, "machine-b")) as s:
        assert _dump(s) == {"": 0, "a": 1}
