"""Task checkpoints of the Kafka changelog: records keyed ``<job>/<partition>`` in one
compacted topic (``systems.<name>.checkpoint.topic``), each written in its own
transaction by the task's transactional producer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, CorruptionError
from localstate.faults import fault_point

from .base import CheckpointStore, Generation

try:
    from confluent_kafka import KafkaException
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'") from _e

if TYPE_CHECKING:
    from .kafka import KafkaChangelogSystem

__all__ = ["KafkaCheckpointStore"]


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
        if job == self.system.job:
            job = self.system.generation().job(job)
        return f"{job}/{partition}".encode()

    def read_generation(self, job: str) -> Generation:
        """The job's generation record (``<job>/generation``); generation 0 if none (or no
        checkpoint topic yet: reading would create it)."""
        if not self.system.client.topic_exists(self.topic):
            return Generation()
        found, _ = self._scan(f"{job}/generation".encode())
        if not found or found[-1] is None:
            return Generation()
        return Generation.from_bytes(found[-1], f"{job}/generation in kafka topic {self.topic!r}")

    def write_generation(self, job: str, generation: Generation) -> None:
        """Write the job's generation record in its own transaction (the rescale's commit point)."""
        s = self.system
        s.client.ensure_topic(self.topic, 1, checkpoint=True)
        writer = s.writer(job, 0)
        writer.begin()
        try:
            writer.producer.produce(self.topic, generation.to_bytes(), f"{job}/generation".encode(), 0)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write the generation record to topic {self.topic!r}") from e
        writer.commit(f"checkpoint topic {self.topic!r}")

    def read(self, job: str, partition: int, *, fence: bool = True) -> Checkpoint | None:
        """The latest checkpoint of the task (``fence=False`` for read-only tools)."""
        s = self.system
        if fence:
            s.writer(job, partition)
        s.client.ensure_topic(self.topic, 1, checkpoint=True)
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
        client = self.system.client
        found: list[bytes] = []
        end: list[int] = []
        consumer = client.consumer()
        try:
            for msgs, _ in client.scan(consumer, self.topic, 0, 0, eof=end):
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
        client = self.system.client
        consumer = client.consumer(isolation="read_uncommitted")
        try:
            return any(msgs for msgs, _ in client.scan(consumer, self.topic, 0, offset))
        finally:
            consumer.close()

    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        s = self.system
        s.client.ensure_topic(self.topic, 1, checkpoint=True)
        writer = s.writer(job, partition)
        writer.begin()
        try:
            writer.producer.produce(self.topic, checkpoint.to_bytes(), self._key(job, partition), 0)
        except KafkaException as e:
            raise writer.fail(e.args[0], f"write the checkpoint to topic {self.topic!r}") from e
        fault_point("checkpoint.before_rename")
        writer.commit(f"checkpoint topic {self.topic!r}")
        fault_point("checkpoint.after_rename")
