"""The Kafka changelog against a real Kafka-protocol broker (tansu on 127.0.0.1, never a mock).

* a changelog conformance set run over both ``file`` and ``kafka`` partitions;
* every installed KV engine restored from Kafka equals the committed state;
* SIGKILL between the changelog flush and the checkpoint → trim → full restore == last commit;
* zombie fencing; broker killed / paused during a commit; wrong existing topics; config errors.

tansu keeps its data in memory only: a restarted tansu has lost every topic, so
"the broker comes back" is tested by pausing the broker process (SIGSTOP/SIGCONT).
Nothing here depends on tansu's known gaps (no compaction, understated high
watermark, aborted records visible to read_committed consumers).
"""

from __future__ import annotations

import importlib.util
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.changelog.base import ChangelogPartition
from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, ConfigError, CorruptionError, FencedError
from localstate.registry import ENGINES
from localstate.testing import torture as T

pytestmark = pytest.mark.kafka

FAST = {"timeout.ms": 1500, "retries": 1, "retry.backoff.ms": 100}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def recs(lo: int, hi: int, prefix: bytes = b"k") -> list[tuple[bytes, bytes | None]]:
    return [(prefix + b"%d" % i, b"v%d" % i) for i in range(lo, hi)]


def apply(records: Any, into: dict | None = None) -> dict:
    state = {} if into is None else into
    for k, v in records:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


# -- changelog conformance over file and kafka ------------------------------------------------
@pytest.fixture(params=["file", "kafka"])
def open_partition(request, tmp_path) -> Iterator[Callable[..., ChangelogPartition]]:
    """``open_partition(partition=0, partitions=1)`` on one fresh stream of either backend;
    each call is a new system instance (like a restarted task)."""
    stream = unique("conf")
    job = unique("job")
    systems: list[Any] = []
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker")

        def make_system() -> Any:
            return KafkaChangelogSystem("kafka", {"bootstrap.servers": bootstrap, **FAST}, job)
    else:

        def make_system() -> Any:
            return FileChangelogSystem("file", {"path": str(tmp_path / "log")}, job)

    opened: list[ChangelogPartition] = []

    def open_(partition: int = 0, partitions: int = 1) -> ChangelogPartition:
        system = make_system()
        systems.append(system)
        p = system.open_partition(stream, partition, partitions)
        opened.append(p)
        return p

    yield open_
    for p in opened:
        p.close()
    for s in systems:
        s.close()


def test_append_flush_read_ranges(open_partition):
    p = open_partition()
    assert p.end_offset() == 0
    assert list(p.read(0, 10)) == []
    p.append(recs(0, 10))
    p.append(recs(10, 15))
    e1 = p.flush()
    assert e1 == p.end_offset() >= 15
    assert list(p.read(0, e1)) == recs(0, 15)
    assert list(p.read(3, 12)) == recs(3, 12)  # one flush: dense offsets
    assert list(p.read(14, e1)) == recs(14, 15)
    assert list(p.read(7, 7)) == []
    p.append([(b"gone", None), (b"k1", b"again")])
    e2 = p.flush()
    assert e2 > e1
    assert list(p.read(e1, e2)) == [(b"gone", None), (b"k1", b"again")]
    assert list(p.read(0, e2)) == recs(0, 15) + [(b"gone", None), (b"k1", b"again")]


def test_reopen_sees_every_flushed_record(open_partition):
    p = open_partition()
    p.append(recs(0, 2000))
    e1 = p.flush()
    p.append(recs(0, 500, b"x"))
    e2 = p.flush()
    p.close()
    q = open_partition()
    assert q.end_offset() >= e2
    assert list(q.read(0, e2)) == recs(0, 2000) + recs(0, 500, b"x")
    assert list(q.read(e1, q.end_offset())) == recs(0, 500, b"x")
    batches = list(q.read_batches(0, e2))
    assert sum(len(r) for r, _ in batches) == 2500
    assert all(n > 0 for _, n in batches)


