"""``localstate rescale --spark``: read, route and write a job's state on Spark executors.

For state too large for one process: one Spark task per (store, old partition) reads
that partition's committed records and routes them (the same
:func:`localstate.rescale.route_old_task` the local path runs, so the same refusals);
``partitionBy`` then brings every new task's records of a store into exactly one
Spark partition, whose task merges and writes that new changelog partition into the
staging area. The driver holds the old tasks' locks throughout and writes the
checkpoints, the manifest and the swap (:func:`localstate.rescale.rescale`). The file
changelog must be on a file system every executor shares (as it must for the job).
For a kafka or objectstore changelog the writers write the new partitions straight into
the job's next generation (``generation``); the driver then writes its checkpoints and
the generation record (:mod:`localstate.rescale_generations`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from localstate import Checkpoint, LocalStateError
from localstate.rescale import route_old_task, write_task_partition

__all__ = ["stage_with_spark"]


def stage_with_spark(spark: Any, job: Any, ckpts: Mapping[int, Checkpoint],
                     generation: Any = None) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Write the new changelog partitions of every store of ``job`` with ``spark`` (into
    the staging area, or into ``generation`` of a kafka/objectstore changelog); returns
    ``(end offsets per store per new task, records per store)``."""
    config, old, new = job.config, job.old, job.new
    names = sorted(job.stores)
    slot = {name: i for i, name in enumerate(names)}
    tasks = [(name, p, ckpts[p]) for name in names for p in sorted(ckpts)]

    def route(task: tuple[str, int, Checkpoint]) -> Iterator[tuple[tuple[str, int], dict[bytes, bytes]]]:
        name, p, ckpt = task
        for q, records in enumerate(route_old_task(config, new, name, p, ckpt)):
            if records:
                yield (name, q), records

    def write(index: int, pieces: Iterator[tuple[tuple[str, int], dict[bytes, bytes]]]) -> Iterator[tuple[str, int, int, int]]:
        name, q = names[index // new], index % new
        end, count = write_task_partition(config, new, name, q, (part for _, part in pieces), generation)
        yield name, q, end, count

    sc = spark.sparkContext
    sc.setJobDescription(f"localstate rescale {config.job_name}: {old} -> {new} partitions")
    rows = (
        sc.parallelize(tasks, len(tasks))
        .flatMap(route)
        .partitionBy(len(names) * new, lambda key: slot[key[0]] * new + key[1])
        .mapPartitionsWithIndex(write)
        .collect()
    )
    ends: dict[str, list[int]] = {name: [0] * new for name in names}
    counts: dict[str, int] = dict.fromkeys(names, 0)
    for name, q, end, count in rows:
        ends[name][q] = end
        counts[name] += count
    if len(rows) != len(names) * new:
        raise LocalStateError(f"rescale on Spark wrote {len(rows)} of {len(names) * new} new changelog partitions")
    return ends, counts
