"""Structured Streaming with exactly-once state: ``foreachBatch``, batch id = version.

How Spark runs micro-batch ``B``: it writes ``B``'s input offsets to its offset log,
runs the batch (our ``foreachBatch`` function), then writes ``B`` to its commit log.
After a crash it re-runs the last batch whose offsets are logged but not committed,
**with the same input**. Each task ``p`` of batch ``B`` commits its localstate
checkpoint with ``version = B`` and keeps, inside that checkpoint, the checkpoint it
replaced (version, input position, changelog offsets).

So when task ``p`` starts batch ``B`` and finds its committed version ``V``:

* ``V < B`` (or no checkpoint): the normal case — process, commit ``B``;
* ``V == B``: localstate committed ``B`` but Spark did not (the driver or an
  executor died after our commit, before Spark's commit log, or the output was
  evaluated twice). We **roll back**: the checkpoint is rewritten to the one ``B``
  replaced, the partition is restored to it (the changelog tail past it is cut off),
  and ``B`` is processed again. We roll back rather than skip because re-processing
  also reproduces ``B``'s output rows, which ``output`` (the sink) needs again —
  skipping would lose them, and the state after the re-run equals the state after
  the first run because the input and the task are deterministic.
* ``V > B``: the state is ahead of Spark's checkpoint (a reset or foreign checkpoint
  location): an error — state must never be ahead of what Spark committed.

Hence every input record affects the state exactly once, and the state observed by
any batch never includes work Spark has not committed. Spark re-runs at most the
last batch, so one step of history is enough. A rollback costs a restore of the
partition (engines whose local snapshot is newer than the rolled-back offset
rebuild from the changelog).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from localstate import Checkpoint, Config, LocalStateError, StoreLockedError
from localstate.locking import FileLock
from localstate.storage import open_system

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from .runner import StatefulJob

__all__ = ["prepare_version", "stream_position", "start", "committed_batches", "rescaled_position"]

_PREVIOUS = "previous"
_RESCALED = "rescaled_from"


def stream_position(batch_id: int, rows: int, previous: Checkpoint | None) -> dict[str, Any]:
    """The ``input_position`` a streaming task commits for ``batch_id``: the batch id,
    the rows it consumed, and the checkpoint it replaces (to roll back to)."""
    prev: dict[str, Any] | None = None
    if previous is not None:
        pos = previous.input_position
        if isinstance(pos, dict):
            pos = {k: v for k, v in pos.items() if k != _PREVIOUS}
        prev = {"version": previous.version, "input_position": pos, "offsets": dict(previous.offsets)}
    return {"batch_id": batch_id, "rows": rows, _PREVIOUS: prev}


def rescaled_position(version: int, positions: Mapping[int, Any]) -> dict[str, Any]:
    """The ``input_position`` of every task after ``localstate rescale`` of a job run by
    :class:`StatefulJob` (``rescale(config, to, input_position=rescaled_position)``).

    The runner's positions are per task (rows consumed, the checkpoint to roll back
    to) while the input position that matters — Spark's, per micro-batch — is one for
    the whole job: the version all old tasks committed. The new tasks record that
    version with no rollback record, so a re-run of that very batch is refused (the
    state before it no longer exists per new task) instead of applied to wrong state:
    stop the query cleanly (its last batch committed in Spark's checkpoint) before
    rescaling.
    """
    return {"batch_id": version, "rows": 0, _RESCALED: len(positions)}


def _lock(config: Config, partition: int, lock_wait_s: float) -> FileLock:
    # The same lock file TaskStorage takes, so no attempt of the task runs meanwhile.
    locks = config.state_dir / config.job_name / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            return FileLock(
                locks / f"partition-{partition}.lock",
                f"task {config.job_name}/partition {partition} (state dir {config.state_dir})",
            )
        except StoreLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def prepare_version(config: Config, partition: int, batch_id: int, lock_wait_s: float = 60.0) -> bool:
    """Make task ``partition`` ready to apply micro-batch ``batch_id``; True if it rolled back.

    Rolls the task checkpoint back when it already holds ``batch_id`` (see the module
    docstring); raises :class:`LocalStateError` when it is ahead of ``batch_id``.
    """
    lock = _lock(config, partition, lock_wait_s)
    system = open_system(config, config.checkpoint_system)
    try:
        store = system.checkpoints()
        current = store.read(config.job_name, partition)
        if current is None or current.version < batch_id:
            return False
        pos = current.input_position
        if current.version == batch_id and isinstance(pos, dict) and _RESCALED in pos:
            raise LocalStateError(
                f"job {config.job_name!r} partition {partition}: micro-batch {batch_id} is the batch the job was "
                f"rescaled at (from {pos[_RESCALED]} tasks); its input cannot be applied again because the state "
                "before it exists only for the old tasks. Run the next batch (version "
                f"{batch_id + 1}), or restore the pre-rescale state to re-run it"
            )
        if current.version > batch_id or not isinstance(pos, dict) or _PREVIOUS not in pos:
            raise LocalStateError(
                f"job {config.job_name!r} partition {partition}: localstate committed version "
                f"{current.version} but Spark is running micro-batch {batch_id}; the state is ahead of "
                "the streaming checkpoint (was the checkpoint location reset or shared with another "
                "query?). Use the checkpoint location that produced this state, or a new job.name / "
                "fresh state to start over"
            )
        prev = pos[_PREVIOUS]
        # Every store the current checkpoint names stays named (at offset 0 if it had
        # no commit before): a store missing from a checkpoint while its changelog
        # holds records is refused as damage on open.
        zeros = dict.fromkeys(current.offsets, 0)
        if prev is None:
            rollback = Checkpoint(version=-1, input_position=None, offsets=zeros, epoch=current.epoch,
                                  stores=current.stores)
        else:
            rollback = Checkpoint(
                version=prev["version"],
                input_position=prev["input_position"],
                offsets={**zeros, **prev["offsets"]},
                epoch=current.epoch,
                stores=current.stores,
            )
        store.write(config.job_name, partition, rollback)
        return True
    finally:
        try:
            system.close()
        finally:
            lock.release()


def committed_batches(config: Config) -> dict[int, int | None]:
    """Per partition: the micro-batch id its committed state includes (None: none yet)."""
    system = open_system(config, config.checkpoint_system)
    try:
        store = system.checkpoints()
        out: dict[int, int | None] = {}
        for p in range(config.partitions):
            ckpt = store.read(config.job_name, p)
            out[p] = ckpt.version if ckpt is not None and ckpt.version >= 0 else None
        return out
    finally:
        system.close()


def start(
    job: StatefulJob,
    stream_df: DataFrame,
    *,
    checkpoint_location: str,
    trigger: dict[str, Any] | None = None,
    output: Callable[[DataFrame, int], None] | None = None,
) -> StreamingQuery:
    """Start ``job`` over ``stream_df`` with ``foreachBatch``; returns the running query.

    Each micro-batch ``B`` runs every task with commit version ``B``. ``output(df, B)``
    receives the batch's emitted rows (persisted, so evaluating them more than once
    does not re-run the tasks); without ``output`` the rows are computed and dropped.
    ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``
    or ``{"processingTime": "2 seconds"}``).
    """
    job._check_key(stream_df)  # noqa: SLF001 - same job, fail before starting the query

    def run_batch(df: DataFrame, batch_id: int) -> None:
        result = job.transform(df, batch_id=batch_id)
        if output is None:
            result.write.format("noop").mode("overwrite").save()
            return
        from pyspark import StorageLevel

        result = result.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result.count()
            output(result, batch_id)
        finally:
            result.unpersist()

    writer = stream_df.writeStream.foreachBatch(run_batch).option("checkpointLocation", checkpoint_location)
    writer = writer.queryName(f"localstate-{job.config.job_name}")
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()
