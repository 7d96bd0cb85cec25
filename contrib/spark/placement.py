"""Host affinity: each task runs on the executor that holds its state.

Spark places a post-shuffle task where its shuffle input is, not where its state is,
so without help a task of a cluster job lands on a random executor every micro-batch
and restores its state there. Spark's own state stores solve this with preferred
locations (``StateStoreCoordinator``); this module does the same for localstate tasks
with public PySpark and one py4j call:

* **The registry** (:class:`Placement`, on the driver) remembers which executor ran
  each Spark partition last (where its state now is) and, before each run, proposes an
  executor per partition: the same one while it is alive and not holding more than its
  share (``ceil(partitions / executors)``); the others — new partitions, partitions of
  a lost executor, the newest arrivals on an executor above its share — go to the least
  loaded live executors. A task that ran elsewhere (its executor was busy past
  ``spark.locality.wait``) is recorded where it ran.
* **The preference** (:func:`placed`): the shuffled input is packed into one Arrow IPC
  payload row per partition (``mapInArrow``) and zipped with an RDD made by
  ``SparkContext.makeRDD`` whose partition ``i`` prefers executor ``i``'s proposal
  (``executor_<host>_<id>``, Spark's executor-level location). The task runs in the same
  stage, so Spark's delay scheduling sends it to that executor, or elsewhere after
  ``spark.locality.wait`` (default 3 s) when that executor stays busy.
* **The report**: each Spark task adds ``{partition: executor}`` to an accumulator
  (:class:`PlacementParam`) after its tasks committed; Spark keeps only a successful
  attempt's updates, so the registry learns where the committed state is.

**Standby replicas** (``job.standby.replicas = 1``, :mod:`localstate.contrib.spark.standby`):
the registry also names a standby executor per partition, another than its owner, spread
evenly (:meth:`Placement.assign_standbys`); after each run that executor brings its copy
up to the partition's new commit. A run's Spark task prefers its owner and its standby
alike (both hold the last commit), so when the owner is lost mid-run Spark's retry goes
to the standby, and a partition whose owner was lost between runs is proposed there: its
first open replays only what was committed since the last follow.

Placement is a hint, never a source of truth. Which copy of a task's state is used is
decided by the task's own open (the local copy is checked against the committed
checkpoint and the changelog; two attempts are kept apart by the partition locks), so a
lost registry (a new driver) only costs one round of placement, and a wrong or
doubled claim costs a restore, never a wrong state.

The price: a task's input for one run is held as one payload (a binary value, < 2 GiB)
and crosses one more Python worker; see docs/spark.md ("Host affinity").

**Copies left behind** (:func:`sweep_copies`): after its tasks commit, a Spark task
deletes the copies its executor holds of partitions the registry gives to another
executor, once that partition's committed version is past the copy's (its owner has
committed past it), each under the partition's lock. Each copy records the version it
was left at (:mod:`localstate.copies`), which ``localstate inspect`` shows.
"""

from __future__ import annotations

import math
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from localstate import Config, LocalStateError, StoreLockedError
from localstate.copies import copy_record_path, read_copy_record
from localstate.layout import job_dir, store_dir, task_lock
from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.rdd import RDD
    from pyspark.sql import DataFrame

__all__ = [
    "Placement",
    "PlacementParam",
    "live_executors",
    "location",
    "placed",
    "located",
    "Locations",
    "unpacked",
    "PAYLOAD_COLUMN",
    "sweep_copies",
]

PAYLOAD_COLUMN = "__localstate_payload"
"""The one column of :func:`placed`'s DataFrame: a partition's input as an Arrow IPC stream."""

def _executor_order(executor: str) -> tuple[int, str]:
    return (len(executor), executor)  # "2" before "10"


