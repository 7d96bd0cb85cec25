"""A task's storage kept open between runs (:mod:`localstate.kept_open`) and the parked
locks under it (:class:`localstate.locking.FileLock`): parked only right after a commit,
given up to another process within milliseconds of its asking, closed when idle, never
reused once a lock file was replaced. The same cases on every changelog system are in the
conformance kit (``test_a_parked_open_is_reused_only_while_it_is_the_tasks_current_state``);
the Spark side in tests/test_spark_kept_open.py."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, StoreLockedError, TaskStorage
from localstate.inspect import lock_holder
from localstate.kept_open import KeptStorages
from localstate.layout import lock_path
from localstate.locking import FileLock


def _config(tmp_path: Path, cache: int = 0) -> Config:
    return Config.from_dict({
        "job.name": "kept",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.object.cache.size": cache,
    })


@pytest.fixture
def kept():
    k = KeptStorages()
    yield k
    k.close_all()


def _committed(config: Config, value: int) -> TaskStorage:
    s = TaskStorage(config)
    s.store("kv").put("x", value)
    s.commit(input_position=value)
    return s


def test_a_parked_storage_is_handed_back_as_it_is(tmp_path, kept):
    config = _config(tmp_path)
    s = _committed(config, 1)
    assert kept.park(s) and len(kept) == 1
    assert lock_holder(lock_path(config, 0)) is None  # parked: free to whoever takes it
    again = kept.take(config, 0)
    assert again is s and kept.reused == 1 and len(kept) == 0
    assert lock_holder(lock_path(config, 0)) is not None  # active again
    again.store("kv").put("x", 2)
    again.commit(input_position=2)
    again.close()
    with TaskStorage(config) as t:
        assert t.store("kv").get("x") == 2 and t.checkpoint.input_position == 2


@pytest.mark.parametrize("cache", [0, 1000])
def test_only_a_storage_with_nothing_written_since_its_commit_parks(tmp_path, kept, cache):
    config = _config(tmp_path, cache)
    s = _committed(config, 1)
    s.store("kv").put("x", 5)  # e.g. a task's close() writing after the commit
    assert not kept.park(s) and len(kept) == 0
    s.close()
    with TaskStorage(config) as t:
        assert t.store("kv").get("x") == 1  # the write after the commit was never committed
    never = TaskStorage(config)
    assert not kept.park(never)  # opened, never committed
    never.close()


def test_another_process_gets_a_parked_task_within_moments_and_sees_its_commit(tmp_path, kept):
    config = _config(tmp_path)
    assert kept.park(_committed(config, 7))
    code = textwrap.dedent(f"""
        import time
        from localstate import Config, TaskStorage
        config = Config.from_dict({config.to_dict()!r})
        start = time.monotonic()
        with TaskStorage(config) as s:
            print(s.store("kv").get("x"), time.monotonic() - start)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    value, seconds = out.stdout.split()
    assert value == "7" and float(seconds) < 5.0
    assert len(kept) == 0  # the watcher closed it when asked
    assert not lock_path(config, 0).with_name(lock_path(config, 0).name + ".release").exists()


def test_an_actively_held_lock_is_still_refused_at_once(tmp_path):
    path = tmp_path / "x.lock"
    held = FileLock(path, "thing")
    start = time.monotonic()
    with pytest.raises(StoreLockedError, match="locked by pid"):
        FileLock(path, "thing")
    assert time.monotonic() - start < 0.5
    held.park()
    # a parked holder that never answers (no watcher here): the waiter gives up, refused
    start = time.monotonic()
    with pytest.raises(StoreLockedError):
        FileLock(path, "thing", parked_wait_s=0.2)
    assert 0.2 <= time.monotonic() - start < 2.0
    assert not held.release_requested()  # the waiter withdrew its request
    held.release()


def test_an_idle_parked_storage_closes_by_itself(tmp_path, kept):
    config = _config(tmp_path)
    assert kept.park(_committed(config, 3), keep_s=0.05)
    deadline = time.monotonic() + 5
    while len(kept) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(kept) == 0
    assert kept.take(config, 0) is None
    with TaskStorage(config) as t:  # closed cleanly: the lock is free, the state exact
        assert t.store("kv").get("x") == 3


def test_a_parked_storage_whose_lock_file_was_replaced_is_not_reused(tmp_path, kept):
    config = _config(tmp_path)
    assert kept.park(_committed(config, 4))
    path = lock_path(config, 0)
    path.unlink()  # e.g. an operator deleting .locks: another process could lock a new file
    path.touch()
    assert kept.take(config, 0) is None and kept.reopened == 1
    with TaskStorage(config) as t:
        assert t.store("kv").get("x") == 4


def test_a_parked_storage_of_another_config_is_not_reused(tmp_path, kept):
    config = _config(tmp_path)
    assert kept.park(_committed(config, 4))
    changed = config.with_overrides({"stores.kv.object.cache.size": 5000})
    assert kept.take(changed, 0) is None and kept.reopened == 1
    with TaskStorage(changed) as t:
        assert t.store("kv").get("x") == 4