def test_partitions_are_independent(open_partition):
    p0 = open_partition(0, 2)
    p1 = open_partition(1, 2)
    p0.append(recs(0, 5))
    p1.append(recs(100, 103))
    e0, e1 = p0.flush(), p1.flush()
    assert list(p0.read(0, e0)) == recs(0, 5)
    assert list(p1.read(0, e1)) == recs(100, 103)


def test_discard_tail_leaves_the_committed_state(open_partition):
    p = open_partition()
    p.append(recs(0, 20))
    p.append([(b"k3", None)])
    committed = p.flush()
    model = apply(p.read(0, committed))
    p.append([(b"k1", b"uncommitted"), (b"new", b"uncommitted"), (b"k3", b"back"), (b"k5", None)])
    p.flush()
    p.close()  # crash before the checkpoint

    q = open_partition()
    asked: list[bytes] = []

    def current(keys):
        asked.extend(keys)
        return [(k, model.get(k)) for k in keys]

    q.discard_tail(committed, current)
    end = q.end_offset()
    # a full read to the end (what compaction keeps) and a read to the commit agree
    assert apply(q.read(0, end)) == model == apply(q.read(0, committed))
    if asked:  # kafka re-writes the tail keys; file truncates
        assert sorted(asked) == sorted([b"k1", b"new", b"k3", b"k5"])
    q.append([(b"after", b"1")])
    e = q.flush()
    assert apply(q.read(0, e)) == {**model, b"after": b"1"}


def test_discard_tail_past_the_end_is_corruption(open_partition):
    p = open_partition()
    p.append(recs(0, 3))
    p.flush()
    with pytest.raises(CorruptionError, match="committed records are missing"):
        p.discard_tail(10_000, lambda keys: [])


def test_discard_tail_at_the_end_is_a_no_op(open_partition):
    p = open_partition()
    p.append(recs(0, 3))
    e = p.flush()
    p.discard_tail(e, lambda keys: pytest.fail("no tail, nothing to trim"))
    assert list(p.read(0, p.end_offset())) == recs(0, 3)


# -- configuration -------------------------------------------------------------------------------
def _cfg(tmp_path: Path, **systems: Any) -> dict[str, Any]:
    values = {
        "job.name": "cfg",
        "job.state.dir": str(tmp_path / "state"),
        "stores.kv.factory": "memory",
        "stores.kv.changelog": "kafka.cfg-kv",
    }
    values.update({f"systems.kafka.{k}": v for k, v in systems.items()})
    return values


@pytest.mark.parametrize(
    ("systems", "match"),
    [
        ({}, r"systems\.kafka\.bootstrap\.servers is required"),
        ({"bootstrap.servers": "h:1", "producer.acks": "1"}, r"systems\.kafka\.producer\.acks"),
        ({"bootstrap.servers": "h:1", "producer.enable.idempotence": "false"}, r"producer\.enable\.idempotence"),
        ({"bootstrap.servers": "h:1", "consumer.enable.partition.eof": "false"}, r"consumer\.enable\.partition\.eof"),
        ({"bootstrap.servers": "h:1", "topic.cleanup.policy": "delete"}, r"topic\.cleanup\.policy"),
        ({"bootstrap.servers": "h:1", "replication.factor": "0"}, r"systems\.kafka\.replication\.factor"),
        ({"bootstrap.servers": "h:1", "timeout.ms": "abc"}, r"systems\.kafka\.timeout\.ms"),
        ({"bootstrap.servers": "h:1", "bootstrap.server": "h:1"}, r"Did you mean 'bootstrap\.servers'"),
    ],
)
def test_bad_config_names_the_key(tmp_path, systems, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(_cfg(tmp_path, **systems))


def test_pass_through_client_settings_are_accepted(tmp_path):
    c = Config.from_dict(
        _cfg(tmp_path, **{"bootstrap.servers": "h:1", "producer.linger.ms": 20, "consumer.fetch.max.bytes": 1 << 20,
                          "topic.min.insync.replicas": 1, "checkpoint.topic": "ck"})
    )
    assert c.systems["kafka"]["producer.linger.ms"] == 20
    assert c.checkpoint_system == "kafka"


# -- wrong existing topics ---------------------------------------------------------------------------
def _create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(10)


def test_existing_topic_with_wrong_partition_count_is_refused(kafka_broker):
    topic = unique("wrongparts")
    _create_topic(kafka_broker, topic, 3, {"cleanup.policy": "compact"})
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker}, unique("job"))
    try:
        with pytest.raises(ChangelogError, match=rf"{topic}.*has 3 partition\(s\) but 2 are needed"):
            system.open_partition(topic, 0, 2)
    finally:
        system.close()