class Placement:
    """The driver's registry of where each of ``partitions`` Spark partitions runs.

    Not thread-safe: one job's runs call it one at a time (a batch run, or a streaming
    query's ``foreachBatch``).
    """

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.owners: dict[int, str] = {}
        """Spark partition → executor id that ran (and committed) it last."""
        self.standbys: dict[int, str] = {}
        """Spark partition → the executor keeping its standby copy (:meth:`assign_standbys`)."""
        self._previous: dict[int, str] = {}
        """Spark partition → the executor that ran it before its owner (it holds a copy)."""
        self._arrived: dict[int, int] = {}
        self._clock = 0
        self.runs = 0
        """Task runs reported for partitions that had run before."""
        self.moves = 0
        """Of :attr:`runs`, those on another executor than the partition's previous run."""

    def assign(self, executors: Iterable[str], *, wait_for_standby: bool = True) -> list[str | None]:
        """The proposed executor of every partition (None: no live executor to propose).

        A partition stays with its owner while the owner is in ``executors`` and holds at
        most ``ceil(partitions / len(executors))`` partitions (the longest-held kept
        first); the rest go one by one to their standby executor (:attr:`standbys`) when it
        is live and below that share (a lost owner's partition: live), else to the live
        executor with the fewest. With
        standbys, a partition whose owner lives but holds more than its share stays there
        until its standby is where it would move (``wait_for_standby``; see
        :meth:`assign_standbys`), so a move for balance never starts cold.
        """
        alive = sorted(set(executors), key=_executor_order)
        if not alive:
            return [None] * self.partitions
        share = math.ceil(self.partitions / len(alive))
        load: Counter[str] = Counter()
        out: list[str | None] = [None] * self.partitions
        for p in sorted((p for p in self.owners if self.owners[p] in alive and p < self.partitions),
                        key=lambda p: self._arrived[p]):
            owner = self.owners[p]
            if load[owner] < share:
                out[p] = owner
                load[owner] += 1
        for p in range(self.partitions):
            if out[p] is None:
                standby, owner = self.standbys.get(p), self.owners.get(p)
                if standby in alive and (load[standby] < share or owner not in alive):
                    target = standby  # its warm copy (a lost owner's: even above the share, for a run)
                elif wait_for_standby and self.standbys and owner in alive:
                    target = owner  # above its share for one more run: its target has no copy yet
                else:
                    target = min(alive, key=lambda e: (load[e], _executor_order(e)))
                out[p] = target
                load[target] += 1
        return out

    def assign_standbys(self, executors: Iterable[str], replicas: int) -> list[str | None]:
        """The standby executor of every partition (None: none), remembered in :attr:`standbys`.

        With ``replicas`` >= 1 and two or more live ``executors``: a partition keeps its
        standby while that executor is live and is not the partition's owner (a new standby
        starts from nothing, so standbys are not moved for balance alone); the others go
        one by one to their previous owner (which still holds a copy) while it is live, not
        the owner and keeps fewer than ``ceil(partitions / len(executors))`` standbys, else
        to the live executor other than the owner with the fewest standbys. Last, a partition that
        the next :meth:`assign` would move (its owner holds more than its share, e.g. after
        an executor joined) gets the executor it would move to as its standby, so the move
        finds a warm copy there.
        """
        alive = sorted(set(executors), key=_executor_order)
        if replicas < 1 or len(alive) < 2:
            self.standbys = {}
            return [None] * self.partitions
        share = math.ceil(self.partitions / len(alive))
        load: Counter[str] = Counter()
        out: list[str | None] = [None] * self.partitions
        for cap, choice in ((self.partitions, self.standbys), (share, self._previous)):
            for p, standby in sorted(choice.items()):
                if (p < self.partitions and out[p] is None and standby in alive and standby != self.owners.get(p)
                        and load[standby] < cap):
                    out[p] = standby
                    load[standby] += 1
        for p in range(self.partitions):
            if out[p] is None:
                target = min((e for e in alive if e != self.owners.get(p)),
                             key=lambda e: (load[e], _executor_order(e)))
                out[p] = target
                load[target] += 1
        self.standbys = {p: e for p, e in enumerate(out) if e is not None}
        for p, target in enumerate(self.assign(alive, wait_for_standby=False)):
            owner = self.owners.get(p)
            if owner is not None and target is not None and target != owner:
                out[p] = self.standbys[p] = target
        return out

    def forget(self) -> None:
        """Drop what the registry knows (what the registry of a new driver knows)."""
        self.owners.clear()
        self.standbys.clear()
        self._previous.clear()
        self._arrived.clear()

    def record(self, ran: Mapping[int, str]) -> None:
        """Partition → executor of the runs that committed: they are the owners now."""
        for p, executor in sorted(ran.items()):
            before = self.owners.get(p)
            if before is not None:
                self.runs += 1
                self.moves += before != executor
            if before != executor:
                if before is not None:
                    self._previous[p] = before
                self.owners[p] = executor
                self._arrived[p] = self._clock
                self._clock += 1

    def owner_of_tasks(self, groups: list[list[int]], assignment: list[str | None]) -> dict[int, str]:
        """Task → proposed executor, from the Spark partitions' ``assignment``
        (Spark partition ``i`` runs the tasks ``groups[i]``)."""
        return {task: executor for tasks, executor in zip(groups, assignment) if executor is not None
                for task in tasks}


