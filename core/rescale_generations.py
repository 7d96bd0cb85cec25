"""Where ``localstate rescale`` writes on a changelog that cannot swap streams in place.

A Kafka topic's partition count cannot shrink (and growing it moves keys to other
partitions); an object store has no rename. So the rescaled job is written beside the
old one, as the job's next :class:`~localstate.changelog.base.Generation` ``n``:

1. one changelog partition per new task and store in the stream ``<stream>.gen<n>``
   (a new topic with the new partition count; a new prefix), records sorted by key;
2. the new tasks' checkpoints, kept under the job name ``<job>.gen<n>``;
3. the generation record (Kafka: ``<job>/generation`` in the checkpoint topic, its own
   transaction; objectstore: ``_generations/<job>/<n>``, create-only) — **the commit
   point**: every open of the job reads it and maps stream and checkpoint names.

Until step 3 nothing the old job reads has changed (the old tasks were only fenced:
their next instance claims again), so a crash leaves the old job intact; a re-run
skips the numbers a crashed attempt used (its objects or topics are garbage, named in
the log) and writes ``n + 1``. After step 3 a re-run finds the job already rescaled.
A local copy of an old task left on another machine is tagged with the old generation,
so it is rebuilt, never loaded, for the new task with the same number
(:mod:`localstate.rescale_copies`). The old generation's data stays (Kafka topics: delete them
when satisfied; objectstore: deleted here after the switch, best effort).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .errors import ChangelogError, InvalidValueError
from .faults import fault_point
from .rescale_job import (
    RescaleJob,
    RescalePlan,
    RescaleStrategy,
    Stage,
    carried_event_time,
    drop_local_copies,
    streams,
)
from .store_open import open_system, store_meta

if TYPE_CHECKING:
    from .rescale import RescaleResult

__all__ = ["GenerationRescale"]

log = logging.getLogger("localstate.rescale")

_WRITE_CHUNK = 10_000


class GenerationRescale(RescaleStrategy):
    """Write the next generation beside the current one; one record switches the job."""

    def run(self, job: RescaleJob, plan: RescalePlan) -> RescaleResult:
        config = job.config
        if _already_done(job):
            drop_local_copies(config)  # a crash after the switch may have left some
            return plan.already_done(job.system.checkpoints().read(config.job_name, 0, fence=False))
        if job.old == job.new:
            raise InvalidValueError(f"job {config.job_name!r} already has {job.new} partitions: nothing to rescale")
        _check_generation(job)
        ckpts, version, position = plan.prepare()
        records = _write_generation(job, plan.stage(ckpts), version, position, ckpts)
        drop_local_copies(config)
        return plan.done(version, records)

    def write_partition(self, job: RescaleJob, target: Any, name: str, q: int, records: Mapping[bytes, bytes]) -> int:
        return _write_generation_partition(job, target, name, q, records)


def _already_done(job: RescaleJob) -> bool:
    """Whether the job's current generation is a finished rescale from ``old`` to ``new``."""
    g = job.system.generation()
    return g.number > 0 and g.partitions == job.new and g.previous_partitions == job.old


def _check_generation(job: RescaleJob) -> None:
    """Refuse a job whose current generation is at another count than ``job.partitions``."""
    g = job.system.generation()
    if g.number > 0 and g.partitions != job.old:
        raise ChangelogError(
            f"job {job.config.job_name!r}: its state was rescaled to {g.partitions} partitions (generation "
            f"{g.number} in {job.system.describe()}) but the config has job.partitions = {job.old}: rescale "
            "from the count the state is at. Nothing was changed."
        )


def _write_generation(job: RescaleJob, stage: Stage, version: int, position: Any,
                     ckpts: Mapping[int, Checkpoint]) -> dict[str, int]:
    """Write the job's next generation with ``stage`` and switch the job over to it;
    returns the records written per store."""
    from localstate.changelog.base import Generation

    current = job.system.generation()
    names = streams(job)
    number = current.number + 1
    while job.system.generation_used(Generation(number), names) or not job.system.claim_generation(number):
        log.warning("job %r: generation %d was taken by another rescale (running, or crashed part-way: then "
                    "%s stay as garbage); generation %d is written", job.config.job_name, number,
                    ", ".join(Generation(number).stream(s) for s in names), number + 1)
        number += 1
    ends, records = stage(Generation(number, job.new, job.old))
    # A system instance of its own, pinned to the new generation: its streams, its
    # checkpoint names and its writers' state never mix with the old generation's.
    target = open_system(job.config, job.system.name)
    try:
        target.pin_generation(Generation(number, job.new, job.old))
        meta = {name: store_meta(spec) for name, spec in job.stores.items()}
        epoch = max(c.epoch for c in ckpts.values()) + 1
        checkpoints = target.checkpoints()
        for q in range(job.new):
            offsets = {name: per_task[q] for name, per_task in ends.items()}
            checkpoints.write(job.config.job_name, q, Checkpoint(version=version, input_position=position,
                                                                 offsets=offsets, epoch=epoch, stores=meta,
                                                                 event_time=carried_event_time(ckpts)))
        fault_point("rescale.before_manifest")
        target.write_generation(Generation(number, job.new, job.old))
        fault_point("rescale.after_manifest")
    finally:
        target.close()
    _drop_old_generation(job, current)
    return records


def _write_generation_partition(job: RescaleJob, generation: Any, name: str, q: int,
                               records: Mapping[bytes, bytes]) -> int:
    """Write new task ``q``'s records of store ``name`` (sorted by key) into ``generation``;
    returns the committed end offset. Runs in the driver or on a Spark executor, through
    a system instance of its own pinned to ``generation``."""
    system = open_system(job.config, job.system.name)
    try:
        system.pin_generation(generation)
        part = system.open_partition(job.stores[name].changelog[1], q, job.new)  # type: ignore[index]
        try:
            items = sorted(records.items())
            for i in range(0, len(items), _WRITE_CHUNK):
                part.append(items[i:i + _WRITE_CHUNK])
            end = part.flush()
        finally:
            part.close()
    finally:
        system.close()
    fault_point("rescale.staging")
    return end


def _drop_old_generation(job: RescaleJob, old: Any) -> None:
    """Delete the old generation's data where its system does (objectstore; best effort:
    what is left is only garbage); Kafka topics stay: deleting topics is the operator's call."""
    if not job.system.drop_generation(old, streams(job)):
        log.warning("job %r: the old changelog streams (%s) are no longer used; delete them when satisfied",
                    job.config.job_name, ", ".join(old.stream(s) for s in streams(job)))
