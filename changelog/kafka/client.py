"""The one Kafka client of localstate: settings, retries, topic admin and reading to
the true end of a partition. Used by the Kafka changelog, its checkpoint store and the
Spark ``localstate-kafka`` source.

Reading to the end: the high watermark is never trusted for correctness (tansu reports
the last batch's base offset + 1, not the end), so the end of a partition is found by
reading its last batch until partition EOF. ``consume(n, timeout)`` waits the whole
timeout unless ``n`` events arrive, which costs a timeout at the end of every short
read; :func:`next_batch` takes what is queued at once and otherwise waits for one event.

Batches are of at most :data:`CONSUME_BATCH` messages, and that number is kept below the
cyclic garbage collector's first threshold (700 net allocations of tracked objects) on
purpose: each ``Message`` is a tracked object, so a larger ``consume()`` triggers
collections that traverse the batch being built (measured on a bare consume loop: 2,000
per call ran at half the speed of 500 per call, or of 2,000 with the collector off).
Callers that keep messages across batches should keep their fields instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from localstate.errors import ChangelogError, ConfigError, FencedError

try:
    from confluent_kafka import (
        Consumer,
        KafkaError,
        KafkaException,
        Message,
        TopicCollection,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError("Kafka support needs confluent-kafka: pip install 'localstate[kafka]'") from _e

__all__ = ["KafkaSettings", "KafkaClient", "next_batch", "is_fenced", "aborted_transaction_error", "connect_timeout_ms", "CONNECT_FAST", "CONSUME_BATCH"]

log = logging.getLogger("localstate.changelog.kafka")
client_log = logging.getLogger("localstate.changelog.kafka.client")
"""librdkafka's own log lines go here (not to stderr)."""

T = TypeVar("T")

_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
_RETRIABLE_CODES = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                              # a partition of a topic just created, before its leader is in place
                              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
PRODUCER_FIXED = {"enable.idempotence": "true", "acks": "all", "transactional.id": None}
"""Producer settings localstate sets itself (None: any value is refused)."""
CONSUMER_FIXED = {"enable.auto.commit": "false", "enable.partition.eof": "true"}
_POLL_S = 0.2
CONSUME_BATCH = 500
CONNECT_FAST = {"reconnect.backoff.ms": 20}
"""Set on every client (before the user's settings, which may override it): librdkafka
spaces new broker connections by half of ``reconnect.backoff.ms`` (default 100), and
each client of a task open (the transactional producer's coordinator, every consumer)
connects to the broker by id after the bootstrap connection — 50 ms of an idle wait
each time, 13 ms with this (measured: ``init_transactions`` 53 → 13 ms). Backoff after
a failed connection still grows exponentially to ``reconnect.backoff.max.ms``."""
_error_of = Message.error