class PlacementParam(AccumulatorParam):
    """Merges ``{spark_partition: executor_id}`` reports of task runs."""

    def zero(self, value: Any) -> dict[int, str]:
        return {}

    def addInPlace(self, a: dict[int, str], b: dict[int, str]) -> dict[int, str]:
        a.update(b)
        return a


def live_executors(sc: SparkContext) -> dict[str, str]:
    """Executor id → host of the executors registered now that Spark has not excluded
    (``spark.excludeOnFailure.enabled``: an executor whose tasks kept failing there, e.g.
    on an unusable state dir), the driver left out. Empty under ``local[*]``, where the
    driver is the only executor, and when Spark's status store cannot be read."""
    try:
        infos = sc._jsc.sc().statusStore().executorList(True)  # noqa: SLF001 - no Python API lists executor ids
        out = {}
        for i in range(infos.size()):
            info = infos.apply(i)
            executor = str(info.id())
            if executor != "driver" and not info.isExcluded():
                out[executor] = str(info.hostPort()).rsplit(":", 1)[0]
        return out
    except Exception:  # a Spark without this status API: run without placement
        return {}


def location(executor: str, host: str) -> str:
    """Spark's executor-level preferred location string for ``executor`` on ``host``."""
    return f"executor_{host}_{executor}"


def _pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    sink = pa.BufferOutputStream()
    writer = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
    if writer is not None:
        writer.close()
    yield pa.RecordBatch.from_arrays([pa.array([sink.getvalue().to_pybytes()], pa.binary())],
                                     names=[PAYLOAD_COLUMN])


