"""The Kafka changelog against real brokers on 127.0.0.1, never a mock: every test that
takes ``kafka_broker`` runs twice, on tansu and on Apache Kafka (one KRaft node).

* the shipped changelog conformance suite (partition contract, every installed KV engine
  restored from Kafka equals the committed state, zombie fencing);
* SIGKILL between the changelog flush and the checkpoint → trim → full restore == last commit;
* zombie fencing; broker killed / paused during a commit; wrong existing topics; config errors.

tansu keeps its data in memory only: a restarted tansu has lost every topic, so
"the broker comes back" is tested by pausing the broker process (SIGSTOP/SIGCONT); the
tests that stop their own broker run on tansu (a fresh Apache Kafka node costs seconds).
Nothing here depends on tansu's known gaps (no compaction, understated high
watermark, aborted records visible to read_committed consumers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage, faults
from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, ConfigError, CorruptionError
from localstate.testing import FULL
from localstate.testing import torture as T
from localstate.testing.changelog_conformance import (
    ChangelogSystemConformance,
    apply_records,
    damage_files,
    dump,
    records,
    task_values,
    unique,
)
from localstate.testing.changelog_conformance import on_another_machine as moved

pytestmark = pytest.mark.kafka

FAST = {"timeout.ms": 1500, "retries": 1, "retry.backoff.ms": 100}


@pytest.fixture(params=["tansu", "apache"])
def kafka_broker(request: pytest.FixtureRequest) -> str:
    """The bootstrap servers of the session's tansu broker, then of its Apache Kafka node."""
    return request.getfixturevalue("apache_kafka_broker" if request.param == "apache" else "kafka_broker")


