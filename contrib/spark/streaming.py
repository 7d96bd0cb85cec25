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

A batch run (``StatefulJob.run``) is the same protocol with a version of its own:
one past the tasks' committed version, so a re-evaluation or task retry is idempotent.

The interface the runner uses: :func:`open_version` before a task processes,
:func:`commit_version` after, :func:`next_version` for a batch run.

Hence every input record affects the state exactly once, and the state observed by
any batch never includes work Spark has not committed. Spark re-runs at most the
last batch, so one step of history is enough. A rollback costs a restore of the
partition (engines whose local snapshot is newer than the rolled-back offset
rebuild from the changelog).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localstate import (
    Checkpoint,
    Config,
    ConfigError,
    LocalStateError,
    TaskStorage,
)
from localstate.layout import LOCK_RETRY_S, task_lock
from localstate.locking import retry_while_locked
from localstate.reader import read_checkpoint_readonly
from localstate.store_open import open_system

__all__ = [
    "open_version",
    "stream_batch_id",
    "STREAM_BATCH_ID_PROPERTY",
    "commit_version",
    "next_version",
    "prepare_version",
    "stream_position",
    "committed_batches",
    "rescaled_position",
]

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


def prepare_version(config: Config, partition: int, batch_id: int, lock_wait_s: float = 60.0) -> bool:
    """Make task ``partition`` ready to apply micro-batch ``batch_id``; True if it rolled back.

    Rolls the task checkpoint back when it already holds ``batch_id`` (see the module
    docstring); raises :class:`LocalStateError` when it is ahead of ``batch_id``.
    """
    lock = task_lock(config, partition, lock_wait_s)
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
            ckpt = read_checkpoint_readonly(store, config.job_name, p)  # the driver never fences a task
            out[p] = ckpt.version if ckpt is not None and ckpt.version >= 0 else None
        return out
    finally:
        system.close()


def open_version(config: Config, partition: int, version: int | None, lock_wait_s: float) -> TaskStorage:
    """Task ``partition``'s storage, ready to apply ``version`` (None: an unversioned run).

    The storage is opened first and its committed version checked with its locks held;
    in the normal case (committed version below ``version``) that is all. Otherwise —
    ``version`` committed already (a re-run batch, or another attempt of the task on
    another executor, with its own state dir and lock, committed it while this one
    waited for the changelog lock) or the state ahead — it is closed,
    :func:`prepare_version` rolls the checkpoint back (or raises), and it is opened
    again. (Checking before the open as well would cost every micro-batch of every task
    a second lock, checkpoint-system open and checkpoint read for the rare re-run.)
    """
    if version is None:
        return _open_task(config, partition, lock_wait_s)
    while True:
        storage = _open_task(config, partition, lock_wait_s)
        current = storage.checkpoint
        if current is None or current.version < version:
            return storage
        storage.close()
        prepare_version(config, partition, version, lock_wait_s)


def _open_task(config: Config, partition: int, lock_wait_s: float) -> TaskStorage:
    """``TaskStorage(config, partition)``, retrying for up to ``lock_wait_s`` while another
    attempt of the task holds one of its locks: the state-dir task lock, or — an attempt
    on another executor, with its own state dir — a changelog partition's."""
    return retry_while_locked(lambda: TaskStorage(config, partition), lock_wait_s, LOCK_RETRY_S)


def commit_version(storage: TaskStorage, version: int | None, rows: int) -> None:
    """Commit a task that applied ``rows`` input rows as ``version`` (None: an
    unversioned run, which counts the rows it has applied in total)."""
    previous = storage.checkpoint
    if version is None:
        before = previous.input_position if previous is not None else None
        done = before.get("rows", 0) if isinstance(before, dict) else 0
        storage.commit({"rows": done + rows})
    else:
        storage.commit(stream_position(version, rows, previous), version=version)


def next_version(config: Config, version: int | None = None) -> int:
    """The version a batch run commits: ``version`` if given (an int >= 0), else one
    past the tasks' committed version. Tasks at different versions mean an earlier run
    did not finish: an error naming the version to run again."""
    if version is not None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ConfigError(f"version must be an int >= 0, got {version!r}")
        return version
    committed = committed_batches(config)
    done = set(committed.values())
    if len(done) > 1:
        latest = max(v for v in done if v is not None)
        raise LocalStateError(
            f"job {config.job_name!r}: the tasks' committed versions differ ({committed}): an "
            f"earlier run (version {latest}) did not finish. Run it again with the same input to "
            f"complete it: job.run(df, version={latest}); tasks that committed it roll back and "
            "apply it again, the others apply it once"
            + (" (tasks without any commit beside committed ones: if the job was rescaled with "
               "`localstate rescale --to N`, set job.partitions = N)" if None in done else "")
        )
    (last,) = done if done else (None,)
    return 0 if last is None else last + 1


STREAM_BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The Spark local property holding the micro-batch id of the job a task belongs to
(set by Spark's micro-batch execution; tasks inherit the driver thread's properties)."""


def stream_batch_id() -> int:
    """The micro-batch id of the streaming query this Spark task computes."""
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    value = ctx.getLocalProperty(STREAM_BATCH_ID_PROPERTY) if ctx is not None else None
    if value is None:
        raise LocalStateError(
            "this plan runs localstate tasks inside a streaming query (StatefulJob.run_stream) but was "
            f"evaluated outside one (no Spark local property {STREAM_BATCH_ID_PROPERTY!r}): evaluate it "
            "only through the query, or use StatefulJob.run for a batch run"
        )
    return int(value)