CHECKPOINT_SEGMENT_BYTES = 8 << 20
"""``segment.bytes`` of a checkpoint topic localstate creates. A task's open reads the
checkpoint topic from its start, and a broker compacts only rolled segments: the active
segment is what an open reads beyond about one record per task. Kafka's default of
1 GiB lets it hold some three million checkpoints (benchmarks/RESULTS.md, "kafka")."""
_SEGMENT_WARN_BYTES = 64 << 20
_warned_segments: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class KafkaSettings:
    """``systems.<name>.*`` of a Kafka changelog system (and the client settings of
    the Spark Kafka source)::

        systems.kafka.bootstrap.servers = broker1:9092,broker2:9092
        systems.kafka.replication.factor = 3          # new topics (-1: broker default)
        systems.kafka.delete.retention.ms = 86400000  # tombstone retention of new topics
        systems.kafka.checkpoint.topic = localstate-checkpoints
        systems.kafka.timeout.ms = 30000              # per broker operation attempt
        systems.kafka.retries = 3                     # attempts after the first
        systems.kafka.retry.backoff.ms = 500
        systems.kafka.producer.linger.ms = 10         # pass-through librdkafka settings
        systems.kafka.consumer.fetch.max.bytes = 52428800
        systems.kafka.topic.min.insync.replicas = 2   # extra configs of created topics
        systems.kafka.snapshots.path = s3://bucket/snapshots   # where engine snapshots are
                                                      # shipped (file:///shared/dir too)
        systems.kafka.snapshots.config.endpoint = ...  # with an object store: as its config.*
    """

    bootstrap_servers: str = ""
    replication_factor: int = -1
    delete_retention_ms: int = 24 * 3600 * 1000
    checkpoint_topic: str = "localstate-checkpoints"
    timeout_ms: int = 30_000
    retries: int = 3
    retry_backoff_ms: int = 500
    producer: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)
    topic: dict[str, str] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)

    def validate(self, prefix: str) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError(
                f"{prefix}.bootstrap.servers is required for the kafka changelog "
                f"(e.g. {prefix}.bootstrap.servers = 127.0.0.1:9092)"
            )
        for key, value, low in (("replication.factor", self.replication_factor, -1),
                                ("delete.retention.ms", self.delete_retention_ms, 0),
                                ("timeout.ms", self.timeout_ms, 100), ("retries", self.retries, 0),
                                ("retry.backoff.ms", self.retry_backoff_ms, 0)):
            if value < low:
                raise ConfigError(f"{prefix}.{key} = {value}: must be >= {low}")
        if self.replication_factor == 0:
            raise ConfigError(f"{prefix}.replication.factor = 0: use -1 (broker default) or >= 1")
        if not self.checkpoint_topic.strip():
            raise ConfigError(f"{prefix}.checkpoint.topic must not be empty")
        for key, fixed in PRODUCER_FIXED.items():
            given = self.producer.get(key)
            if given is not None and (fixed is None or given.lower() not in (fixed, "-1" if key == "acks" else fixed)):
                raise ConfigError(
                    f"{prefix}.producer.{key} = {given!r}: localstate sets {key} itself "
                    "(idempotent, acks=all, one transactional id per task); remove the key"
                )
        for key, fixed in CONSUMER_FIXED.items():
            given = self.consumer.get(key)
            if given is not None and given.lower() != fixed:
                raise ConfigError(f"{prefix}.consumer.{key} = {given!r}: must be {fixed} (restore needs it); remove the key")
        if self.snapshots:
            from ..snapshots import snapshot_store

            snapshot_store(self.snapshots, f"{prefix}.snapshots", connect=False)
        policy = self.topic.get("cleanup.policy")
        if policy is not None and policy != "compact":
            raise ConfigError(
                f"{prefix}.topic.cleanup.policy = {policy!r}: changelog topics must be "
                "'compact' (deletion by time or size would lose committed state)"
            )

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def patience_s(self) -> float:
        """How long a read may see no answer before it fails: every attempt's timeout."""
        return self.timeout_s * (self.retries + 1)


def is_fenced(err: Any) -> bool:
    """Whether ``err`` says a newer instance of the same transactional producer exists."""
    return isinstance(err, KafkaError) and err.code() in _FENCED_CODES


def aborted_transaction_error(producer: Any, timeout_s: float) -> KafkaError | None:
    """Abort ``producer``'s open transaction; the error that reports (the producer's own
    fatal error, e.g. fenced, after a call failed only with a generic ``_FATAL``), or None
    when the abort went through."""
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException as e:
        err = e.args[0] if e.args else None
        return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FATAL, str(e))
    return None


def connect_timeout_ms(settings: KafkaSettings) -> int:
    """``socket.connection.setup.timeout.ms`` for ``timeout.ms``: at most 10 s, and at
    least librdkafka's minimum of 1 s (a smaller value makes the client refuse to start)."""
    return max(1_000, min(10_000, settings.timeout_ms))


def next_batch(consumer: Any) -> list[Any]:
    """What is queued (up to a batch) at once; else wait up to ``_POLL_S`` for one event."""
    msgs = consumer.consume(CONSUME_BATCH, 0)
    if msgs:
        return msgs
    first = consumer.poll(_POLL_S)
    if first is None:
        return []
    return [first, *consumer.consume(CONSUME_BATCH - 1, 0)]