class TestKafkaChangelogConformance(ChangelogSystemConformance):
    fenced_match = "fenced by a newer instance"

    @pytest.fixture
    def make_system(self, kafka_broker) -> Callable[[], KafkaChangelogSystem]:
        job = unique("job")
        return lambda: KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker, **FAST}, job)

    @pytest.fixture
    def job_values(self, kafka_broker) -> dict[str, Any]:
        return {"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": kafka_broker}

    def test_tasks_committing_at_once_each_read_back_their_last_commit(self, job_values, tmp_path, request):
        # tansu 0.6.0 (the fast test broker) now and then leaves one of several transactions
        # overlapping on a partition unresolved after their transactional ids' producers were
        # renewed, though its commit was acknowledged: the partition's last stable offset stops
        # for good and a read_committed open waits out its timeout (about one run of this case
        # in four; reproduced with plain producers too, see benchmarks/RESULTS.md). The shared
        # checkpoint partition is such a partition, so the case runs on the Apache Kafka node.
        if request.node.callspec.params["kafka_broker"] == "tansu":
            pytest.skip("tansu 0.6.0 can leave an overlapping transaction unresolved; the case runs on Apache Kafka")
        super().test_tasks_committing_at_once_each_read_back_their_last_commit(job_values, tmp_path)

    def lose_newest_checkpoint(self, values: dict[str, Any]) -> None:
        """A record of a compacted topic is deleted by a tombstone for its key."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": values["systems.kafka.bootstrap.servers"]})
        topic = values.get("systems.kafka.checkpoint.topic", "localstate-checkpoints")
        producer.produce(topic, key=f"{values['job.name']}/0".encode(), value=None, partition=0)
        assert producer.flush(30) == 0

    def storage_snapshot(self, values: dict[str, Any]) -> Any:
        """The job's changelog topic and the checkpoint topic: existence and end offsets."""
        system = KafkaChangelogSystem("kafka", {"bootstrap.servers": values["systems.kafka.bootstrap.servers"],
                                                **FAST}, values["job.name"])
        consumer = system.client.consumer(isolation="read_uncommitted")
        try:
            return {t: system.client.topic_exists(t) and system.client.watermarks(consumer, t, 0)
                    for t in (f"{values['job.name']}-kv",
                              values.get("systems.kafka.checkpoint.topic", "localstate-checkpoints"))}
        finally:
            consumer.close()
            system.close()

    def task_values(self, job_values: dict[str, Any], tmp_path: Path, factory: str = "memory") -> dict[str, Any]:
        # a checkpoint topic of its own: lose_everything deletes it
        return task_values(job_values, tmp_path, factory, **{"systems.kafka.checkpoint.topic": unique("ckpt")})

    def lose_stream(self, values: dict[str, Any], stream: str) -> None:
        delete_topics(values["systems.kafka.bootstrap.servers"], [stream])

    def ship_snapshots(self, values: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
        return {"systems.kafka.snapshots.path": f"file://{tmp_path / 'shared-snapshots'}"}

    def damage_shipped_snapshots(self, values: dict[str, Any]) -> int:
        root = Path(values["systems.kafka.snapshots.path"][len("file://"):])
        return damage_files(sorted(p for p in root.rglob("sst/*") if p.is_file()))

    def lose_everything(self, values: dict[str, Any]) -> None:
        delete_topics(values["systems.kafka.bootstrap.servers"], [
            values["stores.kv.changelog"].split(".", 1)[1], values["systems.kafka.checkpoint.topic"]])


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete ``topics`` and wait until the broker lists none of them (a real broker
    deletes in the background)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics(topics, operation_timeout=10).values():
        fut.result(10)
    deadline = time.monotonic() + 30
    while set(topics) & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, f"topics {topics} still listed 30 s after their deletion"
        time.sleep(0.1)


def test_a_takeover_bumps_the_producer_epoch(kafka_broker, tmp_path):
    values = kafka_values(tmp_path, kafka_broker)
    with TaskStorage(Config.from_dict(values)) as a:
        first = a.epoch
    with TaskStorage(moved(values, tmp_path, "machine-b")) as b:
        assert b.epoch == first + 1


def test_bootstrap_servers_pointing_at_an_empty_cluster(kafka_broker_process, apache_kafka_broker, tmp_path):
    """A task committed on one cluster, its config then pointing at another, empty one (the
    tansu and the Apache Kafka broker of the session): an error where the task committed
    before; a brand-new machine cannot tell an empty cluster from a new job and opens
    empty. The first cluster still holds the exact commit."""
    if kafka_broker_process.bootstrap == apache_kafka_broker:
        pytest.skip("LOCALSTATE_KAFKA_BROKER=apache: the session has one broker, not two clusters")
    values = kafka_values(tmp_path, kafka_broker_process.bootstrap, "rocksdb")
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put_all({f"k{i}": i for i in range(20)})
        s.commit(input_position=1)
    elsewhere = {**values, "systems.kafka.bootstrap.servers": apache_kafka_broker}
    with pytest.raises(CorruptionError, match=rf"no checkpoint in kafka changelog on brokers {apache_kafka_broker}"):
        TaskStorage(Config.from_dict(elsewhere))
    with TaskStorage(moved(elsewhere, tmp_path, "brand-new")) as s:
        assert s.checkpoint is None and dump(s) == {}
    with TaskStorage(Config.from_dict(values)) as s:
        assert s.checkpoint.input_position == 1 and dump(s) == {f"k{i}": i for i in range(20)}


def test_a_restore_waits_for_committed_records_behind_an_open_transaction(apache_kafka_broker, tmp_path):
    """A read_committed reader ends at the last stable offset: at the first record of a
    transaction still open, and on Apache Kafka also for a moment after every commit (the
    broker writes the commit markers after ``commit_transaction`` returns). A restore of
    committed records behind that offset waits for them: it never ends early, and the end
    of the partition is not taken for the stable offset (which would make the committed
    records look missing). tansu has no such offset, so this runs on Apache Kafka."""
    import threading

    from confluent_kafka import Producer

    values = kafka_values(tmp_path, apache_kafka_broker)
    stream = values["stores.kv.changelog"].split(".", 1)[1]
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put_all({f"k{i}": i for i in range(10)})
        s.commit(input_position=1)
    other = Producer({"bootstrap.servers": apache_kafka_broker, "transactional.id": unique("other")})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(stream, b"1", b"other", 0)  # a transaction left open in the changelog partition
    other.flush(10)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put_all({f"k{i}": i + 100 for i in range(10)})
        s.commit(input_position=2)  # its records lie behind the open transaction's first record
    timer = threading.Timer(1.5, other.abort_transaction, args=(10,))
    timer.start()
    t0 = time.monotonic()
    try:
        with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
            assert s.checkpoint.input_position == 2
            assert dump(s) == {f"k{i}": i + 100 for i in range(10)}
        assert time.monotonic() - t0 >= 1.0  # it waited for the transaction to end
    finally:
        timer.join()


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


def test_created_checkpoint_topic_rolls_small_segments(kafka_broker, tmp_path):
    """Every task open reads the checkpoint topic from its start and the broker compacts
    only rolled segments, so a checkpoint topic localstate creates keeps them small."""
    from confluent_kafka.admin import AdminClient, ConfigResource
    from localstate.changelog.kafka.client import CHECKPOINT_SEGMENT_BYTES

    topic = unique("ckpt")
    with TaskStorage(Config.from_dict(kafka_values(tmp_path, kafka_broker, **{"systems.kafka.checkpoint.topic": topic}))) as s:
        s.store("kv").put("a", 1)
        s.commit(input_position=1)
    res = ConfigResource("topic", topic)
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    configs = admin.describe_configs([res])[res].result(10)
    assert configs["segment.bytes"].value == str(CHECKPOINT_SEGMENT_BYTES)
    assert configs["cleanup.policy"].value == "compact"


def test_a_checkpoint_topic_with_huge_segments_is_named_once(kafka_broker, tmp_path, caplog):
    """A checkpoint topic made elsewhere with Kafka's default 1 GiB segments works, and the
    log says once how to keep task opens from slowing down as it grows."""
    topic = unique("bigsegments")
    _create_topic(kafka_broker, topic, 1, {"cleanup.policy": "compact", "segment.bytes": str(1 << 30)})
    values = kafka_values(tmp_path, kafka_broker, **{"systems.kafka.checkpoint.topic": topic})
    for run in (1, 2):
        with TaskStorage(Config.from_dict(values)) as s:
            s.store("kv").put("a", run)
            s.commit(input_position=run)
    hints = [r.getMessage() for r in caplog.records if "segment.bytes=1073741824" in r.getMessage()]
    assert len(hints) == 1 and f"--topic {topic}" in hints[0]
    with TaskStorage(Config.from_dict(values)) as s:
        assert s.checkpoint.input_position == 2 and s.store("kv").get("a") == 2


# -- TaskStorage over Kafka ------------------------------------------------------------------------------
def test_a_changelog_topic_deleted_under_an_open_task_fails_its_commit_and_stays_deleted(apache_kafka_broker,
                                                                                          tmp_path):
    """A changelog topic deleted under a running task (an operator's mistake) fails the next
    commit with an error instead of coming back empty with the broker's defaults, and the
    next open refuses the lost records. On Apache Kafka only: tansu 0.6.0 accepts records
    for a deleted topic (the commit succeeds; the next open then fails reading them)."""
    from confluent_kafka.admin import AdminClient

    kafka_broker = apache_kafka_broker

    values = kafka_values(tmp_path, kafka_broker, **{f"systems.kafka.{k}": v for k, v in FAST.items()})
    stream = values["stores.kv.changelog"].split(".", 1)[1]
    config = Config.from_dict(values)
    s = TaskStorage(config)
    try:
        s.store("kv").put_all({f"k{i}": i for i in range(20)})
        s.commit(input_position=1)
        delete_topics(kafka_broker, [stream])
        s.store("kv").put_all({f"k{i}": -i for i in range(20)})
        with pytest.raises(ChangelogError):
            s.commit(input_position=2)
    finally:
        s.close()
    time.sleep(1)  # a topic created by the producer's metadata requests would be listed by now
    assert stream not in AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=10).topics
    with pytest.raises(CorruptionError, match="committed records are missing"):
        TaskStorage(config)


