"""``kafka``: the changelog and the task checkpoints in Kafka topics (confluent-kafka).

Configuration (``systems.<name>.*``, usually ``systems.kafka.*``)::

    stores.counts.changelog = kafka.pageviews-counts       # one topic per store changelog
    systems.kafka.bootstrap.servers = broker1:9092,broker2:9092
    systems.kafka.replication.factor = 3                   # new topics (-1: broker default)
    systems.kafka.delete.retention.ms = 86400000           # tombstone retention of new topics
    systems.kafka.checkpoint.topic = localstate-checkpoints
    systems.kafka.timeout.ms = 30000                       # per broker operation attempt
    systems.kafka.retries = 3                              # attempts after the first
    systems.kafka.retry.backoff.ms = 500
    systems.kafka.producer.linger.ms = 10                  # pass-through librdkafka settings
    systems.kafka.consumer.fetch.max.bytes = 52428800
    systems.kafka.topic.min.insync.replicas = 2            # extra configs of created topics

How it maps onto Kafka:

* A store changelog ``kafka.<topic>`` is the topic ``<topic>``, created if missing with
  ``partitions = job.partitions`` and ``cleanup.policy=compact``. An existing topic with
  another partition count or cleanup policy is refused with :class:`ChangelogError`.
* Each task partition writes through **one transactional producer**
  (``transactional.id = localstate.<job>.<system>.<partition>``; idempotent, ``acks=all``).
  ``flush()`` commits the transaction, which succeeds only once every record is
  acknowledged. A newer instance of the same task calls ``init_transactions`` when it
  opens, which fences the older one: the zombie's next flush or checkpoint raises
  :class:`FencedError`.
* Task checkpoints are records keyed ``<job>/<partition>`` in one compacted topic
  (``checkpoint.topic``), written in their own transaction by the same producer.
* Offsets are Kafka offsets and may have gaps (transaction markers, compaction). Reads
  stop at the requested offset and detect the end of a partition with partition EOF;
  the high watermark is never trusted for correctness, and correctness never depends
  on aborted transactional records being hidden (some brokers show them).

Production needs a real Kafka cluster; the ``tansu`` broker used by the tests keeps
data in memory only and does not compact.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from typing import Any, TypeVar

from localstate.checkpoint import Checkpoint
from localstate.engine import ChangeRecord
from localstate.errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    FencedError,
    StoreLockedError,
)
from localstate.faults import fault_point
from localstate.options import coerce

from .base import ChangelogPartition, ChangelogSystem, CheckpointStore, CurrentFn

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'"
    ) from _e

__all__ = ["KafkaChangelogSystem", "KafkaChangelogPartition", "KafkaCheckpointStore", "KafkaSettings"]

log = logging.getLogger("localstate.changelog.kafka")
_client_log = logging.getLogger("localstate.changelog.kafka.client")

T = TypeVar("T")

_FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
_PRODUCER_FIXED = {
    "enable.idempotence": "true",
    "acks": "all",
    "transactional.id": None,
}
_CONSUMER_FIXED = {"enable.auto.commit": "false", "enable.partition.eof": "true"}
_POLL_S = 0.2
_CONSUME_BATCH = 2000


@dataclass(frozen=True)
class KafkaSettings:
    """The parsed ``systems.<name>.*`` keys of a Kafka changelog system."""

    name: str
    bootstrap_servers: str
    replication_factor: int = -1
    delete_retention_ms: int = 24 * 3600 * 1000
    checkpoint_topic: str = "localstate-checkpoints"
    timeout_ms: int = 30_000
    retries: int = 3
    retry_backoff_ms: int = 500
    producer: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)
    topic: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, name: str, options: Mapping[str, Any]) -> KafkaSettings:
        """Validate ``options``; :class:`ConfigError` names ``systems.<name>.<key>``."""
        pre = f"systems.{name}"
        servers = str(options.get("bootstrap.servers", "")).strip()
        if not servers:
            raise ConfigError(
                f"{pre}.bootstrap.servers is required for the kafka changelog "
                f"(e.g. {pre}.bootstrap.servers = 127.0.0.1:9092)"
            )

        def num(key: str, default: int, low: int) -> int:
            value = coerce(options.get(key, default), int, f"{pre}.{key}")
            if value < low:
                raise ConfigError(f"{pre}.{key} = {value}: must be >= {low}")
            return value

        rf = num("replication.factor", -1, -1)
        if rf == 0:
            raise ConfigError(f"{pre}.replication.factor = 0: use -1 (broker default) or >= 1")
        ckpt_topic = str(options.get("checkpoint.topic", cls.checkpoint_topic)).strip()
        if not ckpt_topic:
            raise ConfigError(f"{pre}.checkpoint.topic must not be empty")
        sub: dict[str, dict[str, str]] = {"producer": {}, "consumer": {}, "topic": {}}
        for key, value in options.items():
            head, dot, rest = key.partition(".")
            if dot and head in sub:
                sub[head][rest] = _client_value(value)
        for key, fixed in _PRODUCER_FIXED.items():
            given = sub["producer"].get(key)
            if given is not None and (fixed is None or given.lower() not in (fixed, "-1" if key == "acks" else fixed)):
                raise ConfigError(
                    f"{pre}.producer.{key} = {given!r}: localstate sets {key} itself "
                    "(idempotent, acks=all, one transactional id per task); remove the key"
                )
        for key, fixed in _CONSUMER_FIXED.items():
            given = sub["consumer"].get(key)
            if given is not None and given.lower() != fixed:
                raise ConfigError(f"{pre}.consumer.{key} = {given!r}: must be {fixed} (restore needs it); remove the key")
        if "cleanup.policy" in sub["topic"] and sub["topic"]["cleanup.policy"] != "compact":
            raise ConfigError(
                f"{pre}.topic.cleanup.policy = {sub['topic']['cleanup.policy']!r}: changelog topics must be "
                "'compact' (deletion by time or size would lose committed state)"
            )
        return cls(
            name=name,
            bootstrap_servers=servers,
            replication_factor=rf,
            delete_retention_ms=num("delete.retention.ms", cls.delete_retention_ms, 0),
            checkpoint_topic=ckpt_topic,
            timeout_ms=num("timeout.ms", cls.timeout_ms, 100),
            retries=num("retries", cls.retries, 0),
            retry_backoff_ms=num("retry.backoff.ms", cls.retry_backoff_ms, 0),
            producer=sub["producer"],
            consumer=sub["consumer"],
            topic=sub["topic"],
        )


def _client_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_fenced(err: Any) -> bool:
    return isinstance(err, KafkaError) and err.code() in _FENCED_CODES


class _TaskWriter:
    """The transactional producer of one task partition (shared by its stores and its
    checkpoint). A transaction is open from the first produce until :meth:`commit`."""

    def __init__(self, system: KafkaChangelogSystem, job: str, partition: int) -> None:
        s = system.settings
        self.system = system
        self.transactional_id = f"localstate.{job}.{s.name}.{partition}"
        conf: dict[str, Any] = {
            "bootstrap.servers": s.bootstrap_servers,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "transaction.timeout.ms": max(60_000, s.timeout_ms * (s.retries + 2)),
            "message.timeout.ms": s.timeout_ms * (s.retries + 1),
            "socket.connection.setup.timeout.ms": _connect_timeout_ms(s),
            "logger": _client_log,
        }
        conf.update(s.producer)
        conf.update({"enable.idempotence": True, "acks": "all", "transactional.id": self.transactional_id})
        self.producer = Producer(conf)
        self.in_txn = False
        self.failed: BaseException | None = None
        what = f"transactional producer {self.transactional_id!r}"
        system.with_retries(what, lambda: self.producer.init_transactions(s.timeout_ms / 1000))

    def check(self) -> None:
        if self.failed is not None:
            raise ChangelogError(
                f"kafka producer {self.transactional_id!r} failed earlier ({self.failed}); "
                "close the task and open it again (it restores the last commit)"
            ) from self.failed

    def begin(self) -> None:
        self.check()
        if not self.in_txn:
            try:
                self.producer.begin_transaction()
            except KafkaException as e:
                raise self.fail(e.args[0], "begin a transaction") from e
            self.in_txn = True

    def make_room(self, topic: str) -> None:
        """Serve acknowledgements until the local queue is half as full, bounded by the timeout."""
        s = self.system.settings
        target = len(self.producer) // 2
        deadline = time.monotonic() + s.timeout_ms / 1000 * (s.retries + 1)
        while time.monotonic() < deadline:
            self.producer.poll(0.05)
            if len(self.producer) <= target:
                return
        raise self.fail(KafkaError(KafkaError._QUEUE_FULL), f"produce to topic {topic!r} (no acknowledgements)")

    def commit(self, topics: str) -> None:
        """Commit the open transaction: every record acknowledged, or raise."""
        self.check()
        if not self.in_txn:
            return
        s = self.system.settings
        attempts = s.retries + 1
        for attempt in range(attempts):
            try:
                self.producer.commit_transaction(s.timeout_ms / 1000)
                self.in_txn = False
                return
            except KafkaException as e:
                err = e.args[0]
                if err.retriable() and attempt + 1 < attempts:
                    log.warning(
                        "commit of %s to %s failed (%s); retry %d/%d",
                        self.transactional_id, topics, err, attempt + 1, s.retries,
                    )
                    time.sleep(s.retry_backoff_ms * (2**attempt) / 1000)
                    continue
                raise self.fail(err, f"commit the writes to {topics}") from e

    def fail(self, err: Any, what: str) -> ChangelogError:
        """Mark the producer unusable and build the error to raise."""
        servers = self.system.settings.bootstrap_servers
        if _is_fenced(err):
            exc: ChangelogError = FencedError(
                f"kafka producer {self.transactional_id!r} was fenced by a newer instance of the same task "
                f"while trying to {what} (brokers {servers}); this instance must stop without committing"
            )
        else:
            exc = ChangelogError(
                f"kafka changelog could not {what} on brokers {servers} "
                f"after {self.system.settings.retries + 1} attempt(s): {err}. Check that the brokers are "
                "reachable; nothing from this commit counts as committed"
            )
        self.failed = exc
        if self.in_txn and isinstance(err, KafkaError) and err.txn_requires_abort():
            try:
                self.producer.abort_transaction(min(5.0, self.system.settings.timeout_ms / 1000))
            except KafkaException:
                pass
            self.in_txn = False
        return exc

    def close(self) -> None:
        """Abort an open transaction (best effort, bounded) and drop the producer."""
        if self.in_txn and self.failed is None:
            try:
                self.producer.abort_transaction(min(5.0, self.system.settings.timeout_ms / 1000))
            except KafkaException as e:
                log.warning("aborting the open transaction of %s failed: %s", self.transactional_id, e)
        self.in_txn = False
        self.producer.purge()
        self.producer.flush(0)


class KafkaChangelogPartition(ChangelogPartition):
    """One partition of a changelog topic, written through the task's transactional producer."""

    def __init__(self, system: KafkaChangelogSystem, writer: _TaskWriter, stream: str, partition: int) -> None:
        self.system = system
        self.stream = stream
        self.partition = partition
        self._writer = writer
        self._consumer: Any = None
        self._acked = -1  # highest acknowledged offset of this partition
        self._delivery_error: Any = None
        self._end: int | None = None
        self._unflushed = False
        self._closed = False

    @property
    def where(self) -> str:
        return f"kafka topic {self.stream!r} partition {self.partition} (brokers {self.system.settings.bootstrap_servers})"

    def _check_open(self) -> None:
        if self._closed:
            raise ChangelogError(f"{self.where} is closed")

    # -- writing ---------------------------------------------------------------------------
    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_error = err
        else:
            off = msg.offset()
            if off > self._acked:
                self._acked = off

    def append(self, records: list[ChangeRecord]) -> None:
        if not records:
            return
        self._check_open()
        fault_point("changelog.append")
        writer = self._writer
        writer.begin()
        self._unflushed = True
        produce = writer.producer.produce
        topic, part = self.stream, self.partition
        try:
            for key, value in islice(records, len(records) - 1):
                try:
                    produce(topic, value, key, part)
                except BufferError:
                    writer.make_room(topic)
                    produce(topic, value, key, part)
            key, value = records[-1]
            try:
                produce(topic, value, key, part, on_delivery=self._delivered)
            except BufferError:
                writer.make_room(topic)
                produce(topic, value, key, part, on_delivery=self._delivered)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write to {self.where}") from e
        except TypeError as e:
            raise ChangelogError(f"{self.where}: records must be (bytes, bytes | None) pairs: {e}") from e
        writer.producer.poll(0)

    def flush(self) -> int:
        """Commit the task's open transaction (every record acknowledged) and return
        this partition's end offset: the last acknowledged offset + 1."""
        self._check_open()
        if self._unflushed:
            self._writer.commit(f"topic {self.stream!r} partition {self.partition}")
            self._writer.producer.poll(0)
            if self._delivery_error is not None:
                raise self._writer.fail(self._delivery_error, f"write to {self.where}")
            self._unflushed = False
            self._end = max(self._end or 0, self._acked + 1)
        return self.end_offset()

    def end_offset(self) -> int:
        """The end of the partition as last seen: after a flush, the last acknowledged
        offset + 1; before any write, found by reading the last batch to partition EOF."""
        self._check_open()
        if self._end is None:
            self._end = self._find_end()
        return self._end

    # -- reading ---------------------------------------------------------------------------
    def _consumer_for(self, start: int) -> Any:
        if self._consumer is None:
            self._consumer = self.system.new_consumer()
        self._consumer.assign([TopicPartition(self.stream, self.partition, start)])
        return self._consumer

    def _find_end(self) -> int:
        """Read from just below the reported high watermark to EOF: tansu reports the last
        batch's base offset + 1, Kafka the exact end; both are covered."""
        s = self.system
        probe = s.new_consumer() if self._consumer is None else self._consumer
        self._consumer = probe
        low, high = s.with_retries(
            f"read the offsets of {self.where}",
            lambda: probe.get_watermark_offsets(TopicPartition(self.stream, self.partition), s.timeout_s),
        )
        end = high
        for records_offsets in self._scan(max(low, high - 1), None):
            end = max(end, records_offsets[1] + 1)
        return end

    def _scan(self, start: int, stop: int | None) -> Iterator[tuple[list[Any], int]]:
        """``(messages, last_offset)`` batches with offsets in ``[start, stop)`` (to EOF if
        ``stop`` is None). Partition EOF ends the scan: the high watermark is never used."""
        consumer = self._consumer_for(start)
        s = self.system.settings
        idle_limit = s.timeout_ms / 1000 * (s.retries + 1)
        idle_since = time.monotonic()
        last = start - 1
        try:
            while True:
                msgs = _next_batch(consumer)
                if not msgs:
                    now = time.monotonic()
                    if now - idle_since > idle_limit:
                        raise ChangelogError(
                            f"reading {self.where} from offset {last + 1}: no answer from the brokers "
                            f"for {idle_limit:.0f}s"
                        )
                    continue
                idle_since = time.monotonic()
                tail = msgs[-1]
                if tail.error() is None and (stop is None or tail.offset() < stop) and not any(
                    m.error() is not None for m in msgs
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
                            done = True
                            break
                        raise ChangelogError(f"reading {self.where} at offset {last + 1} failed: {err}")
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

    def read_batches(self, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        """Records with offsets in ``[start, stop)``: the scan ends at the first record at or
        past ``stop`` or at partition EOF, whichever comes first (like the file log, a
        range past the end yields what exists; :meth:`discard_tail` reports committed
        records that are missing). A broker that does not answer within the bounded
        wait raises :class:`ChangelogError`."""
        self._check_open()
        if start >= stop:
            return
        key_of = itemgetter(0)
        for msgs, _ in self._scan(start, stop):
            records = [(m.key(), m.value()) for m in msgs]
            nbytes = sum(map(len, msgs)) + sum(map(len, map(key_of, records)))
            yield records, nbytes  # type: ignore[misc]

    def min_valid_snapshot_offset(self) -> int:
        """The first offset written within the topic's ``delete.retention.ms``.

        Compaction may drop a tombstone once it is older than that, so a local snapshot
        below this offset could miss a delete; at or above it, every tombstone the
        replay needs is still in the log (a tombstone cannot be dropped before it is
        ``delete.retention.ms`` old). If every record is older, the end of the records.
        """
        self._check_open()
        retention = self.system.retention_ms.get(self.stream, self.system.settings.delete_retention_ms)
        horizon_ms = int(time.time() * 1000) - retention
        s = self.system
        probe = self._consumer if self._consumer is not None else s.new_consumer()
        self._consumer = probe
        tp = TopicPartition(self.stream, self.partition, horizon_ms)
        found = s.with_retries(
            f"look up offsets by time in {self.where}", lambda: probe.offsets_for_times([tp], s.timeout_s)
        )[0]
        if found.error is not None:
            raise ChangelogError(f"looking up offsets by time in {self.where} failed: {found.error}")
        if found.offset < 0:
            return self._records_end()
        # Verify the answer (tansu answers offset 0 for any time): the first record with
        # a timestamp at or after the horizon, scanning on only when the answer was wrong.
        for msgs, _ in self._scan(int(found.offset), None):
            for m in msgs:
                if m.timestamp()[1] >= horizon_ms:
                    return int(m.offset())
        return self._records_end()

    def _records_end(self) -> int:
        """Offset after the last record (a trailing transaction marker not counted)."""
        s = self.system
        probe = self._consumer if self._consumer is not None else s.new_consumer()
        self._consumer = probe
        low, high = s.with_retries(
            f"read the offsets of {self.where}",
            lambda: probe.get_watermark_offsets(TopicPartition(self.stream, self.partition), s.timeout_s),
        )
        end = low
        for _, last in self._scan(max(low, high - 2), None):
            end = max(end, last + 1)
        return end

    # -- tail ------------------------------------------------------------------------------
    def discard_tail(self, committed_offset: int, current: CurrentFn) -> None:
        """Re-write, for every key in ``[committed_offset, end)``, its committed record.

        Reads the tail to partition EOF, asks ``current(keys)`` for the restored
        records, appends them and flushes — so a later full restore (which stops at a
        later commit) and broker-side compaction both yield the committed state.
        """
        self._check_open()
        c = committed_offset
        end = self._find_end()
        if c > end:
            raise CorruptionError(
                f"{self.where} ends at offset {end}, but the task checkpoint says offset {c} was committed: "
                "committed records are missing (topic deleted or recreated, or the broker lost its data). "
                "Nothing was changed. Restore the topic; or keep what is left with `localstate restore "
                "--accept-log-end STORE`, or give up the store's state with `localstate restore --reset STORE`."
            )
        self._end = end
        if c >= end:
            return
        keys: dict[bytes, None] = {}
        for msgs, last in self._scan(c, None):
            keys.update(dict.fromkeys(m.key() for m in msgs))
            self._end = max(self._end, last + 1)
        if not keys:
            return
        records = list(current(list(keys)))
        self.append(records)
        self.flush()
        log.info(
            "%s: trimmed the uncommitted tail [%d, %d): re-wrote the committed record of %d key(s)",
            self.where, c, end, len(records),
        )

    def describe(self) -> str:
        return self.where

    def verify(self) -> dict[str, Any]:
        """Read every record of the partition back (the broker checks batch CRCs) and
        return the end offset and the bytes read."""
        self._check_open()
        end = self._find_end()
        batches = nbytes = 0
        if end:
            for msgs, _ in self._scan(0, None):
                batches += 1
                nbytes += sum(len(m) for m in msgs)
        return {"end_offset": end, "batches": batches, "bytes": nbytes, "problems": []}

    def reset(self) -> int:
        """A tombstone for every key the partition holds (a broker cannot be told to
        drop records here): a full restore then ends empty, and compaction drops it all."""
        self._check_open()
        end = self._find_end()
        keys: dict[bytes, None] = {}
        if end:
            for msgs, _ in self._scan(0, None):
                keys.update(dict.fromkeys(m.key() for m in msgs))
        if keys:
            self.append([(k, None) for k in keys])
            self.flush()
        return self.end_offset()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()
        self.system._release(self.stream, self.partition)


class KafkaCheckpointStore(CheckpointStore):
    """Task checkpoints as records keyed ``<job>/<partition>`` in a compacted topic.

    :meth:`read` also fences older instances of the task (it opens the task's
    transactional producer), so a zombie can no longer commit once a new instance
    has read the checkpoint it restores from.
    """

    def __init__(self, system: KafkaChangelogSystem) -> None:
        self.system = system
        self.topic = system.settings.checkpoint_topic

    def _key(self, job: str, partition: int) -> bytes:
        return f"{job}/{partition}".encode()

    def read(self, job: str, partition: int, *, fence: bool = True) -> Checkpoint | None:
        """The latest checkpoint of the task (``fence=False`` for read-only tools)."""
        s = self.system
        if fence:
            s.writer(job, partition)
        s.ensure_topic(self.topic, 1, checkpoint=True)
        key = self._key(job, partition)
        settings = s.settings
        deadline = time.monotonic() + settings.timeout_ms / 1000 * (settings.retries + 1)
        while True:
            found, end = self._scan(key)
            # A read_committed reader ends at the last stable offset: an open transaction
            # on this shared topic (another task inside its checkpoint transaction, or one
            # killed there that has not restarted yet) hides every later checkpoint, this
            # task's included. Reading on from a stale view would restore an older commit.
            if not self._hidden_after(end):
                break
            if time.monotonic() > deadline:
                raise ChangelogError(
                    f"checkpoint of {job}/partition {partition}: kafka topic {self.topic!r} has an open "
                    f"transaction at offset {end} that hides newer checkpoints (a task died inside its "
                    "checkpoint transaction and has not restarted). Restart that task, or wait for the "
                    "broker to abort it (transaction.timeout.ms), then open this task again"
                )
            time.sleep(0.2)
        if not found or found[-1] is None:
            return None
        where = f"checkpoint of {job}/partition {partition} in kafka topic {self.topic!r}"
        try:
            return Checkpoint.from_bytes(found[-1], where=where)
        except CorruptionError as e:
            # No silent fall-back to the record before: the broker compacts the changelog,
            # so the older commit may no longer be reconstructible (it could describe a
            # state that never existed).
            raise CorruptionError(
                f"{e}. Nothing was changed. Rebuild the task from a backup of the topics, or give up its "
                f"state explicitly with `localstate restore --reset STORE` for each store"
            ) from e

    def _scan(self, key: bytes) -> tuple[list[bytes], int]:
        """The last two committed values of ``key`` and the offset where the read ended."""
        s = self.system
        found: list[bytes] = []
        end: list[int] = []
        consumer = s.new_consumer()
        try:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
            for msgs in _drain_to_eof(consumer, s, f"checkpoint topic {self.topic!r}", end):
                for m in msgs:
                    if m.key() == key:
                        found.append(m.value())
                        del found[:-2]
        finally:
            consumer.close()
        return found, end[0] if end else 0

    def _hidden_after(self, offset: int) -> bool:
        """Whether the topic holds records at or after ``offset`` that a read_committed
        reader did not get (records of a transaction still open)."""
        s = self.system
        consumer = s.new_consumer(isolation="read_uncommitted")
        try:
            consumer.assign([TopicPartition(self.topic, 0, offset)])
            for msgs in _drain_to_eof(consumer, s, f"checkpoint topic {self.topic!r}"):
                if any(m.offset() >= offset for m in msgs):
                    return True
            return False
        finally:
            consumer.close()

    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        s = self.system
        s.ensure_topic(self.topic, 1, checkpoint=True)
        writer = s.writer(job, partition)
        writer.begin()
        try:
            writer.producer.produce(self.topic, checkpoint.to_bytes(), self._key(job, partition), 0)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write the checkpoint to topic {self.topic!r}") from e
        fault_point("checkpoint.before_rename")
        writer.commit(f"checkpoint topic {self.topic!r}")
        fault_point("checkpoint.after_rename")


def _connect_timeout_ms(settings: KafkaSettings) -> int:
    """``socket.connection.setup.timeout.ms`` for ``timeout.ms``: at most 10 s, and at
    least librdkafka's minimum of 1 s (a smaller value makes the client refuse to start)."""
    return max(1_000, min(10_000, settings.timeout_ms))


def _next_batch(consumer: Any) -> list[Any]:
    """What is queued (up to a batch) at once; else wait up to ``_POLL_S`` for one event.

    ``consume(n, timeout)`` would wait the whole timeout unless ``n`` events arrive,
    which costs a timeout at the end of every short read."""
    msgs = consumer.consume(_CONSUME_BATCH, 0)
    if msgs:
        return msgs
    first = consumer.poll(_POLL_S)
    if first is None:
        return []
    return [first, *consumer.consume(_CONSUME_BATCH - 1, 0)]


def _drain_to_eof(
    consumer: Any, system: KafkaChangelogSystem, what: str, end: list[int] | None = None
) -> Iterator[list[Any]]:
    """Batches of records until partition EOF (one assigned partition), bounded wait;
    the offset of the EOF (where the fetch ended) is appended to ``end`` if given."""
    s = system.settings
    idle_limit = s.timeout_ms / 1000 * (s.retries + 1)
    idle_since = time.monotonic()
    while True:
        msgs = _next_batch(consumer)
        if not msgs:
            if time.monotonic() - idle_since > idle_limit:
                raise ChangelogError(f"reading {what} on brokers {s.bootstrap_servers}: no answer for {idle_limit:.0f}s")
            continue
        idle_since = time.monotonic()
        good = []
        for m in msgs:
            err = m.error()
            if err is None:
                good.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                if end is not None:
                    end.append(m.offset())
                yield good
                return
            else:
                raise ChangelogError(f"reading {what} on brokers {s.bootstrap_servers} failed: {err}")
        yield good


class KafkaChangelogSystem(ChangelogSystem):
    """Changelog streams as compacted Kafka topics; checkpoints in a compacted topic too."""

    options_keys = (
        "bootstrap.servers",
        "replication.factor",
        "delete.retention.ms",
        "checkpoint.topic",
        "timeout.ms",
        "retries",
        "retry.backoff.ms",
        "producer.*",
        "consumer.*",
        "topic.*",
    )

    @classmethod
    def validate_options(cls, name: str, options: Mapping[str, Any]) -> None:
        KafkaSettings.parse(name, options)

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings = KafkaSettings.parse(name, options)
        self.timeout_s = self.settings.timeout_ms / 1000
        self._admin: Any = None
        self._topics: dict[str, int] = {}
        self.retention_ms: dict[str, int] = {}
        """Per checked topic: its ``delete.retention.ms`` (tombstones older may be compacted away)."""
        self._writers: dict[tuple[str, int], _TaskWriter] = {}
        self._open: set[tuple[str, int]] = set()
        self._checkpoints = KafkaCheckpointStore(self)
        self._closed = False

    def describe(self) -> str:
        return f"kafka changelog on brokers {self.settings.bootstrap_servers}"

    # -- clients -----------------------------------------------------------------------------
    def with_retries(self, what: str, op: Callable[[], T]) -> T:
        """Run ``op``; retry retriable Kafka errors with exponential backoff, then raise
        :class:`ChangelogError` naming the brokers (:class:`FencedError` if fenced)."""
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                return op()
            except KafkaException as e:
                err = e.args[0] if e.args else e
                if _is_fenced(err):
                    raise FencedError(
                        f"{what}: fenced by a newer instance of the same task (brokers {s.bootstrap_servers})"
                    ) from e
                retriable = not isinstance(err, KafkaError) or err.retriable() or err.code() in (
                    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                )
                if not retriable or attempt == s.retries:
                    raise ChangelogError(
                        f"kafka: could not {what} on brokers {s.bootstrap_servers} after {attempt + 1} "
                        f"attempt(s): {err}. Check that the brokers are reachable and the settings under "
                        f"systems.{s.name}.*"
                    ) from e
                log.warning("kafka: %s failed (%s); retry %d/%d", what, err, attempt + 1, s.retries)
                time.sleep(s.retry_backoff_ms * (2**attempt) / 1000)
        raise AssertionError("unreachable")

    def admin(self) -> Any:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self.settings.bootstrap_servers, "logger": _client_log,
                 "socket.connection.setup.timeout.ms": _connect_timeout_ms(self.settings)}
            )
        return self._admin

    def new_consumer(self, isolation: str = "read_committed") -> Any:
        """A consumer tuned for restore (assign-only; never joins a group or commits)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.settings.bootstrap_servers,
            "group.id": f"localstate-restore-{self.job}",
            "isolation.level": isolation,
            "fetch.queue.backoff.ms": 10,
            # the end is found by partition EOF, which needs an empty fetch: do not let the
            # broker hold it for the default 500 ms
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",
            "logger": _client_log,
        }
        conf.update(self.settings.consumer)
        conf.update({"enable.auto.commit": False, "enable.partition.eof": True})
        if isolation != "read_committed":
            conf["isolation.level"] = isolation
        return Consumer(conf)

    def writer(self, job: str, partition: int) -> _TaskWriter:
        """The task's transactional producer; creating it fences older instances."""
        self._check_open()
        w = self._writers.get((job, partition))
        if w is None:
            w = self._writers[(job, partition)] = _TaskWriter(self, job, partition)
        return w

    def _check_open(self) -> None:
        if self._closed:
            raise ChangelogError(f"{self.describe()} is closed")

    # -- topics ------------------------------------------------------------------------------
    def ensure_topic(self, topic: str, partitions: int, *, checkpoint: bool = False) -> None:
        """Create ``topic`` (compacted, ``partitions``) if missing; refuse a mismatching one."""
        if self._topics.get(topic) == partitions:
            return
        s = self.settings
        admin = self.admin()
        # all topics: a metadata request naming the topic may auto-create it with the
        # broker's default partition count
        md = self.with_retries(f"list topic {topic!r}", lambda: admin.list_topics(timeout=self.timeout_s))
        tmd = md.topics.get(topic)
        exists = tmd is not None and tmd.error is None and tmd.partitions
        if not exists:
            config = {"cleanup.policy": "compact", "delete.retention.ms": str(s.delete_retention_ms)}
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
            md = self.with_retries(f"list topic {topic!r}", lambda: admin.list_topics(timeout=self.timeout_s))
            tmd = md.topics.get(topic)
        have = len(tmd.partitions) if tmd is not None else 0
        what = "checkpoint topic" if checkpoint else "changelog topic"
        if have != partitions:
            fix = (
                f"use a new topic in systems.{s.name}.checkpoint.topic"
                if checkpoint
                else "set job.partitions back, or point the store at a new changelog topic"
            )
            raise ChangelogError(
                f"kafka {what} {topic!r} on brokers {s.bootstrap_servers} has {have} partition(s) but "
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
                f"kafka {what} {topic!r} on brokers {s.bootstrap_servers} has cleanup.policy={policy}, but "
                "it must be 'compact' (deletion by time or size loses committed state). Alter the topic "
                f"(kafka-configs --alter --add-config cleanup.policy=compact --topic {topic}) or use a new topic"
            )
        retention = configs.get("delete.retention.ms")
        try:
            self.retention_ms[topic] = int(retention.value) if retention is not None else s.delete_retention_ms
        except (TypeError, ValueError):
            self.retention_ms[topic] = s.delete_retention_ms
        self._topics[topic] = partitions

    # -- the ChangelogSystem interface ------------------------------------------------------
    def topic_exists(self, topic: str) -> bool:
        admin = self.admin()
        md = self.with_retries(f"list topic {topic!r}", lambda: admin.list_topics(timeout=self.timeout_s))
        tmd = md.topics.get(topic)
        return bool(tmd is not None and tmd.error is None and tmd.partitions)

    def open_partition(
        self, stream: str, partition: int, partitions: int, *, readonly: bool = False
    ) -> KafkaChangelogPartition:
        """Open for writing (fences older instances of the task); ``readonly=True`` opens
        a reader only — no producer, no topic created, safe beside a live task."""
        self._check_open()
        if not 0 <= partition < partitions:
            raise ConfigError(f"partition {partition} is out of range for job.partitions = {partitions}")
        if readonly:
            return KafkaChangelogPartition(self, None, stream, partition)  # type: ignore[arg-type]
        if (stream, partition) in self._open:
            raise StoreLockedError(
                f"kafka topic {stream!r} partition {partition} is already open for writing in this task"
            )
        self.ensure_topic(stream, partitions)
        writer = self.writer(self.job, partition)
        self._open.add((stream, partition))
        return KafkaChangelogPartition(self, writer, stream, partition)

    def _release(self, stream: str, partition: int) -> None:
        self._open.discard((stream, partition))

    def checkpoints(self) -> KafkaCheckpointStore:
        return self._checkpoints

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._writers.values():
            w.close()
        self._writers.clear()