class KafkaClient:
    """Admin, consumers, retries and end detection over one set of brokers.

    ``where`` names the client's purpose in errors (``"systems.kafka"``, a source);
    ``group_id`` is used by consumers that only ever ``assign`` (never join or commit).
    """

    def __init__(self, settings: KafkaSettings, *, where: str, group_id: str) -> None:
        self.settings = settings
        self.where = where
        self.group_id = group_id
        self.timeout_s = settings.timeout_s
        self._admin: Any = None
        self._probe: Any = None
        self._topics: dict[str, int] = {}
        self.retention_ms: dict[str, int] = {}
        """Per checked topic: its ``delete.retention.ms`` (tombstones older may be compacted away)."""

    @property
    def servers(self) -> str:
        return self.settings.bootstrap_servers

    # -- retries ------------------------------------------------------------------------------
    def with_retries(self, what: str, op: Callable[[], T]) -> T:
        """Run ``op``; retry retriable Kafka errors with exponential backoff, then raise
        :class:`ChangelogError` naming the brokers (:class:`FencedError` if fenced)."""
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                return op()
            except KafkaException as e:
                err = e.args[0] if e.args else e
                if is_fenced(err):
                    raise FencedError(f"{what}: fenced by a newer instance of the same task (brokers {self.servers})") from e
                retriable = not isinstance(err, KafkaError) or err.retriable() or err.code() in _RETRIABLE_CODES
                if not retriable or attempt == s.retries:
                    raise ChangelogError(
                        f"kafka: could not {what} on brokers {self.servers} after {attempt + 1} "
                        f"attempt(s): {err}. Check that the brokers are reachable and the settings under "
                        f"{self.where}.*"
                    ) from e
                log.warning("kafka: %s failed (%s); retry %d/%d", what, err, attempt + 1, s.retries)
                time.sleep(s.retry_backoff_ms * (2**attempt) / 1000)
        raise AssertionError("unreachable")

    # -- clients ------------------------------------------------------------------------------
    def admin(self) -> Any:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.servers, "logger": client_log, **CONNECT_FAST,
                                       "socket.connection.setup.timeout.ms": connect_timeout_ms(self.settings)})
        return self._admin

    def consumer(self, isolation: str = "read_committed") -> Any:
        """A consumer for reading ranges (assign-only; never joins a group or commits),
        tuned to find partition EOF quickly (:meth:`consumer_config`)."""
        return Consumer(self.consumer_config(isolation))

    def consumer_config(self, isolation: str = "read_committed") -> dict[str, Any]:
        """The settings of :meth:`consumer`: the user's ``consumer.*`` over localstate's,
        then the ones reads depend on."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.servers,
            "group.id": self.group_id,
            "isolation.level": isolation,
            "fetch.queue.backoff.ms": 10,
            # The end is found by partition EOF, which takes an empty fetch, and a broker
            # holds an empty fetch for up to this long (default 500 ms); a task open reads
            # to EOF four times (its checkpoint, the records past it, the changelog end,
            # the tail). A scan unassigns its partition when it ends, so no idle consumer
            # keeps fetching at this pace.
            "fetch.wait.max.ms": 1,
            "auto.offset.reset": "earliest",
            "socket.connection.setup.timeout.ms": connect_timeout_ms(self.settings),
            "logger": client_log,
            **CONNECT_FAST,
        }
        conf.update(self.settings.consumer)
        conf.update({"enable.auto.commit": False, "enable.partition.eof": True})
        if isolation != "read_committed":
            conf["isolation.level"] = isolation
        return conf

    def probe(self) -> Any:
        """The client's read_uncommitted consumer (created once, closed by :meth:`close`):
        for where records physically are, committed or not. A read_committed reader ends
        at the last stable offset, which lags a commit until the broker has written its
        markers, and stops at any open transaction."""
        if self._probe is None:
            self._probe = self.consumer(isolation="read_uncommitted")
        return self._probe

    def close(self) -> None:
        """Close the probe consumer (the client can be used again: it is made anew)."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()

    # -- reading to the true end ----------------------------------------------------------------
    def scan(self, consumer: Any, topic: str, partition: int, start: int, stop: int | None = None,
             *, eof: list[int] | None = None) -> Iterator[tuple[list[Any], int]]:
        """``(messages, last_offset)`` batches of ``topic``/``partition`` with offsets in
        ``[start, stop)`` (to partition EOF if ``stop`` is None). Partition EOF ends the
        scan (its offset is appended to ``eof`` if given): the high watermark is never
        used. No answer for :attr:`KafkaSettings.patience_s` raises ChangelogError."""
        what = f"kafka topic {topic!r} partition {partition} (brokers {self.servers})"
        consumer.assign([TopicPartition(topic, partition, start)])
        idle_limit = self.settings.patience_s
        idle_since = time.monotonic()
        last = start - 1
        unstable: int | None = None  # a read_committed EOF below ``stop`` with records past it
        try:
            while True:
                msgs = next_batch(consumer)
                if not msgs:
                    if time.monotonic() - idle_since > idle_limit:
                        if unstable is not None:
                            raise ChangelogError(
                                f"reading {what}: offsets from {unstable} on are written but not readable by a "
                                f"read_committed reader after {idle_limit:.0f}s (a transaction over them is still "
                                "open: a producer died inside it and was not replaced yet). Open the task that "
                                "writes this partition again, or wait for the broker to abort it "
                                "(transaction.timeout.ms)"
                            )
                        raise ChangelogError(
                            f"reading {what} from offset {last + 1}: no answer from the brokers for {idle_limit:.0f}s"
                        )
                    continue
                idle_since = time.monotonic()
                tail = msgs[-1]
                # the common batch: no error or EOF event in it (C-level check: an error
                # is a truthy KafkaError), all below ``stop``
                if tail.error() is None and (stop is None or tail.offset() < stop) and not any(
                    map(_error_of, msgs)
                ):
                    last = tail.offset()
                    yield msgs, last
                    if stop is not None and last >= stop - 1:
                        return  # the last wanted record: no need to wait for EOF
                    continue
                good: list[Any] = []
                done = False
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if stop is not None and self._unstable(topic, partition, m.offset(), stop):
                                unstable = m.offset()
                                break  # wait for the records below ``stop`` to become readable
                            if eof is not None:
                                eof.append(m.offset())
                            done = True
                            break
                        raise ChangelogError(f"reading {what} at offset {last + 1} failed: {err}")
                    off = m.offset()
                    if stop is not None and off >= stop:
                        done = True
                        break
                    good.append(m)
                    last = off
                if good:
                    yield good, last
                if done:
                    return
        finally:
            consumer.unassign()

    def _unstable(self, topic: str, partition: int, eof: int, stop: int) -> bool:
        """Whether a read that wants offsets below ``stop`` and met partition EOF at ``eof``
        must wait: the broker holds records past ``eof`` (high watermark) that this reader
        does not see yet. A read_committed reader's EOF is the last stable offset, and a
        broker writes a committed transaction's markers after ``commit_transaction``
        returns, so right after a commit its records may be invisible for a moment.
        (A broker whose high watermark understates the end makes this False: the read
        ends at EOF, as when the records are missing.)"""
        if eof >= stop:
            return False
        _, high = self.watermarks(self.probe(), topic, partition)
        return high > eof

    def watermarks(self, consumer: Any, topic: str, partition: int) -> tuple[int, int]:
        """The broker's (low, high) watermarks; high may understate the end (see module).
        Asked through a read_committed ``consumer``, a broker answers the last stable
        offset as high (Apache Kafka does): pass :meth:`probe` for the high watermark."""
        return self.with_retries(
            f"read the offsets of kafka topic {topic!r} partition {partition}",
            lambda: consumer.get_watermark_offsets(TopicPartition(topic, partition), self.timeout_s),
        )

    def end_offset(self, consumer: Any, topic: str, partition: int, *, back: int = 1) -> int:
        """The true end of the partition: read from ``back`` below the reported high
        watermark to EOF. ``back=1`` counts a trailing transaction marker as part of the
        partition (where the next write lands); ``back=2`` ends after the last record.
        Through a read_committed ``consumer``: the end of what is committed and stable
        (through :meth:`probe`: of every record)."""
        low, high = self.watermarks(consumer, topic, partition)
        end = high if back == 1 else low
        for _, last in self.scan(consumer, topic, partition, max(low, high - back)):
            end = max(end, last + 1)
        return max(end, low)

    def _describe(self, topic: str, *, missing_ok: bool = False) -> Any:
        """``topic``'s description: one DescribeTopics request for this topic, which never
        creates it (a metadata request naming it may, with the broker's defaults) and costs
        the same however many topics the cluster has (a full listing grows with them).
        With ``missing_ok`` None for a topic that does not exist; otherwise that error is
        retried as any retriable one, then raised."""
        admin = self.admin()

        def describe() -> Any:
            future = admin.describe_topics(TopicCollection([topic]), request_timeout=self.timeout_s)[topic]
            try:
                return future.result()
            except KafkaException as e:
                if (missing_ok and e.args and isinstance(e.args[0], KafkaError)
                        and e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    return None
                raise

        return self.with_retries(f"describe topic {topic!r}", describe)

    def _partition_ids(self, topic: str) -> list[int] | None:
        """The topic's partition ids, or None if it does not exist (:meth:`_describe`)."""
        found = self._describe(topic, missing_ok=True)
        return sorted(p.id for p in found.partitions) if found is not None and found.partitions else None

    def topic_id(self, topic: str) -> str:
        """``topic``'s id (a new one each time a topic of that name is created), "" when
        the broker does not give one."""
        uuid = str(self._describe(topic).topic_id or "")
        return "" if uuid.strip("A=") == "" else uuid

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``; ChangelogError if it does not exist."""
        ids = self._partition_ids(topic)
        if ids is None:
            raise ChangelogError(f"kafka topic {topic!r} on brokers {self.servers} is not readable (no such topic)")
        return ids

    def _created(self, topic: str) -> list[int] | None:
        """The partition ids of a topic just created: a broker answers the creation before
        its metadata lists the topic's partitions, so ask again (bounded by the timeout)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            ids = self._partition_ids(topic)
            if ids is not None or time.monotonic() > deadline:
                return ids
            time.sleep(0.05)

    # -- topics -------------------------------------------------------------------------------
    def topic_exists(self, topic: str) -> bool:
        return self._partition_ids(topic) is not None

    def _hint_checkpoint_segments(self, topic: str, entry: Any) -> None:
        """Warn once per process about a checkpoint topic whose segments let it grow far
        past one record per task between compactions (every task open reads all of it)."""
        try:
            size = int(entry.value)
        except (AttributeError, TypeError, ValueError):
            return
        if size <= _SEGMENT_WARN_BYTES or (self.servers, topic) in _warned_segments:
            return
        _warned_segments.add((self.servers, topic))
        log.warning(
            "kafka checkpoint topic %r on brokers %s has segment.bytes=%d: the broker compacts only rolled "
            "segments and every task open reads the topic from its start, so opens slow down as it grows. "
            "Set segment.bytes=%d (kafka-configs --alter --add-config segment.bytes=%d --topic %s)",
            topic, self.servers, size, CHECKPOINT_SEGMENT_BYTES, CHECKPOINT_SEGMENT_BYTES, topic)

    def ensure_topic(self, topic: str, partitions: int, *, checkpoint: bool = False) -> None:
        """Create ``topic`` (compacted, ``partitions``) if missing; refuse a mismatching one."""
        if self._topics.get(topic) == partitions:
            return
        s = self.settings
        admin = self.admin()
        ids = self._partition_ids(topic)
        if ids is None:
            config = {"cleanup.policy": "compact", "delete.retention.ms": str(s.delete_retention_ms)}
            if checkpoint:
                config["segment.bytes"] = str(CHECKPOINT_SEGMENT_BYTES)
            config.update(s.topic)
            new = NewTopic(topic, partitions, s.replication_factor, config=config)

            def create() -> None:
                fut = admin.create_topics([new], operation_timeout=self.timeout_s, request_timeout=self.timeout_s)[topic]
                try:
                    fut.result()
                except KafkaException as e:
                    if e.args and e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise

            self.with_retries(f"create topic {topic!r}", create)
            log.info("created kafka topic %r: %d partition(s), cleanup.policy=compact", topic, partitions)
            ids = self._created(topic)
        have = len(ids) if ids is not None else 0
        what = "checkpoint topic" if checkpoint else "changelog topic"
        if have != partitions:
            fix = (
                f"use a new topic in {self.where}.checkpoint.topic"
                if checkpoint
                else "set job.partitions back, or point the store at a new changelog topic"
            )
            raise ChangelogError(
                f"kafka {what} {topic!r} on brokers {self.servers} has {have} partition(s) but "
                f"{partitions} are needed (state is partitioned by task, one changelog partition per task); "
                f"{fix}"
            )
        res = ConfigResource("topic", topic)

        def describe() -> dict[str, Any]:
            return admin.describe_configs([res], request_timeout=self.timeout_s)[res].result()

        configs = self.with_retries(f"describe topic {topic!r}", describe)
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None and entry.value is not None else "delete"
        if policy.replace(" ", "") != "compact":
            raise ChangelogError(
                f"kafka {what} {topic!r} on brokers {self.servers} has cleanup.policy={policy}, but "
                "it must be 'compact' (deletion by time or size loses committed state). Alter the topic "
                f"(kafka-configs --alter --add-config cleanup.policy=compact --topic {topic}) or use a new topic"
            )
        if checkpoint:
            self._hint_checkpoint_segments(topic, configs.get("segment.bytes"))
        retention = configs.get("delete.retention.ms")
        try:
            self.retention_ms[topic] = int(retention.value) if retention is not None else s.delete_retention_ms
        except (TypeError, ValueError):
            self.retention_ms[topic] = s.delete_retention_ms
        self._topics[topic] = partitions