def kafka_values(tmp_path: Path, bootstrap: str, factory: str = "memory", **extra: Any) -> dict[str, Any]:
    return task_values({"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": bootstrap},
                       tmp_path, factory, **extra)


def changelog_contents(bootstrap: str, stream: str) -> dict[str, Any]:
    """Every record a read_committed reader sees in the changelog partition (to its last
    stable offset: not past a transaction still open), applied in order (what compaction
    would keep), decoded with the test store's serdes."""
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": bootstrap}, unique("reader"))
    try:
        consumer = system.client.consumer()
        state = apply_records((m.key(), m.value()) for msgs, _ in system.client.scan(consumer, stream, 0, 0)
                              for m in msgs)
        consumer.close()
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
    # A task commit is one transaction (records and checkpoint), and the kill came before
    # its commit: a read_committed reader sees only the last commit, not the killed
    # attempt's records (their transaction stays open until the next instance aborts it)
    assert changelog_contents(kafka_broker, stream) == reference[2]
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        pos = s.checkpoint.input_position
        # a checkpoint produced but never committed is invisible on Kafka (read_committed);
        # a broker that shows aborted records may expose it: still a consistent commit
        assert pos == 2 or (point == "checkpoint.before_rename" and pos == 3)
        assert dump(s, T.STORE) == reference[pos]
    # after the trim, the whole log (what compaction keeps) is the committed state
    assert changelog_contents(kafka_broker, stream) == reference[pos]
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert dump(s, T.STORE) == reference[pos]
    rc, _, err = T.run_child(plan, values, None)
    assert rc == 0, err
    with TaskStorage(moved(values, tmp_path, "machine-d")) as s:
        assert s.checkpoint.input_position == 5
        assert dump(s, T.STORE) == reference[5]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["memory", "rocksdb"])
