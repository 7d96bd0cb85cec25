"""``kafka``: the changelog and the task checkpoints in Kafka topics (confluent-kafka).

Configuration: ``systems.<name>.*`` keys, see
:class:`~localstate.changelog.kafka.client.KafkaSettings`; ``stores.<s>.changelog =
kafka.<topic>`` puts a store's changelog in the topic ``<topic>``.

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
  (``checkpoint.topic``), written by the same producer. A task commit is **one
  transaction**: its stores' flushes only wait for their records to be acknowledged, and
  the checkpoint record commits them with it (:meth:`KafkaCheckpointStore.committing`).
  A commit killed before that point leaves an open transaction that the next instance's
  ``init_transactions`` aborts; a flush outside a task commit (the tail trim, a reset, a
  rescale) commits on its own.
* After ``localstate rescale`` the job's state is in a new generation of topics,
  ``<topic>.gen<n>`` with the new partition count (a topic's partitions cannot shrink,
  and growing them would move keys), and its checkpoints are keyed ``<job>.gen<n>/<p>``;
  the record ``<job>/generation`` in the checkpoint topic says which (``Generation``).
* Offsets are Kafka offsets and may have gaps (transaction markers, compaction). Reads
  stop at the requested offset and detect the end of a partition with partition EOF;
  the high watermark is never trusted for correctness, and correctness never depends
  on aborted transactional records being hidden (some brokers show them).

Production needs a real Kafka cluster; the tests run on the ``tansu`` broker (data in
memory only, no compaction) and on Apache Kafka (``localstate.testing.apache_kafka``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import length_hint
from typing import Any

from localstate.errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    FencedError,
    StoreLockedError,
)
from localstate.faults import fault_point
from localstate.records import ChangeRecord

from ..base import ChangelogPartition, ChangelogSystem, CurrentFn, Generation
from ..snapshots import RemoteSnapshots, instance_epoch, snapshot_store
from .checkpoints import KafkaCheckpointStore
from .client import (
    CONNECT_FAST,
    KafkaClient,
    KafkaSettings,
    client_log,
    connect_timeout_ms,
    is_fenced,
)

try:
    from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'"
    ) from _e

__all__ = ["KafkaChangelogSystem", "KafkaChangelogPartition", "KafkaCheckpointStore", "KafkaSettings"]

log = logging.getLogger("localstate.changelog.kafka")


def _raised_error(e: BaseException) -> Any:
    """The ``KafkaError`` behind an exception a confluent-kafka call raised (itself, or
    the cause or context of the ``SystemError`` it wraps a callback's error in)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, KafkaException):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


class _TaskWriter:
    """The transactional producer of one task partition (shared by its stores and its
    checkpoint). A transaction is open from the first produce until :meth:`commit`."""

    def __init__(self, system: KafkaChangelogSystem, job: str, partition: int) -> None:
        s = system.settings
        self.system = system
        self.transactional_id = f"localstate.{job}.{system.name}.{partition}"
        conf: dict[str, Any] = {
            "bootstrap.servers": s.bootstrap_servers,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "transaction.timeout.ms": max(60_000, s.timeout_ms * (s.retries + 2)),
            "message.timeout.ms": s.timeout_ms * (s.retries + 1),
            "socket.connection.setup.timeout.ms": connect_timeout_ms(s),
            "logger": client_log,
            **CONNECT_FAST,
        }
        conf.update(s.producer)
        conf.update({"enable.idempotence": True, "acks": "all", "transactional.id": self.transactional_id,
                     "error_cb": self._client_error})
        self.fatal_error: Any = None
        self.producer = Producer(conf)
        self.in_txn = False
        self.commit_deferred = False
        """Inside a task commit whose checkpoint this producer writes
        (:meth:`KafkaCheckpointStore.committing`): a changelog flush waits for its records'
        acknowledgements and leaves the transaction open, and the checkpoint write commits
        data and checkpoint together (one transaction, one commit round trip)."""
        self.failed: BaseException | None = None
        what = f"transactional producer {self.transactional_id!r}"
        # A metadata request first brings a broker connection up, so the producer-id request
        # of init_transactions never waits out librdkafka's 500 ms "no broker available" retry
        # timer (measured on tansu: 8 of 40 inits of a new id took 0.5 s; 0 of 40 after this).
        system.client.with_retries(what, lambda: self.producer.list_topics(timeout=s.timeout_ms / 1000))
        system.client.with_retries(what, lambda: self.producer.init_transactions(s.timeout_ms / 1000))

    def _client_error(self, err: Any) -> None:
        """librdkafka's error callback. A fatal error (fenced by a newer instance, ...) is
        kept for the waiting call to raise: without this callback confluent-kafka raises it
        from inside ``flush()`` while serving delivery callbacks, which surfaces as a
        ``SystemError``. Other errors are transient and retried by librdkafka."""
        if err.fatal():
            self.fatal_error = err
        else:
            log.debug("kafka producer %r: %s", self.transactional_id, err)

    def _txn_error(self) -> Any:
        """After a call failed without saying why (confluent-kafka can lose a fatal error
        while serving callbacks): abort the open transaction, which reports the
        producer's fatal error if it has one (fenced, ...)."""
        try:
            self.producer.abort_transaction(min(5.0, self.system.settings.timeout_ms / 1000))
            self.in_txn = False
        except KafkaException as e:
            return e.args[0]
        return KafkaError(KafkaError._FATAL, "the producer failed without an error (aborted its transaction)")

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

    def await_acks(self, topics: str) -> None:
        """Wait until every record produced so far is acknowledged (the transaction stays
        open), bounded by the timeout; delivery errors reach the partitions' callbacks."""
        self.check()
        s = self.system.settings
        what = f"get the writes to {topics} acknowledged"
        try:
            left = self.producer.flush(s.timeout_ms / 1000 * (s.retries + 1))
        except (KafkaException, SystemError) as e:
            # confluent-kafka raises a fatal error (fenced by a newer instance, ...) from
            # inside flush() while it serves a delivery callback: a SystemError caused by it
            raise self.fail(self.fatal_error or _raised_error(e) or self._txn_error(), what) from e
        if self.fatal_error is not None:
            raise self.fail(self.fatal_error, what)
        if left > 0:
            raise self.fail(KafkaError(KafkaError._TIMED_OUT), what)

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
        if is_fenced(err):
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

    def abandon(self, exc: ChangelogError) -> ChangelogError:
        """Mark the producer unusable after a batch was cut short by a bad record (the
        records before it are already in the open transaction) and abort that
        transaction, so that no part of the batch can be committed by a later flush."""
        self.failed = exc
        if self.in_txn:
            try:
                self.producer.abort_transaction(min(5.0, self.system.settings.timeout_ms / 1000))
            except KafkaException as e:
                log.warning("aborting the open transaction of %s failed: %s", self.transactional_id, e)
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
        self.logical_stream = stream
        self.stream = system.generation().stream(stream)
        self.partition = partition
        self._writer = writer
        self._consumer: Any = None
        self._acked = -1  # highest acknowledged offset of this partition
        self._delivery_error: Any = None
        self._end: int | None = None
        self._unflushed = False
        self._closed = False
        self._shipped: RemoteSnapshots | None = None

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
        if records:
            self._produce(iter(records), len(records))

    def append_columns(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """As :meth:`append` of the pairs, without a tuple per record: ``zip`` hands the
        loop one reused tuple (one message per record either way)."""
        if len(keys) != len(values):
            super().append_columns(keys, values)  # raises, naming the partition
        if keys:
            self._produce_columns(keys if type(keys) is list else list(keys),
                                  values if type(values) is list else list(values))

    def _produce_columns(self, keys: list[bytes], values: list[bytes | None]) -> None:
        """:meth:`_produce` of two columns, the loop in C (``map`` calls ``produce`` per
        record, no Python bytecode per record). On a full local queue the record that did
        not fit is the one the value iterator stopped after: room is made and the loop
        goes on from that record, so every record is produced once, in order."""
        self._check_open()
        fault_point("changelog.append")
        writer = self._writer
        writer.begin()
        self._unflushed = True
        produce = writer.producer.produce
        topic, part = self.stream, self.partition
        last = len(keys) - 1
        done = 0
        try:
            while done < last:
                vi, ki = iter(values), iter(keys)
                if done:  # move both iterators to the record that did not fit
                    next(islice(vi, done, done), None)
                    next(islice(ki, done, done), None)
                try:
                    deque(map(produce, repeat(topic, last - done), vi, ki, repeat(part)), 0)
                    done = last
                except BufferError:
                    done = len(values) - length_hint(vi) - 1
                    writer.make_room(topic)
            try:
                produce(topic, values[last], keys[last], part, on_delivery=self._delivered)
            except BufferError:
                writer.make_room(topic)
                produce(topic, values[last], keys[last], part, on_delivery=self._delivered)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write to {self.where}") from e
        except (TypeError, ValueError) as e:
            raise writer.abandon(self._bad_records(e)) from e
        writer.producer.poll(0)

    def _bad_records(self, e: Exception) -> ChangelogError:
        return ChangelogError(
            f"{self.where}: records must be (bytes, bytes | None) pairs: {e}. The records before it were "
            "already produced, so the open transaction was aborted: nothing since the last commit counts"
        )

    def _produce(self, records: Iterator[tuple[bytes, bytes | None]], count: int) -> None:
        """Produce ``count`` records, in order, into the task's open transaction; the last
        one carries the delivery callback (acks come in order, so it covers the rest)."""
        self._check_open()
        fault_point("changelog.append")
        writer = self._writer
        writer.begin()
        self._unflushed = True
        produce = writer.producer.produce
        topic, part = self.stream, self.partition
        try:
            for key, value in islice(records, count - 1):
                try:
                    produce(topic, value, key, part)
                except BufferError:
                    writer.make_room(topic)
                    produce(topic, value, key, part)
            key, value = next(records)
            try:
                produce(topic, value, key, part, on_delivery=self._delivered)
            except BufferError:
                writer.make_room(topic)
                produce(topic, value, key, part, on_delivery=self._delivered)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write to {self.where}") from e
        except (TypeError, ValueError) as e:
            raise writer.abandon(self._bad_records(e)) from e
        writer.producer.poll(0)

    def flush(self) -> int:
        """Commit the task's open transaction (every record acknowledged) and return
        this partition's end offset: the last acknowledged offset + 1. Inside a task
        commit whose checkpoint the same producer writes, only wait for the
        acknowledgements: the checkpoint write commits these records with it."""
        self._check_open()
        if self._unflushed:
            writer = self._writer
            topics = f"topic {self.stream!r} partition {self.partition}"
            if writer.commit_deferred:
                writer.await_acks(topics)
            else:
                writer.commit(topics)
            writer.producer.poll(0)
            if self._delivery_error is not None:
                raise writer.fail(self._delivery_error, f"write to {self.where}")
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
    def _reader(self) -> Any:
        if self._consumer is None:
            self._consumer = self.system.client.consumer()
        return self._consumer

    def _find_end(self) -> int:
        """Where the next write lands (a trailing transaction marker counted), whatever is
        committed: a read_committed view ends before a transaction whose markers the broker
        has not written yet, and the checkpoint of that commit may already be readable."""
        client = self.system.client
        return client.end_offset(client.probe(), self.stream, self.partition)

    def _scan(self, start: int, stop: int | None) -> Iterator[tuple[list[Any], int]]:
        """``(messages, last_offset)`` batches in ``[start, stop)`` (to EOF if ``stop`` is None)."""
        return self.system.client.scan(self._reader(), self.stream, self.partition, start, stop)

    def read_batches(self, start: int, stop: int) -> Iterator[tuple[list[ChangeRecord], int]]:
        """Records with offsets in ``[start, stop)``: the scan ends at the first record at or
        past ``stop`` or at partition EOF, whichever comes first (like the file log, a
        range past the end yields what exists; :meth:`discard_tail` reports committed
        records that are missing). A broker that does not answer within the bounded
        wait raises :class:`ChangelogError`."""
        self._check_open()
        if start >= stop:
            return
        # decoded with C-level map/zip, not a per-message Python loop: at a million
        # records a second this loop is a large share of a restore
        key_of, value_of = Message.key, Message.value
        for msgs, _ in self._scan(start, stop):
            keys = list(map(key_of, msgs))
            self._check_keys(msgs, keys)
            nbytes = sum(map(len, msgs)) + sum(map(len, keys))
            yield list(zip(keys, map(value_of, msgs))), nbytes

    def _check_keys(self, msgs: list[Any], keys: list[Any]) -> None:
        """CorruptionError if a record has no key: something other than localstate wrote
        to the topic (``all()`` first: one C-level pass; an empty key is valid but falsy)."""
        if not all(keys) and None in keys:
            offset = msgs[keys.index(None)].offset()
            raise CorruptionError(
                f"{self.where}: the record at offset {offset} has no key, so it was not written by localstate "
                "(a changelog record's key is the store key). Nothing was changed; remove what else writes to "
                "this topic and the foreign records, or point the store at a new changelog topic"
            )

    def min_valid_snapshot_offset(self) -> int:
        """The first offset written within the topic's ``delete.retention.ms``.

        Compaction may drop a tombstone once it is older than that, so a local snapshot
        below this offset could miss a delete; at or above it, every tombstone the
        replay needs is still in the log (a tombstone cannot be dropped before it is
        ``delete.retention.ms`` old). If every record is older, the end of the records.
        """
        self._check_open()
        client = self.system.client
        retention = client.retention_ms.get(self.stream, client.settings.delete_retention_ms)
        horizon_ms = int(time.time() * 1000) - retention
        probe = client.probe()  # where records are: a read_committed reader may end before them
        tp = TopicPartition(self.stream, self.partition, horizon_ms)
        found = client.with_retries(
            f"look up offsets by time in {self.where}", lambda: probe.offsets_for_times([tp], client.timeout_s)
        )[0]
        if found.error is not None:
            raise ChangelogError(f"looking up offsets by time in {self.where} failed: {found.error}")
        # a rescaled job's new topics: no local copy of an old task may be loaded
        rescaled = self.system.generation().horizon(self.logical_stream, self.partition)
        if found.offset < 0:
            return max(rescaled, self._records_end())
        # Verify the answer (tansu answers offset 0 for any time): the first record with
        # a timestamp at or after the horizon, scanning on only when the answer was wrong.
        for msgs, _ in client.scan(probe, self.stream, self.partition, int(found.offset)):
            for m in msgs:
                if m.timestamp()[1] >= horizon_ms:
                    return max(rescaled, int(m.offset()))
        return max(rescaled, self._records_end())

    def _records_end(self) -> int:
        """Offset after the last record (a trailing transaction marker not counted)."""
        client = self.system.client
        return client.end_offset(client.probe(), self.stream, self.partition, back=2)

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
        shipped = self._snapshots()
        if shipped is not None:  # of records past the commit: never to be fetched
            shipped.delete_past(c)
        keys: dict[bytes, None] = {}
        for msgs, last in self._scan(c, None):
            batch_keys = list(map(Message.key, msgs))
            self._check_keys(msgs, batch_keys)
            keys.update(dict.fromkeys(batch_keys))
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

    # -- engine snapshots shipped to the store ``snapshots.path`` names ---------------------
    def _snapshots(self) -> RemoteSnapshots | None:
        """The topic's own id is part of the prefix: a topic deleted and created again under
        its name is another log, whose offsets no older snapshot describes."""
        if self._shipped is None and self.system.snapshot_store is not None:
            store, every = self.system.snapshot_store
            prefix = f"{self.stream}/{self.partition}/{self.system.client.topic_id(self.stream) or 'no-topic-id'}"
            self._shipped = RemoteSnapshots(store, prefix, self.where, every)
        return self._shipped

    def upload_snapshot(self, engine: Any, offset: int) -> bool:
        """After a commit at ``offset`` (its checkpoint is written): ship the engine's
        snapshot when it took one (:meth:`RemoteSnapshots.ship`). True if shipped."""
        shipped = self._snapshots() if self._writer is not None and not self._closed else None
        return False if shipped is None else shipped.ship(engine, offset, instance_epoch())

    def shipped_snapshots(self) -> list[int]:
        shipped = self._snapshots()
        return [] if shipped is None else shipped.offsets()

    def fetch_snapshot(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: put the newest usable shipped snapshot among the engine's
        local ones (:meth:`RemoteSnapshots.fetch`)."""
        shipped = self._snapshots()
        return None if shipped is None else shipped.fetch(engine, committed, min_valid)

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
                batch_keys = list(map(Message.key, msgs))
                self._check_keys(msgs, batch_keys)
                keys.update(dict.fromkeys(batch_keys))
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
        self.system._release(self.logical_stream, self.partition)


class KafkaChangelogSystem(ChangelogSystem):
    """Changelog streams as compacted Kafka topics; checkpoints in a compacted topic too."""

    options_type = KafkaSettings
    pass_through = ("producer", "consumer", "topic", "snapshots")

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings: KafkaSettings = self.parse_settings(name, options)
        self.client = KafkaClient(self.settings, where=f"systems.{name}", group_id=f"localstate-restore-{job}")
        self._writers: dict[tuple[str, int], _TaskWriter] = {}
        self._open: set[tuple[str, int]] = set()
        self._checkpoints = KafkaCheckpointStore(self)
        self._generation: Generation | None = None
        self._closed = False
        self.snapshot_store: tuple[Any, int] | None = (
            snapshot_store(self.settings.snapshots, f"systems.{name}.snapshots") if self.settings.snapshots else None)
        """Where engine snapshots are shipped (``snapshots.path``) and every how many commits."""

    def describe(self) -> str:
        return f"kafka changelog on brokers {self.settings.bootstrap_servers}"

    # -- clients -----------------------------------------------------------------------------
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

    # -- generations (after a rescale) -------------------------------------------------------
    def generation(self) -> Generation:
        """The job's current generation (read from the checkpoint topic once)."""
        if self._generation is None:
            self._generation = self._checkpoints.read_generation(self.job)
        return self._generation

    def generation_known(self) -> bool:
        """Whether the generation was read (or pinned) already."""
        return self._generation is not None

    rescales_in_generations = True

    def pin_generation(self, generation: Generation) -> None:
        """Read and write ``generation`` from here on (rescale writes the next one with it)."""
        self._generation = generation

    def generation_used(self, generation: Generation, streams: list[str]) -> bool:
        """Whether a topic of ``generation`` exists already (a crashed earlier attempt)."""
        return any(self.client.topic_exists(generation.stream(s)) for s in streams)

    def claim_generation(self, number: int) -> bool:
        """Kafka has no create-only write to reserve a generation with: True (the task locks
        and the fencing of the old tasks are the guard; see docs/rescale.md)."""
        return True

    def write_generation(self, generation: Generation) -> None:
        """Record ``generation`` as the job's current one: the commit point of a rescale."""
        self._checkpoints.write_generation(self.job, generation)
        self._generation = generation

    # -- the ChangelogSystem interface ------------------------------------------------------
    def stream_exists(self, stream: str) -> bool:
        return self.topic_exists(stream)

    def topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (read-only tools check before reading would create it);
        a changelog stream's name is mapped to its topic in the job's generation."""
        if topic != self.settings.checkpoint_topic:
            topic = self.generation().stream(topic)
        return self.client.topic_exists(topic)

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
        self.client.ensure_topic(self.generation().stream(stream), partitions)
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
        self.client.close()
