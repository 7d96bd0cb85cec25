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

from collections.abc import Mapping
from typing import Any

from localstate.errors import ChangelogError, ConfigError, StoreLockedError

from ..base import ChangelogSystem, Generation
from ..snapshots import snapshot_store
from .checkpoints import KafkaCheckpointStore
from .client import KafkaClient, KafkaSettings
from .partition import KafkaChangelogPartition
from .writer import TaskWriter

__all__ = ["KafkaChangelogSystem", "KafkaChangelogPartition", "KafkaCheckpointStore", "KafkaSettings"]


class KafkaChangelogSystem(ChangelogSystem):
    """Changelog streams as compacted Kafka topics; checkpoints in a compacted topic too."""

    options_type = KafkaSettings
    pass_through = ("producer", "consumer", "topic", "snapshots")

    def __init__(self, name: str, options: Mapping[str, Any], job: str) -> None:
        super().__init__(name, options, job)
        self.settings: KafkaSettings = self.parse_settings(name, options)
        self.client = KafkaClient(self.settings, where=f"systems.{name}", group_id=f"localstate-restore-{job}")
        self._writers: dict[tuple[str, int], TaskWriter] = {}
        self._open: dict[tuple[str, int], KafkaChangelogPartition] = {}
        self._checkpoints = KafkaCheckpointStore(self)
        self._generation: Generation | None = None
        self._closed = False
        self.snapshot_store: tuple[Any, int] | None = (
            snapshot_store(self.settings.snapshots, f"systems.{name}.snapshots") if self.settings.snapshots else None)
        """Where engine snapshots are shipped (``snapshots.path``) and every how many commits."""

    def describe(self) -> str:
        return f"kafka changelog on brokers {self.settings.bootstrap_servers}"

    # -- clients -----------------------------------------------------------------------------
    def writer(self, job: str, partition: int) -> TaskWriter:
        """The task's transactional producer; creating it fences older instances."""
        self._check_open()
        w = self._writers.get((job, partition))
        if w is None:
            w = self._writers[(job, partition)] = TaskWriter(self, job, partition)
        return w

    keeps_open = True  # renew_task_instance fences whoever opened the task meanwhile

    def renew_task_instance(self, job: str, partition: int) -> None:
        """A new transactional producer for the task (:meth:`TaskWriter.renew`): this
        instance fences every other one again, as its open did."""
        w = self._writers.get((job, partition))
        if w is None:
            self.writer(job, partition)
        else:
            self._check_open()
            w.renew()
        for (_, p), opened in self._open.items():
            if p == partition:
                opened.check_not_behind()

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
        opened = self._open[(stream, partition)] = KafkaChangelogPartition(self, writer, stream, partition)
        return opened

    def _release(self, stream: str, partition: int) -> None:
        self._open.pop((stream, partition), None)

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