def test_crash_trials_on_apache_kafka(engine, tmp_path, apache_kafka_broker):
    """The Kafka crash trials (``localstate torture --changelog kafka --bootstrap apache``,
    short form; the full run is in RELIABILITY.md) on the real broker: SIGKILLs at named
    commit points and random moments, every reopen equal to the crash-free reference."""
    report = T.run_trials(engine, "kafka", 8 if FULL else 2, seed=3003, workdir=tmp_path, batches=6, ops=20,
                          bootstrap=apache_kafka_broker, jobs=2)
    s = report.summary()
    assert s["divergences"] == 0, json.dumps(s["first_divergence"], indent=2, default=str)
    assert s["trials"] == len(report.results) > 0 and sum(r.crashes for r in report.results) >= 1


@pytest.mark.parametrize("point", ["commit.after_changelog_flush", "commit.after_engine_checkpoint",
                                   "checkpoint.before_rename"])
def test_a_commit_is_one_transaction_records_and_checkpoint(kafka_broker, tmp_path, point):
    """The changelog records of a commit are committed by the checkpoint write, not by
    the flush before it: a commit that fails anywhere between them leaves no committed
    record behind (a read_committed reader sees the last commit), and the next instance
    restores that commit exactly."""
    values = kafka_values(tmp_path, kafka_broker)
    stream = values["stores.kv.changelog"].split(".", 1)[1]
    s = TaskStorage(Config.from_dict(values))
    kv = s.store("kv")
    for i in range(100):  # more than the write batch: records reach the producer before the commit
        kv.put(f"k{i}", i)
    s.commit(input_position=1)
    committed = dump(s)
    for i in range(50, 150):
        kv.put(f"k{i}", -i)
    kv.delete("k0")
    attempted = dump(s)
    faults.configure(f"{point}=raise")
    try:
        with pytest.raises(faults.InjectedFault):
            s.commit(input_position=2)
    finally:
        faults.configure(None)
    # the failed commit's records were acknowledged but their transaction is still open
    assert changelog_contents(kafka_broker, stream) == committed
    # close aborts it (tansu then shows the aborted records to read_committed readers,
    # which a later full restore must not depend on: the next open trims them)
    s.close()
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s2:
        # a checkpoint record produced but aborted is invisible on Kafka; a broker that shows
        # aborted records (tansu) shows it with the records it names: still one whole commit
        pos = s2.checkpoint.input_position
        assert pos == 1 or (point == "checkpoint.before_rename" and pos == 2)
        state = committed if pos == 1 else attempted
        assert dump(s2) == state
        s2.store("kv").put("k0", 7)
        s2.commit(input_position=3)
    assert changelog_contents(kafka_broker, stream) == {**state, "k0": 7}


def test_stores_on_another_kafka_system_than_the_checkpoints_commit_at_their_flush(kafka_broker, tmp_path):
    """Only the producer that writes the checkpoint can commit a store's records with
    it: a store on another Kafka system commits its own transaction at the flush, so
    its records are committed before the checkpoint names them."""
    values = kafka_values(tmp_path, kafka_broker, **{"systems.other.type": "kafka",
                                                     "systems.other.bootstrap.servers": kafka_broker})
    job = values["job.name"]
    values["stores.kv.changelog"] = f"other.{job}-kv"
    values["job.checkpoint.system"] = "kafka"
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("a", 1)
    s.commit(input_position=1)
    s.store("kv").put("a", 2)
    faults.configure("commit.after_engine_checkpoint=raise")
    try:
        with pytest.raises(faults.InjectedFault):
            s.commit(input_position=2)
    finally:
        faults.configure(None)
    # this store's transaction was committed by its flush (as before one-transaction commits)
    assert changelog_contents(kafka_broker, f"{job}-kv") == {"a": 2}
    s.close()
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s2:
        assert s2.checkpoint.input_position == 1
        assert dump(s2) == {"a": 1}


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
        p.append(records(0, 10))
        first_end = p.flush()
        assert p.min_valid_snapshot_offset() == 0  # everything is recent
        time.sleep(1.7)
        assert p.min_valid_snapshot_offset() == 10  # all older than the horizon: only the end is safe
        p.append(records(10, 20))
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
            expected[p] = (dump(s, "a"), dump(s, "b"))
            expected[p][1].pop("uncommitted")
    for p in (0, 1):
        with TaskStorage(moved(values, tmp_path, f"b{p}"), partition=p) as s:
            assert s.checkpoint.input_position == p
            assert (dump(s, "a"), dump(s, "b")) == expected[p]