def _hourly_runs(tmp_path: Path, keep_open_s: float, monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None,
                 task: str = "PageViewsPerHour") -> tuple[list[list[dict]], Config]:
    """The hourly job (``task``: the hand-written one or the built-in windows' one) over 12 micro-batches of one task in this process, as a reused
    Spark worker runs them (``SPARK_REUSE_WORKER``); ``fail_at``: that batch's first try
    fails after its input (a retry then runs it)."""
    import numpy as np
    import pyarrow as pa
    from localstate.contrib.spark import job_windowed, runner
    from localstate.contrib.spark.jobs import job_config

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    job = getattr(job_windowed, task)
    config = job_config(job, tmp_path / f"keep-{keep_open_s}", partitions=1, engine="rocksdb")
    schema = pa.schema([("window_start", pa.int64()), ("user_id", pa.string()), ("views", pa.int64())])
    rng = np.random.default_rng(7)
    outputs = []
    for b in range(12):  # 20 minutes of events per batch, 300 users, a little disorder
        ts = np.sort(rng.integers(b * 1200, (b + 1) * 1200, 800)) - rng.integers(0, 120, 800)
        batch = pa.record_batch({"ts": pa.array(np.maximum(ts, 0), pa.int64()),
                                 "user_id": pa.array([f"u{i}" for i in rng.integers(0, 300, 800)])})
        run = runner.TaskRun(config, job, schema, batch_id=b, keep_open_s=keep_open_s)
        if b == fail_at:
            def failing(first: pa.RecordBatch) -> Any:
                yield first
                raise RuntimeError("the input broke")
            with pytest.raises(RuntimeError):
                list(runner.run_partition(run, 0, failing(batch)))
        outputs.append(pa.Table.from_batches(list(runner.run_partition(run, 0, iter([batch]))), schema).to_pylist())
    return outputs, config


@pytest.mark.parametrize("task", ["PageViewsPerHour", "PageViewsPerHourWindowed"])
@pytest.mark.parametrize("fail_at", [None, 5])
def test_the_hourly_jobs_memo_of_open_windows_gives_the_stores_answers(tmp_path, monkeypatch, fail_at, task):
    """With its storage kept open between micro-batches an hourly job (hand-written, or on
    the built-in windows' Arrow fold) looks the open windows it wrote up in memory
    (OpenWindowMemo in TaskContext.memo) instead of the store: the same output, batch for
    batch, and the same state as opening every run afresh — also when a run fails half
    way (the storage is closed, the memo with it) and is retried."""
    from localstate.kept_open import kept_storages

    try:
        before = kept_storages().reused
        kept, config = _hourly_runs(tmp_path, 60.0, monkeypatch, fail_at, task)
        assert kept_storages().reused - before >= 10
        memo = kept_storages().storages()[0].memo
        assert any(isinstance(v, dict) and len(v) > 100 for v in memo.values()), memo.keys()  # the memo was used
        fresh, fresh_config = _hourly_runs(tmp_path, 0, monkeypatch, fail_at, task)
    finally:
        kept_storages().close_all()
    assert kept == fresh and sum(map(len, kept)) > 300
    with TaskStorage(config) as a, TaskStorage(fresh_config) as b:
        with a.store("hourly").all() as x, b.store("hourly").all() as y:
            assert list(x) == list(y)


def test_a_parked_storage_whose_state_dir_was_deleted_is_closed_quietly(tmp_path, kept, caplog):
    import shutil

    config = _config(tmp_path)
    assert kept.park(_committed(config, 4))
    shutil.rmtree(tmp_path / "state")
    deadline = time.monotonic() + 5
    while len(kept) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(kept) == 0
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "kept-open" in r.getMessage()]


def test_a_parked_storage_whose_job_root_was_deleted_closes_without_warnings(tmp_path, kept, caplog):
    """A notebook or test that removes a job's whole root (state and file changelog) while
    a worker still parks one of its tasks: nothing to warn about at the close."""
    import shutil

    config = _config(tmp_path)
    assert kept.park(_committed(config, 4))
    shutil.rmtree(tmp_path / "state")
    shutil.rmtree(tmp_path / "changelog")
    deadline = time.monotonic() + 5
    while len(kept) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(kept) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_release_request_left_behind_is_withdrawn_by_the_next_release(tmp_path):
    path = tmp_path / "x.lock"
    held = FileLock(path, "thing")
    held.release_path.touch()  # a waiter that died before withdrawing its request
    held.release()
    again = FileLock(path, "thing")
    again.park()
    assert not again.release_requested()  # the next parked holder is not asked by a ghost
    again.release()


def test_an_error_while_taking_a_parked_storage_back_closes_it(tmp_path, kept):
    config = _config(tmp_path)
    assert kept.park(_committed(config, 6))

    def broken(_storage: TaskStorage) -> bool:
        raise OSError("the check could not read")

    with pytest.raises(OSError, match="could not read"):
        kept.take(config, 0, broken)
    assert len(kept) == 0
    with TaskStorage(config) as t:  # closed, its locks free: the task opens at once
        assert t.store("kv").get("x") == 6


def test_a_parked_storage_frozen_out_of_the_collector_is_still_freed_when_closed(tmp_path, kept):
    """A reused Spark worker freezes what it holds, parked storages included, out of the
    cyclic collector (:func:`localstate.contrib.spark.task_run.freeze_worker_heap`); a
    storage closed after that must still go by reference counting alone (nothing makes a
    cycle through it), or every hand-over would leak the storage's objects."""
    import gc
    import weakref

    config = _config(tmp_path)
    s = _committed(config, 1)
    s.store("kv").get("x")
    assert kept.park(s)
    ref = weakref.ref(s)
    del s
    gc.freeze()
    try:
        assert kept.close_all() == 1
        assert ref() is None
    finally:
        gc.unfreeze()