@pytest.mark.parametrize("config", [{}, {"cleanup.policy": "delete"}])
def test_existing_topic_that_is_not_compacted_is_refused(kafka_broker, config):
    topic = unique("notcompact")
    _create_topic(kafka_broker, topic, 1, config)
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker}, unique("job"))
    try:
        with pytest.raises(ChangelogError, match=rf"{topic}.*cleanup\.policy=delete.*must be 'compact'"):
            system.open_partition(topic, 0, 1)
    finally:
        system.close()


def test_created_topic_is_compacted_with_task_count_partitions(kafka_broker):
    from confluent_kafka.admin import AdminClient, ConfigResource

    topic = unique("created")
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker, "delete.retention.ms": 5000}, "j")
    system.open_partition(topic, 2, 3).close()
    system.close()
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 3
    res = ConfigResource("topic", topic)
    configs = admin.describe_configs([res])[res].result(10)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["delete.retention.ms"].value == "5000"


# -- TaskStorage over Kafka ------------------------------------------------------------------------------
def _engine_names() -> list[Any]:
    out = []
    for name in ("memory", "rocksdb", "leveldb"):
        module_exists = importlib.util.find_spec(f"localstate.engines.{name}") is not None
        marks = () if module_exists else (pytest.mark.skip(reason=f"engines/{name}.py does not exist yet"),)
        out.append(pytest.param(name, marks=marks))
    return out


def kafka_values(tmp_path: Path, bootstrap: str, factory: str = "memory", **extra: Any) -> dict[str, Any]:
    job = unique("job")
    values = {
        "job.name": job,
        "job.state.dir": str(tmp_path / "state"),
        "stores.kv.factory": factory,
        "stores.kv.changelog": f"kafka.{job}-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.object.cache.size": 64,
        "stores.kv.write.batch.size": 32,
        "systems.kafka.bootstrap.servers": bootstrap,
    }
    values.update(extra)
    return values


def moved(values: dict[str, Any], tmp_path: Path, name: str) -> Config:
    """The same job on "another machine": an empty state directory."""
    return Config.from_dict({**values, "job.state.dir": str(tmp_path / name)})


def dump(storage: TaskStorage) -> dict:
    with storage.store("kv").all() as it:
        return dict(it)


@pytest.mark.parametrize("factory", _engine_names())
def test_every_engine_restored_from_kafka_equals_the_committed_state(kafka_broker, tmp_path, factory):
    ok, why = ENGINES.installed(factory)
    assert ok, why
    values = kafka_values(tmp_path, kafka_broker, factory)
    rng = random.Random(7)
    model: dict[str, int] = {}
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        for batch in range(1, 4):
            for _ in range(300):
                k = f"k{rng.randrange(200)}"
                if rng.random() < 0.2:
                    kv.delete(k)
                    model.pop(k, None)
                else:
                    kv.put(k, batch * 1000 + rng.randrange(1000))
                    model[k] = kv.get(k)
            s.commit(input_position=batch)
        for i in range(50):  # never committed
            kv.put(f"k{i}", -1)
            kv.delete(f"k{i + 100}")
        kv.flush()
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert s.checkpoint.input_position == 3
        assert s.last_restore["kv"].records > 0
        assert dump(s) == model
    with TaskStorage(Config.from_dict(values)) as s:  # the original machine, local state kept
        assert dump(s) == model


