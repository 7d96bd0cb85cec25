"""Conformance cases of a job's tasks side by side on one changelog system (mixed into
:class:`localstate.testing.changelog_conformance.ChangelogSystemConformance`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.storage import TaskStorage

from .changelog_kit import dump, on_another_machine

__all__ = ["TaskNeighbourCases"]

_TASKS = 4
_RUNS = 6


class TaskNeighbourCases:
    """Cases of several tasks of one job at once; they need the suite's ``job_values``."""

    def task_values(self, job_values: dict[str, Any], tmp_path: Path, factory: str = "memory") -> dict[str, Any]:
        raise NotImplementedError  # ChangelogSystemConformance.task_values

    def test_tasks_committing_at_once_each_read_back_their_last_commit(self, job_values, tmp_path):
        """The tasks of a job commit at the same time, each opening afresh for every commit
        (a micro-batch's task run on a cluster: a new instance of the task, which fences
        the one before). Where the system keeps every task's checkpoint in one place (a
        shared Kafka checkpoint topic, one bucket), the commits overlap there; then a
        fresh open of every task, on a machine without its state, restores exactly that
        task's last commit and never waits on another task's."""
        values = {**self.task_values(job_values, tmp_path), "job.partitions": _TASKS}
        config = Config.from_dict(values)
        errors: list[BaseException] = []
        start = threading.Barrier(_TASKS)

        def task(p: int) -> None:
            try:
                start.wait(30)
                for run in range(1, _RUNS + 1):
                    with TaskStorage(config, p) as s:
                        kv = s.store("kv")
                        kv.put_all({f"t{p}-k{i}": run * 100 + i for i in range(20)})
                        kv.put(f"t{p}-run", run)
                        s.commit(input_position=run)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=task, args=(p,)) for p in range(_TASKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        for p in range(_TASKS):
            with TaskStorage(on_another_machine(values, tmp_path, "reader"), p) as s:
                assert s.checkpoint.input_position == _RUNS, p
                assert dump(s) == {f"t{p}-k{i}": _RUNS * 100 + i for i in range(20)} | {f"t{p}-run": _RUNS}
