"""One partition of a changelog topic: appends through the task's transactional producer,
reads to the true end, the tail cut after a crash, shipped snapshots, verify and reset."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice, repeat
from operator import length_hint
from typing import TYPE_CHECKING, Any

from localstate.errors import ChangelogError, CorruptionError
from localstate.faults import fault_point
from localstate.records import ChangeRecord

from ..base import ChangelogPartition, CurrentFn
from ..snapshots import RemoteSnapshots, instance_epoch

try:
    from confluent_kafka import KafkaException, Message, TopicPartition
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'"
    ) from _e

from .writer import TaskWriter

if TYPE_CHECKING:
    from .system import KafkaChangelogSystem

__all__ = ["KafkaChangelogPartition"]

log = logging.getLogger("localstate.changelog.kafka")


class KafkaChangelogPartition(ChangelogPartition):
    """One partition of a changelog topic, written through the task's transactional producer."""

    def __init__(self, system: KafkaChangelogSystem, writer: TaskWriter, stream: str, partition: int) -> None:
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
        writer = self._begin_append()
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

    def _begin_append(self) -> TaskWriter:
        """The task's writer with its transaction open, before records are produced."""
        self._check_open()
        fault_point("changelog.append")
        writer = self._writer
        writer.begin()
        self._unflushed = True
        return writer

    def _produce(self, records: Iterator[tuple[bytes, bytes | None]], count: int) -> None:
        """Produce ``count`` records, in order, into the task's open transaction; the last
        one carries the delivery callback (acks come in order, so it covers the rest)."""
        writer = self._begin_append()
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

    def check_not_behind(self) -> None:
        """Raise :class:`ChangelogError` if the partition now ends before the end this
        instance last saw (the topic was deleted, or made anew, since): a task kept open
        between runs must not go on writing at offsets its checkpoints already name."""
        if self._end is None:
            return
        client = self.system.client
        _, high = client.watermarks(client.probe(), self.stream, self.partition)
        if high < self._end:
            raise ChangelogError(f"{self.where} ends at offset {high}, before offset {self._end} this task "
                                 "wrote up to: the topic was deleted or replaced; open the task again")

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
        # the end this open already read (the check of the committed offset): nothing can
        # have appended since, as the task's producer fenced every other instance first
        end = self.end_offset()
        if c > end:
            raise self.missing_committed(c)
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

    def missing_committed(self, committed: int) -> CorruptionError:
        """The error for a checkpoint naming offset ``committed`` past the partition's end."""
        return CorruptionError(
            f"{self.where} ends at offset {self.end_offset()}, but the task checkpoint says offset {committed} "
            "was committed: committed records are missing (topic deleted or recreated, or the broker lost its "
            "data). Nothing was changed. Restore the topic; or keep what is left with `localstate restore "
            "--accept-log-end STORE`, or give up the store's state with `localstate restore --reset STORE`."
        )

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