def test_a_zombie_instance_is_fenced(kafka_broker, tmp_path):
    values = kafka_values(tmp_path, kafka_broker)
    a = TaskStorage(Config.from_dict(values))
    a.store("kv").put("x", 1)
    a.commit(input_position=1)
    a.store("kv").put("x", 2)
    b = TaskStorage(moved(values, tmp_path, "machine-b"))  # takes over the task
    assert b.epoch == a.epoch + 1
    with pytest.raises(FencedError, match="fenced by a newer instance"):
        a.commit(input_position=2)
    a.close()
    assert b.store("kv").get("x") == 1
    b.store("kv").put("x", 3)
    b.commit(input_position=2)
    b.close()
    with TaskStorage(moved(values, tmp_path, "machine-c")) as c:
        assert c.store("kv").get("x") == 3 and c.checkpoint.input_position == 2


def changelog_contents(bootstrap: str, stream: str) -> dict[str, Any]:
    """Every record of the changelog partition up to its end, applied in order (what
    compaction would keep), decoded with the test store's serdes."""
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": bootstrap}, unique("reader"))
    try:
        p = system.open_partition(stream, 0, 1)
        state = apply(p.read(0, p.end_offset()))
        p.close()
    finally:
        system.close()
    return {k.decode(): json.loads(v) for k, v in state.items()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", ["commit.after_changelog_flush", "commit.after_engine_checkpoint", "checkpoint.before_rename"]
)
def test_sigkill_between_changelog_flush_and_checkpoint_then_trim(kafka_broker, tmp_path, point):
    """The crash-trial harness's child and reference (localstate.testing.torture), with
    the changelog itself inspected between the kill and the trim."""
    plan = T.kill_plan("memory", (f"{point}=kill@3",), changelog="kafka", batches=5)
    reference = T.reference_run(plan, tmp_path / "ref").states
    values = plan.values(tmp_path / "crash", kafka_broker, "", namespace=unique("ns"))
    stream = values[f"stores.{T.STORE}.changelog"].split(".", 1)[1]
    rc, _, err = T.run_child(plan, values, plan.faults[0])
    assert rc == -9, err
    # before the trim, the log's tail holds the killed attempt's records
    assert changelog_contents(kafka_broker, stream) == reference[3]
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        pos = s.checkpoint.input_position
        # a checkpoint produced but never committed is invisible on Kafka (read_committed);
        # a broker that shows aborted records may expose it: still a consistent commit
        assert pos == 2 or (point == "checkpoint.before_rename" and pos == 3)
        assert dump_store(s, T.STORE) == reference[pos]
    # after the trim, the whole log (what compaction keeps) is the committed state
    assert changelog_contents(kafka_broker, stream) == reference[pos]
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert dump_store(s, T.STORE) == reference[pos]
    rc, _, err = T.run_child(plan, values, None)
    assert rc == 0, err
    with TaskStorage(moved(values, tmp_path, "machine-d")) as s:
        assert s.checkpoint.input_position == 5
        assert dump_store(s, T.STORE) == reference[5]


def test_broker_killed_during_commit_fails_the_commit(fresh_kafka_broker, tmp_path):
    values = kafka_values(
        tmp_path, fresh_kafka_broker.bootstrap, **{f"systems.kafka.{k}": v for k, v in FAST.items()}
    )
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("a", 1)
    s.commit(input_position=1)
    s.store("kv").put("a", 2)
    fresh_kafka_broker.stop(kill=True)
    t0 = time.monotonic()
    with pytest.raises(ChangelogError, match=rf"{fresh_kafka_broker.bootstrap}") as info:
        s.commit(input_position=2)
    assert time.monotonic() - t0 < 30, "retries must be bounded"
    assert values["stores.kv.changelog"].split(".", 1)[1] in str(info.value)
    assert s.checkpoint.input_position == 1
    s.close()
    with pytest.raises(ChangelogError, match=rf"brokers {fresh_kafka_broker.bootstrap}"):
        TaskStorage(moved(values, tmp_path, "machine-b"))


