"""Task checkpoints of the Kafka changelog: records keyed ``<job>/<partition>`` in one
compacted topic (``systems.<name>.checkpoint.topic``), each written by the task's
transactional producer in the transaction that also commits the task's changelog records
(see :meth:`KafkaCheckpointStore.committing`)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, CorruptionError
from localstate.faults import fault_point

from ..base import CheckpointStore, Generation

try:
    from confluent_kafka import KafkaException
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka changelog needs confluent-kafka: pip install 'localstate[kafka]'") from _e

if TYPE_CHECKING:
    from .system import KafkaChangelogSystem

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
        self._seen: dict[tuple[str, int], tuple[int, Checkpoint | None]] = {}
        """Per task read here: the offset a read of the topic ended at and the task's
        latest checkpoint up to it (where :meth:`latest_for_kept` reads on from)."""

    def _key(self, job: str, partition: int) -> bytes:
        if job == self.system.job:
            job = self.system.generation().job(job)
        return f"{job}/{partition}".encode()

    def read_generation(self, job: str) -> Generation:
        """The job's generation record (``<job>/generation``); generation 0 if none (or no
        checkpoint topic yet: reading would create it)."""
        if not self.system.client.topic_exists(self.topic):
            return Generation()
        key = f"{job}/generation".encode()
        found = self._scan([key])[0][key]
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

    def read_readonly(self, job: str, partition: int) -> Checkpoint | None:
        if not self.system.topic_exists(self.topic):  # reading would create it
            return None
        return self.read(job, partition, fence=False)

    def read(self, job: str, partition: int, *, fence: bool = True) -> Checkpoint | None:
        """The latest checkpoint of the task (``fence=False`` for read-only tools)."""
        s = self.system
        if fence:
            s.writer(job, partition)
        s.client.ensure_topic(self.topic, 1, checkpoint=True)
        settings = s.settings
        deadline = time.monotonic() + settings.timeout_ms / 1000 * (settings.retries + 1)
        while True:
            found, end, generation = self._scan_task(job, partition)
            # A read_committed reader ends at the last stable offset: an open transaction
            # on this shared topic (another task inside its checkpoint transaction, or one
            # killed there that has not restarted yet) hides every later checkpoint, this
            # task's included. Reading on from a stale view would restore an older commit.
            hidden = self._hidden_after(end)
            if hidden is None:
                break
            if time.monotonic() > deadline:
                raise ChangelogError(
                    f"checkpoint of {job}/partition {partition}: kafka topic {self.topic!r} has an open "
                    f"transaction at offset {end} that hides newer checkpoints (its first record is the "
                    f"checkpoint of {hidden!r}: that task died inside its checkpoint transaction and has "
                    "not restarted). Restart that task, or wait for the broker to abort it "
                    "(transaction.timeout.ms), then open this task again"
                )
            time.sleep(0.2)
        if generation is not None:
            s.pin_generation(generation)
        latest = self._parse(job, partition, found)
        self._seen[(job, partition)] = (end, latest)
        return latest

    def latest_for_kept(self, job: str, partition: int) -> Checkpoint | None:
        """The task's latest checkpoint, reading only what was written since this store
        last read it: a kept task re-reads it this way after its producer was renewed
        (:meth:`KafkaChangelogSystem.renew_task_instance`). The records since are read
        uncommitted: no transaction of the task's own id is open any more (the renewal
        aborted or finished it), so a newer record of the task's key is one another
        instance wrote — committed, or aborted, which still makes the kept storage
        stale here (the safe side) — and no other task's open transaction can hide one.
        A generation record since (a rescale), or a topic now ending before where the last
        read ended (deleted and made anew), gives None: never the kept storage's."""
        seen = self._seen.get((job, partition))
        if seen is None or job != self.system.job or not self.system.generation_known():
            return self.read_readonly(job, partition)
        start, latest = seen
        key, generation_key = self._key(job, partition), f"{job}/generation".encode()
        found, end = self._scan([key, generation_key], start=start, consumer=self.system.client.probe())
        if found[generation_key] or end < start:  # a rescale since; a topic that lost records (made anew)
            return None
        if found[key]:
            latest = self._parse(job, partition, found[key])
        self._seen[(job, partition)] = (end, latest)
        return latest

    def _parse(self, job: str, partition: int, found: list[bytes]) -> Checkpoint | None:
        """The task's checkpoint from the last record found for its key (None: none, or a
        tombstone)."""
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

    def _scan_task(self, job: str, partition: int) -> tuple[list[bytes], int, Generation | None]:
        """The last two committed checkpoints of the task, the offset where the read ended
        and, when the job's generation was not known yet, its generation: its record is
        read in the same pass (one read of the shared topic per task open instead of two,
        and both from one view of the topic)."""
        s = self.system
        if job != s.job or s.generation_known():
            key = self._key(job, partition)
            found, end = self._scan([key])
            return found[key], end, None
        generation_key = f"{job}/generation".encode()
        # the task's key in any generation: <job>/<p> or <job>.gen<n>/<p>
        plain, renamed, suffix = f"{job}/{partition}".encode(), f"{job}.gen".encode(), f"/{partition}".encode()
        found, end = self._scan([generation_key], lambda k: k == plain or (k.startswith(renamed) and k.endswith(suffix)))
        records = found[generation_key]
        generation = (Generation() if not records or records[-1] is None
                      else Generation.from_bytes(records[-1], f"{job}/generation in kafka topic {self.topic!r}"))
        return found[f"{generation.job(job)}/{partition}".encode()], end, generation

    def _scan(self, keys: list[bytes], also: Callable[[bytes], bool] | None = None, *, start: int = 0,
              consumer: Any = None) -> tuple[dict[bytes, list[bytes]], int]:
        """The last two committed values of each of ``keys`` (and of every key ``also``
        accepts; any other key maps to ``[]``) from offset ``start`` on, and the offset
        where the read ended. ``consumer``: one to read with (kept open; default a new
        read_committed one, closed after)."""
        client = self.system.client
        found: dict[bytes, list[bytes]] = {k: [] for k in keys}
        end: list[int] = []
        own = consumer is None
        if own:
            consumer = client.consumer()
        try:
            for msgs, _ in client.scan(consumer, self.topic, 0, start, eof=end):
                for m in msgs:
                    key = m.key()
                    values = found.get(key)
                    if values is None:
                        if also is None or key is None or not also(key):
                            continue
                        values = found[key] = []
                    values.append(m.value())
                    del values[:-2]
        finally:
            if own:
                consumer.close()
        return defaultdict(list, found), end[0] if end else start

    def _hidden_after(self, offset: int) -> str | None:
        """The key (``job/partition``) of the first record at or after ``offset``, which a
        read_committed reader did not get (a record of a transaction still open), or None
        when there is none."""
        client = self.system.client
        for msgs, _ in client.scan(client.probe(), self.topic, 0, offset):
            if msgs:
                return (msgs[0].key() or b"").decode("utf-8", "replace")
        return None

    @contextmanager
    def committing(self, job: str, partition: int) -> Iterator[None]:
        """One task commit as one transaction: changelog flushes of the task's producer
        inside it wait only for acknowledgements, and :meth:`write` commits the records
        and the checkpoint together (one commit round trip instead of two, and no
        committed changelog records without their checkpoint)."""
        writer = self.system.writer(job, partition)
        writer.commit_deferred = True
        try:
            yield
        finally:
            writer.commit_deferred = False

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