def unpacked(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The record batches inside :func:`placed`'s payload rows, in order."""
    for batch in batches:
        for payload in batch.column(0).to_pylist():
            if payload:
                yield from pa.ipc.open_stream(payload)


Locations = Sequence["str | Sequence[str] | None"]
"""Per partition: a preferred location (:func:`location`), several (all preferred alike),
or None (no preference)."""


def _as_list(where: str | Sequence[str] | None) -> list[str]:
    if where is None:
        return []
    return [where] if isinstance(where, str) else list(where)


def located(sc: SparkContext, locations: Locations) -> RDD[int]:
    """An RDD of ``len(locations)`` partitions, partition ``i`` holding the one element
    ``i`` and preferring ``locations[i]`` (see :data:`Locations`): Spark's ``makeRDD`` with
    location preferences, which PySpark does not expose."""
    from pyspark.rdd import RDD
    from pyspark.serializers import BatchedSerializer, CPickleSerializer

    # Pickled as ``df.rdd``'s batches are (one batch of one element per partition), so
    # PySpark zips it with such an RDD without re-batching either.
    jvm = sc._jvm  # noqa: SLF001 - makeRDD with locations has no Python API
    pickle = CPickleSerializer()
    items = [jvm.scala.Tuple2(bytearray(pickle.dumps([i])), jvm.PythonUtils.toSeq(_as_list(where)))
             for i, where in enumerate(locations)]
    tag = getattr(jvm.scala.reflect, "ClassTag$").__getattr__("MODULE$").apply(
        jvm.java.lang.Class.forName("[B"))
    jrdd = sc._jsc.sc().makeRDD(jvm.PythonUtils.toSeq(items), tag)  # noqa: SLF001
    return RDD(jrdd.toJavaRDD(), sc, BatchedSerializer(pickle))


def placed(df: DataFrame, locations: Locations) -> DataFrame:
    """``df`` (already partitioned) as one payload row per partition (:func:`unpacked`
    reads it back), partition ``i`` preferring ``locations[i]`` (see :data:`Locations`).
    ``len(locations)`` must be ``df``'s number of partitions."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    spark = df.sparkSession
    rows = df.mapInArrow(_pack, StructType([StructField(PAYLOAD_COLUMN, BinaryType(), False)])).rdd
    # One element per partition on both sides (a zip needs equal counts).
    payloads = located(spark.sparkContext, locations).zip(rows).map(lambda pair: (pair[1][0],))
    return spark.createDataFrame(payloads, StructType([StructField(PAYLOAD_COLUMN, BinaryType(), False)]),
                                 verifySchema=False)


def _held_partitions(config: Config) -> set[int]:
    held: set[int] = set()
    root = job_dir(config)
    for store in config.stores:
        sdir = root / store
        if sdir.is_dir():
            held.update(int(d.name) for d in sdir.iterdir() if d.is_dir() and d.name.isdigit())
    return held


def _remove_copy(directory: Path) -> None:
    """Take ``directory`` out of use at once (a rename, so no open ever sees half a copy),
    then delete it; what a failed delete leaves is a ``.deleting-`` directory that no task
    opens, removed by a later sweep."""
    if not directory.exists():
        return
    trash = directory.with_name(f".deleting-{directory.name}-{os.getpid()}")
    directory.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_leftovers(config: Config) -> None:
    for store in config.stores:
        sdir = job_dir(config) / store
        if sdir.is_dir():
            for leftover in sdir.glob(".deleting-*"):
                shutil.rmtree(leftover, ignore_errors=True)


def sweep_copies(config: Config, owners: Mapping[int, str], me: str,
                 standbys: Mapping[int, str] | None = None) -> list[int]:
    """Delete this state dir's copies of partitions that ``owners`` (task → executor)
    gives to another executor than ``me`` and whose committed version is past the
    copy's; returns the partitions deleted. A copy ``me`` keeps as the partition's
    standby (``standbys``: task → executor) is kept.

    A copy without a record, one whose partition has no committed version past it, and
    one whose lock is held (an attempt running here) is kept. Each deletion holds the
    partition's lock, and the record goes last, so an interrupted sweep leaves a copy
    that the next open verifies or rebuilds like any other.
    """
    _remove_leftovers(config)
    standbys = standbys or {}
    candidates = sorted(p for p in _held_partitions(config) if owners.get(p, me) != me and standbys.get(p) != me)
    if not candidates:
        return []
    from localstate.store_open import open_system

    deleted: list[int] = []
    system = open_system(config, config.checkpoint_system)
    try:
        checkpoints = system.checkpoints()
        for p in candidates:
            record = read_copy_record(copy_record_path(config, p))
            if record is None or not isinstance(record.get("version"), int):
                continue
            committed = checkpoints.read(config.job_name, p)
            if committed is None or committed.version <= record["version"]:
                continue
            try:
                lock = task_lock(config, p)
            except StoreLockedError:
                continue
            try:
                for store in config.stores:
                    _remove_copy(store_dir(config, store, p))
                copy_record_path(config, p).unlink(missing_ok=True)
            finally:
                lock.release()
            deleted.append(p)
    except (LocalStateError, OSError):
        return deleted  # housekeeping: a checkpoint it cannot read, or a dir it cannot move, keeps copies
    finally:
        system.close()
    return deleted