def test_broker_paused_during_commit_then_back_loses_nothing_committed(fresh_kafka_broker, tmp_path):
    """tansu is memory-only, so the broker "comes back" by SIGCONT after SIGSTOP."""
    values = kafka_values(
        tmp_path, fresh_kafka_broker.bootstrap, **{f"systems.kafka.{k}": v for k, v in FAST.items()}
    )
    s = TaskStorage(Config.from_dict(values))
    kv = s.store("kv")
    for i in range(100):
        kv.put(f"k{i}", i)
    s.commit(input_position=1)
    for i in range(50, 150):
        kv.put(f"k{i}", -i)
    fresh_kafka_broker.pause()
    try:
        with pytest.raises(ChangelogError, match="brokers"):
            s.commit(input_position=2)
    finally:
        fresh_kafka_broker.resume()
    s.close()
    committed = {f"k{i}": i for i in range(100)}
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s2:
        assert s2.checkpoint.input_position == 1
        assert dump(s2) == committed
        s2.store("kv").put("k0", 1000)
        s2.commit(input_position=2)
    with TaskStorage(Config.from_dict(values)) as s3:
        assert dump(s3) == {**committed, "k0": 1000}


def test_snapshots_older_than_the_tombstone_retention_are_not_valid(kafka_broker):
    """Compaction may drop tombstones older than delete.retention.ms, so a local snapshot
    from before that horizon must not be used (the engine then restores in full)."""
    system = KafkaChangelogSystem(
        "kafka", {"bootstrap.servers": kafka_broker, "delete.retention.ms": 1500}, unique("job")
    )
    try:
        p = system.open_partition(unique("horizon"), 0, 1)
        assert p.min_valid_snapshot_offset() == 0  # empty log
        p.append(recs(0, 10))
        first_end = p.flush()
        assert p.min_valid_snapshot_offset() == 0  # everything is recent
        time.sleep(1.7)
        assert p.min_valid_snapshot_offset() == 10  # all older than the horizon: only the end is safe
        p.append(recs(10, 20))
        p.flush()
        assert first_end <= p.min_valid_snapshot_offset() <= first_end + 1  # the first new record
    finally:
        system.close()


def test_two_stores_two_partitions_share_one_transaction_per_task(kafka_broker, tmp_path):
    job = unique("job")
    values = {
        "job.name": job,
        "job.state.dir": str(tmp_path / "state"),
        "job.partitions": 2,
        "systems.kafka.bootstrap.servers": kafka_broker,
        "stores.a.factory": "memory",
        "stores.a.changelog": f"kafka.{job}-a",
        "stores.b.factory": "memory",
        "stores.b.changelog": f"kafka.{job}-b",
        "stores.b.key.serde": "string",
        "stores.b.msg.serde": "json",
    }
    expected: dict[int, tuple[dict, dict]] = {}
    for p in (0, 1):
        with TaskStorage(Config.from_dict(values), partition=p) as s:
            a, b = s.store("a"), s.store("b")
            for i in range(700):  # more than write.batch.size: appends before the commit
                a.put(b"%d-%d" % (p, i), b"x" * (i % 7))
                b.put(f"{p}/{i}", {"n": i})
            a.delete(b"%d-3" % p)
            s.commit(input_position=p)
            b.put("uncommitted", 1)
            s.store("b").flush()
            expected[p] = (dump_store(s, "a"), dump_store(s, "b"))
            expected[p][1].pop("uncommitted")
    for p in (0, 1):
        with TaskStorage(moved(values, tmp_path, f"b{p}"), partition=p) as s:
            assert s.checkpoint.input_position == p
            assert (dump_store(s, "a"), dump_store(s, "b")) == expected[p]


