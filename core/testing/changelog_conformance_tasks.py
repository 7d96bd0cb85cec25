"""Conformance cases of a job's tasks side by side, and of a task kept open between runs,
on one changelog system (mixed into
:class:`localstate.testing.changelog_conformance.ChangelogSystemConformance`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from localstate.config import Config
from localstate.errors import CorruptionError
from localstate.storage import TaskStorage, open_system

from .changelog_kit import dump, on_another_machine

__all__ = ["KeptOpenCases", "TaskNeighbourCases"]

_TASKS = 4
_RUNS = 6


class _SuiteHooks:
    """What the cases here take from the suite they are mixed into."""

    def task_values(self, job_values: dict[str, Any], tmp_path: Path, factory: str = "memory") -> dict[str, Any]:
        raise NotImplementedError  # ChangelogSystemConformance.task_values


class TaskNeighbourCases(_SuiteHooks):
    """Cases of several tasks of one job at once; they need the suite's ``job_values``."""

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
        assert not any(t.is_alive() for t in threads), "a task's commits did not finish in 300 s"
        assert not errors, errors
        for p in range(_TASKS):
            with TaskStorage(on_another_machine(values, tmp_path, "reader"), p) as s:
                assert s.checkpoint.input_position == _RUNS, p
                assert dump(s) == {f"t{p}-k{i}": _RUNS * 100 + i for i in range(20)} | {f"t{p}-run": _RUNS}


class KeptOpenCases(_SuiteHooks):
    """Cases of a task kept open between runs (:mod:`localstate.kept_open`); they use the
    suite's fixtures and damage hooks."""

    def lose_newest_checkpoint(self, values: dict[str, Any]) -> None:
        raise NotImplementedError  # ChangelogSystemConformance.lose_newest_checkpoint

    def lose_stream(self, values: dict[str, Any], stream: str) -> None:
        raise NotImplementedError  # ChangelogSystemConformance.lose_stream

    def lose_everything(self, values: dict[str, Any]) -> None:
        raise NotImplementedError  # ChangelogSystemConformance.lose_everything

    def test_a_parked_open_is_reused_only_while_it_is_the_tasks_current_state(self, job_values, tmp_path):
        """A task kept open between runs (:mod:`localstate.kept_open`) is handed back as it
        is only while no other instance opened the task: once another machine took the task
        over (asking the parked one to let go of its lock, or fencing it) and committed, the
        parked open is not reused; the task opens again at that commit. On a system that
        fences, an instance that opened the task meanwhile but committed nothing is fenced
        in turn when the kept one is taken back (it is the newest again, as a fresh open
        would be). A system that can do neither never parks a storage (it would be the older
        instance beside a concurrent fresh open)."""
        from localstate.errors import FencedError
        from localstate.kept_open import KeptStorages

        values = self.task_values(job_values, tmp_path)
        config = Config.from_dict(values)
        kept = KeptStorages()
        try:
            a = TaskStorage(config)
            a.store("kv").put("x", 1)
            a.commit(input_position=1)
            system = open_system(config, config.checkpoint_system)
            keeps, exclusive = system.keeps_open, system.exclusive_writer_lock
            system.close()
            if not keeps:
                assert not kept.park(a)
                a.close()
                return
            assert kept.park(a)
            assert kept.take(config, 0) is a and kept.reused == 1  # no one else: as it is
            a.store("kv").put("x", 2)
            a.commit(input_position=2)
            assert kept.park(a)
            if not exclusive:
                # a zombie opens the task meanwhile (fencing the kept instance) but has not
                # committed when the kept one is taken back: the zombie is fenced now
                zombie = TaskStorage(on_another_machine(values, tmp_path, "machine-z"))
                zombie.store("kv").put("x", 99)
                assert kept.take(config, 0) is a and kept.reused == 2
                with pytest.raises(FencedError):
                    zombie.commit(input_position=9)
                zombie.close()
                assert a.store("kv").get("x") == 2
                assert kept.park(a)
            with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as b:
                assert b.store("kv").get("x") == 2 and b.checkpoint.input_position == 2
                b.store("kv").put("x", 3)
                b.commit(input_position=3)
            assert kept.take(config, 0) is None  # closed when asked, or found stale
            with TaskStorage(config) as c:
                assert c.store("kv").get("x") == 3 and c.checkpoint.input_position == 3
        finally:
            kept.close_all()

    @pytest.mark.parametrize("lost", ["checkpoint", "stream", "everything"])
    def test_a_parked_open_is_not_reused_once_its_checkpoint_or_changelog_was_lost(self, job_values, tmp_path, lost):
        """A task kept open between runs whose newest checkpoint, changelog stream or whole
        system was lost while it was parked is not handed back (it would go on writing as
        if nothing was lost): it is closed, and the task's next open is the error naming
        the recovery, as without keep-open."""
        from localstate.kept_open import KeptStorages

        values = self.task_values(job_values, tmp_path)
        config = Config.from_dict(values)
        kept = KeptStorages()
        try:
            a = TaskStorage(config)
            for i in range(5):
                a.store("kv").put(f"k{i}", i)
            a.commit(input_position=1)
            if not kept.park(a):  # a system that never keeps a task open
                a.close()
                return
            if lost == "checkpoint":
                self.lose_newest_checkpoint(values)
            elif lost == "stream":
                self.lose_stream(values, values["stores.kv.changelog"].split(".", 1)[1])
            else:
                self.lose_everything(values)
            assert kept.take(config, 0) is None
            with pytest.raises(CorruptionError, match=r"localstate restore|--reset"):
                TaskStorage(config)
        finally:
            kept.close_all()
