"""The engine half of the plug-in contract, as a pytest class plug-in authors subclass.

:class:`~localstate.testing.KeyValueStoreConformance` checks what a store *answers*;
this class checks what an engine must do for **fault tolerance**: rebuild exactly the
last commit from its changelog (into an empty engine and over a stale local copy),
never trust local state that changed after its last ``checkpoint``, survive an
uncommitted close and a SIGKILL. An engine that trusts a stale stored offset passes
every key-value test and fails here::

    from localstate.testing import StorageEngineConformance

    class TestMine(StorageEngineConformance):
        engine = "mypkg.engine:MyFactory"      # or a registered name

Non-key-value engines need a workload adapter
(:func:`localstate.testing.torture.register_adapter`); key-value engines use the
built-in one. ``crash_trials`` sets how many SIGKILL trials the last test runs
(``localstate torture --engine mypkg.engine:MyFactory --trials 200`` runs many more).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
from localstate.config import Config
from localstate.layout import store_dir
from localstate.storage import TaskStorage

from . import torture as T
from .torture_work import batch_rng, norm, work

__all__ = ["StorageEngineConformance"]


class StorageEngineConformance:
    """Subclass and set ``engine`` (a registered name or ``"module:Factory"``)."""

    engine: ClassVar[str] = ""
    crash_trials: ClassVar[int] = 2
    batches: ClassVar[int] = 6

    # -- helpers -------------------------------------------------------------------------
    def _plan(self) -> T.TrialPlan:
        if not self.engine:
            raise TypeError(f"{type(self).__name__} must set the class attribute `engine`")
        return T.TrialPlan(seed=7, engine=self.engine, changelog="file", batches=self.batches, ops=40,
                           keys=30, compact_every=0, retention_ms=86_400_000, faults=())

    def _config(self, root: Path) -> Config:
        return Config.from_dict(self._plan().values(root, None, "conf"))

    def _local_dir(self, config: Config) -> Path:
        return store_dir(config, T.STORE, 0).parent

    def _run(self, config: Config, until: int | None = None) -> list[Any]:
        """Apply the workload from the committed position up to batch ``until``; returns
        what the store showed after each commit."""
        plan = self._plan()
        if until is not None:
            plan = T.TrialPlan(**{**plan.__dict__, "batches": until})
        adapter = T.adapter_for(self.engine)
        states: list[Any] = []
        with TaskStorage(config) as s:
            store = s.store(T.STORE)
            work(s, plan, adapter, lambda _b: states.append(norm(adapter.observe(store, plan.keys))))
        return states

    def _observe(self, config: Config) -> tuple[int, Any]:
        adapter = T.adapter_for(self.engine)
        with TaskStorage(config) as s:
            pos = s.checkpoint.input_position if s.checkpoint else 0
            return pos, norm(adapter.observe(s.store(T.STORE), self._plan().keys))

    # -- the contract ---------------------------------------------------------------------
    def test_reopen_with_its_local_copy_is_the_last_commit(self, tmp_path: Path) -> None:
        config = self._config(tmp_path)
        states = self._run(config)
        assert self._observe(config) == (self.batches, states[-1])

    def test_restore_into_an_empty_engine_is_the_last_commit(self, tmp_path: Path) -> None:
        config = self._config(tmp_path)
        states = self._run(config)
        shutil.rmtree(self._local_dir(config), ignore_errors=True)
        assert self._observe(config) == (self.batches, states[-1])

    def test_restore_over_a_stale_local_copy_is_the_last_commit(self, tmp_path: Path) -> None:
        """A local copy from an earlier commit (a task moved back to a machine it left):
        ``prepare_restore`` may start from it, and ``restore`` then applies records
        into a non-empty engine."""
        config = self._config(tmp_path)
        self._run(config, until=2)
        stale = tmp_path / "stale-copy"
        shutil.copytree(self._local_dir(config), stale)
        states = self._run(config)
        shutil.rmtree(self._local_dir(config))
        shutil.copytree(stale, self._local_dir(config))
        assert self._observe(config) == (self.batches, states[-1])

    def test_an_uncommitted_close_is_never_visible(self, tmp_path: Path) -> None:
        """The trap: closing without a commit still pushes cached writes into the engine.
        An engine that keeps the offset of its last checkpoint after such writes (instead
        of invalidating it at the first write) restores them as if committed."""
        config = self._config(tmp_path)
        states = self._run(config, until=3)
        plan = self._plan()
        adapter = T.adapter_for(self.engine)
        with TaskStorage(config) as s:
            for batch in (4, 5):  # applied, flushed into the engine, never committed
                adapter.apply_batch(s.store(T.STORE), batch, batch_rng(99, batch), plan.ops, plan.keys)
            view = s.store(T.STORE)
            if hasattr(view, "flush"):
                view.flush()
        assert self._observe(config) == (3, states[-1])
        # and the same after another commit on top
        states = self._run(config)
        assert self._observe(config) == (self.batches, states[-1])

    def test_a_checkpoint_at_every_commit_survives_reopen_without_replay(self, tmp_path: Path) -> None:
        config = self._config(tmp_path)
        self._run(config)
        with TaskStorage(config) as s:
            first = s.last_restore[T.STORE]
        with TaskStorage(config) as s:
            again = s.last_restore[T.STORE]
        # an engine that snapshots replays nothing the second time; one that starts
        # empty replays everything both times: either way, the same amount
        assert again.records <= first.records

    def test_sigkill_trials_lose_nothing(self, tmp_path: Path) -> None:
        if self.crash_trials <= 0:
            pytest.skip("crash_trials = 0")
        report = T.run_trials(self.engine, "file", self.crash_trials, seed=4242, workdir=tmp_path,
                              batches=self.batches, ops=30, jobs=1)
        summary = report.summary()
        assert summary["divergences"] == 0, summary["first_divergence"]