def dump_store(storage: TaskStorage, name: str) -> dict:
    with storage.store(name).all() as it:
        return dict(it)


def test_corrupt_latest_checkpoint_is_an_error_not_a_fall_back(kafka_broker):
    """No silent fall-back to the record before: broker compaction may have made that
    older commit unreconstructible (issue 14, case 1)."""
    from confluent_kafka import Producer

    job, topic = unique("job"), unique("ckpt")
    opts = {"bootstrap.servers": kafka_broker, "checkpoint.topic": topic}
    system = KafkaChangelogSystem("kafka", opts, job)
    store = system.checkpoints()
    assert store.read(job, 0) is None
    assert store.previous(job, 0) is None  # --use-previous-checkpoint is not offered on Kafka
    store.write(job, 0, Checkpoint(version=1, input_position="a", offsets={"kv": 5}, epoch=1))
    store.write(job, 1, Checkpoint(version=7, input_position="other", offsets={}, epoch=1))
    store.write(job, 0, Checkpoint(version=2, input_position="b", offsets={"kv": 9}, epoch=1))
    system.close()
    assert KafkaChangelogSystem("kafka", opts, job).checkpoints().read(job, 0, fence=False).version == 2

    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(topic, b"garbage", f"{job}/0".encode(), 0)
    assert producer.flush(10) == 0
    reader = KafkaChangelogSystem("kafka", opts, job)
    try:
        with pytest.raises(CorruptionError, match=rf"{job}/partition 0.*--reset"):
            reader.checkpoints().read(job, 0, fence=False)
        assert reader.checkpoints().read(job, 1, fence=False).version == 7  # other tasks unaffected
    finally:
        reader.close()


def _open_checkpoint_transaction(bootstrap: str, topic: str) -> Any:
    """A transaction left open on the checkpoint topic, as by a task SIGKILLed inside its
    checkpoint transaction (a raw producer: the state after such a kill, without the kill)."""
    from confluent_kafka import Producer

    other = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"other-task-{unique('t')}"})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, b"not committed", b"other-task/0")
    other.flush(10)
    return other


def test_checkpoint_read_waits_for_another_tasks_open_checkpoint_transaction(fresh_kafka_broker, tmp_path):
    """A read_committed reader stops at the first open transaction of the shared checkpoint
    topic: the read must wait for it to end, not return the stale checkpoint before it."""
    import threading

    values = kafka_values(tmp_path, fresh_kafka_broker.bootstrap, **{"systems.kafka.checkpoint.topic": "ckpts"})
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("x", 1)
    s.commit(input_position=1)
    other = _open_checkpoint_transaction(fresh_kafka_broker.bootstrap, "ckpts")
    s.store("kv").put("x", 2)
    s.commit(input_position=2)  # this task's own transaction commits behind the open one
    s.close()
    aborter = threading.Timer(1.0, other.abort_transaction, (10,))
    aborter.start()
    try:
        with TaskStorage(moved(values, tmp_path, "machine-b")) as b:
            assert b.checkpoint is not None and b.checkpoint.input_position == 2
            assert b.store("kv").get("x") == 2
    finally:
        aborter.join()


def test_checkpoint_read_blocked_past_the_timeout_is_a_clear_error(fresh_kafka_broker, tmp_path):
    values = kafka_values(tmp_path, fresh_kafka_broker.bootstrap, **{
        "systems.kafka.checkpoint.topic": "ckpts", "systems.kafka.timeout.ms": 800, "systems.kafka.retries": 0})
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("x", 1)
        s.commit(input_position=1)
    other = _open_checkpoint_transaction(fresh_kafka_broker.bootstrap, "ckpts")
    try:
        with pytest.raises(ChangelogError, match="open transaction at offset .* hides newer checkpoints"):
            TaskStorage(moved(values, tmp_path, "machine-b"))
    finally:
        other.abort_transaction(10)
