"""Standby replicas on Spark: after each run, the standby executors follow.

With ``job.standby.replicas = 1`` and host affinity on (a cluster), the placement
registry names a standby executor for every Spark partition, another than its owner
(:meth:`~localstate.contrib.spark.placement.Placement.assign_standbys`). Once a run's
tasks committed — a batch :meth:`~localstate.contrib.spark.StatefulJob.run`, or a
streaming micro-batch — :func:`follow_standbys` runs one small Spark job: an RDD with one
partition per Spark partition, partition ``i`` preferring its standby executor
(:func:`~localstate.contrib.spark.placement.located`), whose task runs
:func:`localstate.standby.follow` for each of ``i``'s tasks in that executor's state dir.
The run waits for it, so a standby is at most one run behind its task: when the owner
is lost during run ``N``, its standby holds the commit of run ``N - 1`` and the moved
task replays at most run ``N``'s records (none after a loss mid-task, whose run had not
committed).

A follow task that Spark starts elsewhere (its executor stayed busy past
``spark.locality.wait``, or was lost) does nothing and says so; a follow that finds its
task's lock held, or fails, is reported, never fails the job: the standby is an
optimisation, the task's own open checks every copy (docs/design/standby.md).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from localstate import Config, LocalStateError

if TYPE_CHECKING:
    from pyspark import SparkContext

    from .placement import Placement

__all__ = ["follow_standbys", "MISPLACED", "FAILED"]

log = logging.getLogger("localstate")

MISPLACED = "misplaced"
"""A follow task Spark ran on another executor than the standby: nothing was done."""
FAILED = "failed"
"""A follow raised (damage it found, a full disk): reported with ``error``."""


def follow_standbys(sc: SparkContext, config: Config, placement: Placement, groups: list[list[int]],
                    executors: dict[str, str]) -> list[dict[str, Any]]:
    """Name each Spark partition's standby among the live ``executors`` (id → host) and
    have it follow ``groups[i]`` (the tasks Spark partition ``i`` runs); returns one
    report per task followed (:meth:`localstate.standby.FollowResult.to_dict`, with the
    ``executor`` and ``spark_partition``), or per follow task that ran elsewhere. Empty
    when ``job.standby.replicas`` is 0 or fewer than two executors live."""
    from .placement import located, location

    standbys = placement.assign_standbys(executors, config.standby_replicas)
    if not any(standbys):
        return []
    locations = [location(e, executors[e]) if e is not None else None for e in standbys]

    def follow_partition(items: Any) -> Any:
        from localstate.standby import follow

        from .task_run import executor_id, executor_state_dir

        me = executor_id()
        for i in items:
            if standbys[i] is None:
                continue
            if standbys[i] != me:
                yield {"spark_partition": i, "executor": me, "status": MISPLACED, "standby": standbys[i]}
                continue
            on_me = executor_state_dir(config, me)
            for task in groups[i]:
                t0 = time.perf_counter()
                try:
                    report = follow(on_me, task, executor=me).to_dict()
                except (LocalStateError, OSError) as e:
                    report = {"partition": task, "status": FAILED, "error": f"{type(e).__name__}: {e}",
                              "seconds": time.perf_counter() - t0}
                yield {**report, "executor": me, "spark_partition": i}

    sc.setJobDescription(f"localstate standby follow ({config.job_name})")
    try:
        return located(sc, locations).mapPartitions(follow_partition).collect()
    except Exception as e:  # a lost executor mid-follow: the next run's follow catches up
        log.warning("job %r: the standby follow did not complete (%s); standbys catch up after the next run",
                    config.job_name, e)
        return []
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