def _write_foreign_record(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    """A record written to partition 0 of ``topic`` by a plain producer (not localstate)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value, key, 0)
    assert producer.flush(10) == 0


def test_corrupt_latest_checkpoint_is_an_error_not_a_fall_back(kafka_broker):
    """No silent fall-back to the record before: broker compaction may have made that
    older commit unreconstructible (issue 14, case 1)."""

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

    _write_foreign_record(kafka_broker, topic, f"{job}/0".encode(), b"garbage")
    reader = KafkaChangelogSystem("kafka", opts, job)
    try:
        with pytest.raises(CorruptionError, match=rf"{job}/partition 0.*--reset"):
            reader.checkpoints().read(job, 0, fence=False)
        assert reader.checkpoints().read(job, 1, fence=False).version == 7  # other tasks unaffected
    finally:
        reader.close()


def test_checkpoint_and_generation_are_read_in_one_pass_and_a_corrupt_generation_is_named(kafka_broker):
    """A fresh system reads the job's generation record and the task's checkpoint from one
    scan of the shared topic (plus the hidden-transaction check): the checkpoint of the
    current generation is returned, look-alike keys of other jobs (``<job>.genius/0``) are
    not taken for it, and a corrupt generation record is a CorruptionError naming it."""
    from localstate.changelog.base import Generation

    job, topic = unique("job"), unique("ckpt")
    opts = {"bootstrap.servers": kafka_broker, "checkpoint.topic": topic}
    writer = KafkaChangelogSystem("kafka", opts, job)
    try:
        store = writer.checkpoints()
        store.write(job, 0, Checkpoint(version=3, input_position="gen0", offsets={"kv": 5}, epoch=1))
        writer.write_generation(Generation(1, 2, 1, {}))
        store.write(job, 0, Checkpoint(version=4, input_position="gen1", offsets={"kv": 0}, epoch=1))
        store.write(f"{job}.genius", 0, Checkpoint(version=99, input_position="other job", offsets={}, epoch=1))
    finally:
        writer.close()

    reader = KafkaChangelogSystem("kafka", opts, job)
    consumers = []
    make_consumer = reader.client.consumer
    reader.client.consumer = lambda *a, **k: consumers.append(1) or make_consumer(*a, **k)  # type: ignore[method-assign]
    try:
        ckpt = reader.checkpoints().read(job, 0, fence=False)
        assert (ckpt.version, ckpt.input_position) == (4, "gen1")
        assert reader.generation().number == 1
        assert len(consumers) == 2  # the one scan + the hidden-transaction check; no generation scan
    finally:
        reader.close()

    _write_foreign_record(kafka_broker, topic, f"{job}/generation".encode(), b"{not json")
    broken = KafkaChangelogSystem("kafka", opts, job)
    try:
        with pytest.raises(CorruptionError, match=rf"{job}/generation in kafka topic .*is corrupt"):
            broken.checkpoints().read(job, 0, fence=False)
        assert not broken.generation_known()  # nothing pinned from a failed read
    finally:
        broken.close()


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
        with pytest.raises(ChangelogError, match="open transaction at offset .* hides newer checkpoints .*checkpoint of .other-task/0."):
            TaskStorage(moved(values, tmp_path, "machine-b"))
    finally:
        other.abort_transaction(10)



def test_batches_larger_than_the_local_queue_arrive_whole_and_in_order(kafka_broker):
    """A producer queue of 40 messages under batches of 500: produce() runs out of room
    many times per batch; each time acknowledgements make room and producing goes on from
    the record that did not fit, so the partition holds every record once, in order."""
    job = unique("job")
    system = KafkaChangelogSystem("kafka", {"bootstrap.servers": kafka_broker, **FAST,
                                            "producer.queue.buffering.max.messages": 40}, job)
    part = system.open_partition(unique("queue"), 0, 1)
    try:
        sent = []
        for b in range(3):
            keys = [b"%d-%03d" % (b, i) for i in range(500)]
            values = [None if i % 97 == 0 else b"v%d" % i for i in range(500)]
            part.append_columns(keys, values)
            sent += list(zip(keys, values))
        end = part.flush()
        got = [(k, v) for batch, _ in part.read_batches(0, end) for k, v in batch]
        assert got == sent
    finally:
        part.close()
        system.close()
