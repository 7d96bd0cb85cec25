"""The transactional producer of one task partition, shared by its stores' changelog
partitions and its checkpoint: one transaction per task commit, fencing of older instances."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from localstate.errors import ChangelogError, FencedError

from .client import (
    CONNECT_FAST,
    aborted_transaction_error,
    client_log,
    connect_timeout_ms,
    is_fenced,
)

try:
    from confluent_kafka import KafkaError, KafkaException, Producer
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'"
    ) from _e

if TYPE_CHECKING:
    from .system import KafkaChangelogSystem

__all__ = ["TaskWriter", "raised_error"]

log = logging.getLogger("localstate.changelog.kafka")


def raised_error(e: BaseException) -> Any:
    """The ``KafkaError`` behind an exception a confluent-kafka call raised (itself, or
    the cause or context of the ``SystemError`` it wraps a callback's error in)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, KafkaException):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


class TaskWriter:
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
        conf.update({"enable.idempotence": True, "acks": "all", "transactional.id": self.transactional_id})
        self._conf = conf
        self._producers = 0  # producers made so far: a renewed one's errors are not the old one's
        self.fatal_error: Any = None
        self.producer = self._new_producer()
        self.in_txn = False
        self.commit_deferred = False
        """Inside a task commit whose checkpoint this producer writes
        (:meth:`KafkaCheckpointStore.committing`): a changelog flush waits for its records'
        acknowledgements and leaves the transaction open, and the checkpoint write commits
        data and checkpoint together (one transaction, one commit round trip)."""
        self.failed: BaseException | None = None
        self.cluster_id: str | None = None
        """The Kafka cluster the task opened on (a renewal on another one is refused)."""
        self._init()

    def _init(self) -> None:
        """Register this producer as the task's newest instance (``init_transactions``:
        the broker fences every older producer of the transactional id and aborts its
        open transaction)."""
        s, client = self.system.settings, self.system.client
        what = f"transactional producer {self.transactional_id!r}"
        # A metadata request first brings a broker connection up, so the producer-id request
        # of init_transactions never waits out librdkafka's 500 ms "no broker available" retry
        # timer (benchmarks/RESULTS.md has the measurement).
        cluster = client.with_retries(what, lambda: self.producer.list_topics(timeout=s.timeout_ms / 1000)).cluster_id
        if self.cluster_id is None:
            self.cluster_id = cluster
        elif cluster != self.cluster_id:
            raise ChangelogError(f"kafka producer {self.transactional_id!r}: the brokers are now cluster {cluster!r}, "
                                 f"not {self.cluster_id!r} as when the task opened; open the task again")
        client.with_retries(what, lambda: self.producer.init_transactions(s.timeout_ms / 1000))

    def _new_producer(self) -> Any:
        """A producer of the task's id whose error callback reports only while it is the
        current one (an older producer, fenced by its successor, may still report)."""
        self._producers += 1
        number = self._producers

        def on_error(err: Any) -> None:
            if number == self._producers:
                self._client_error(err)

        return Producer({**self._conf, "error_cb": on_error})

    def renew(self) -> None:
        """Become the task's newest instance again with a new producer of the same id (a
        task kept open between runs, before it is used again: any instance that opened the
        task meanwhile is fenced, and its open transaction aborted, as a fresh open
        would). Only between transactions; the partitions writing through this writer
        keep it."""
        if self.in_txn or self.failed is not None:
            raise ChangelogError(f"kafka producer {self.transactional_id!r}: renewed inside a transaction or "
                                 "after a failure; close the task and open it again")
        old, self.producer = self.producer, self._new_producer()
        old.purge()
        old.flush(0)
        del old
        self.fatal_error = None
        self._init()

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
        err = aborted_transaction_error(self.producer, min(5.0, self.system.settings.timeout_ms / 1000))
        if err is not None:
            return err
        self.in_txn = False
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
            raise self.fail(self.fatal_error or raised_error(e) or self._txn_error(), what) from e
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
