"""Corruption at the task level: every damaged file either recovers automatically (tail
cut back, store rebuilt from the changelog) with a warning, or raises a clear
CorruptionError naming the file (and byte offset) — never silently wrong data.

Stores are written through the torture workloads (three commits, several changelog
segments), damaged while the task is stopped, and reopened.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage, layout
from localstate.errors import CorruptionError, LocalStateError
from localstate.storage import Recovery
from localstate.testing import torture as T
from localstate.testing.torture_work import norm, work

COMMITS = 6


def setup_task(tmp: Path, engine: str = "memory", commits: int = COMMITS) -> tuple[Config, list[Any], T.WorkloadAdapter]:
    """A task with ``commits`` commits; returns its config, the state after each commit."""
    plan = T.TrialPlan(seed=3, engine=engine, changelog="file", batches=commits, ops=60, keys=40,
                       compact_every=0, retention_ms=86_400_000, faults=())
    adapter = T.adapter_for(engine)
    config = Config.from_dict(plan.values(tmp, None, ""))
    states: list[Any] = []
    with TaskStorage(config) as s:
        store = s.store(T.STORE)
        states.append(norm(adapter.observe(store, plan.keys)))
        work(s, plan, adapter, lambda _b: states.append(norm(adapter.observe(store, plan.keys))))
    return config, states, adapter


def reopen(config: Config, adapter: T.WorkloadAdapter, recovery: Recovery | None = None) -> tuple[int, Any]:
    with TaskStorage(config, recovery=recovery) as s:
        pos = s.checkpoint.input_position if s.checkpoint else 0
        return pos, norm(adapter.observe(s.store(T.STORE), 40))


def segments(config: Config) -> list[Path]:
    root = Path(config.systems["file"]["path"])
    return sorted(root.glob(f"*-{T.STORE}/0/*.log"))


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def checkpoint_files(config: Config) -> tuple[Path, Path]:
    d = Path(config.systems["file"]["path"]) / "_checkpoints" / config.job_name
    return d / "partition-0.ckpt", d / "partition-0.ckpt.prev"


@pytest.fixture
def task(tmp_path):
    config, states, adapter = setup_task(tmp_path)
    assert len(segments(config)) >= 3, "the workload should span several segments"
    return config, states, adapter


def test_torn_tail_after_last_commit_is_cut_back_with_a_warning(task, caplog):
    config, states, adapter = task
    last = segments(config)[-1]
    with open(last, "ab") as f:
        f.write(b"LS\x01\x00" + os.urandom(40))  # a batch the crash tore in half
    with caplog.at_level(logging.WARNING):
        assert reopen(config, adapter) == (COMMITS, states[COMMITS])
    assert "torn or corrupt tail" in caplog.text and str(last) in caplog.text


def test_torn_committed_batch_is_refused_not_silently_dropped(task):
    config, _states, adapter = task
    last = segments(config)[-1]
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size - 10)  # the end of the last committed batch is gone
    damaged = last.read_bytes()
    with pytest.raises(CorruptionError, match="cannot be read.*Nothing was changed") as e:
        reopen(config, adapter)
    assert str(last) in str(e.value) and "--accept-log-end" in str(e.value)
    assert last.read_bytes() == damaged  # nothing at or below a committed offset is cut


def test_flipped_byte_in_the_last_committed_batch_changes_nothing_on_disk(task):
    """Issue 14 case 4: a flipped byte in the last, committed batch of the active segment
    looked like a torn tail and was truncated (30 committed records) before the error."""
    config, states, adapter = task
    last = segments(config)[-1]
    data = last.read_bytes()
    flip(last, len(data) - 5)
    damaged = last.read_bytes()
    with pytest.raises(CorruptionError, match="committed"):
        reopen(config, adapter)
    assert last.read_bytes() == damaged
    # the operator keeps what is readable, explicitly: the state of some earlier commit's prefix
    pos, _state = reopen(config, adapter, Recovery(accept_log_end={T.STORE}))
    assert pos == COMMITS


def test_flipped_byte_inside_the_active_segment_names_file_and_byte(task):
    config, _states, adapter = task
    last = segments(config)[-1]
    flip(last, 40)  # inside the first batch's payload; good batches follow
    with pytest.raises(CorruptionError, match=r"corrupt at byte 0 .*not a torn tail") as e:
        reopen(config, adapter)
    assert str(last) in str(e.value)


def test_flipped_byte_in_a_closed_segment_payload_fails_the_crc_on_restore(task):
    config, _states, adapter = task
    first = segments(config)[0]
    flip(first, 100)
    with pytest.raises(CorruptionError, match=r"at byte \d+ \(offset \d+\) fails its CRC32") as e:
        reopen(config, adapter)
    assert str(first) in str(e.value)


def test_flipped_header_byte_in_a_closed_segment_is_detected_on_open(task):
    config, _states, adapter = task
    first = segments(config)[0]
    flip(first, 0)  # the magic of the first batch
    with pytest.raises(CorruptionError, match="corrupt at byte 0") as e:
        reopen(config, adapter)
    assert str(first) in str(e.value)


def test_truncated_closed_segment_is_detected(task):
    config, _states, adapter = task
    first = segments(config)[0]
    with open(first, "r+b") as f:
        f.truncate(first.stat().st_size // 2)
    with pytest.raises(CorruptionError) as e:
        reopen(config, adapter)
    assert str(first) in str(e.value) or "are missing" in str(e.value)


def test_deleted_middle_segment_is_detected(task):
    config, _states, adapter = task
    segs = segments(config)
    segs[1].unlink()
    with pytest.raises(CorruptionError, match="are missing") as e:
        reopen(config, adapter)
    assert segs[2].name in str(e.value)


def test_deleted_last_segment_is_detected(task):
    config, _states, adapter = task
    segments(config)[-1].unlink()
    with pytest.raises(CorruptionError, match="committed records are missing"):
        reopen(config, adapter)


def test_deleted_whole_changelog_with_a_checkpoint_is_detected(task):
    config, _states, adapter = task
    for seg in segments(config):
        seg.unlink()
    with pytest.raises(CorruptionError, match="committed records are missing"):
        reopen(config, adapter)


def test_corrupt_checkpoint_is_refused_and_the_previous_one_is_used_only_when_asked(task):
    config, states, adapter = task
    current, prev = checkpoint_files(config)
    flip(current, 20)
    before = {p: p.read_bytes() for p in segments(config)}
    with pytest.raises(CorruptionError, match="--use-previous-checkpoint") as e:
        reopen(config, adapter)
    assert str(current) in str(e.value)
    assert {p: p.read_bytes() for p in segments(config)} == before
    pos, state = reopen(config, adapter, Recovery(use_previous_checkpoint=True))
    assert pos == COMMITS - 1 and state == states[COMMITS - 1]
    # replaying the input from the previous checkpoint's position gives the same end state
    plan = T.TrialPlan(seed=3, engine="memory", changelog="file", batches=COMMITS, ops=60, keys=40,
                       compact_every=0, retention_ms=86_400_000, faults=())
    with TaskStorage(config) as s:
        work(s, plan, adapter)
    assert reopen(config, adapter) == (COMMITS, states[COMMITS])


def test_both_checkpoints_corrupt_is_an_error_not_an_empty_store(task):
    config, _states, adapter = task
    for path in checkpoint_files(config):
        path.write_bytes(b"garbage")
    with pytest.raises(CorruptionError, match="is corrupt") as e:
        reopen(config, adapter)
    assert "partition-0.ckpt" in str(e.value)
    with pytest.raises(CorruptionError, match="is corrupt"):
        reopen(config, adapter, Recovery(use_previous_checkpoint=True))


def test_truncated_checkpoint_is_refused(task):
    config, states, adapter = task
    current, _prev = checkpoint_files(config)
    current.write_bytes(current.read_bytes()[:15])
    with pytest.raises(CorruptionError, match="is corrupt"):
        reopen(config, adapter)
    assert reopen(config, adapter, Recovery(use_previous_checkpoint=True)) == (COMMITS - 1, states[COMMITS - 1])


def test_corrupt_compaction_state_names_the_file(task):
    config, _states, adapter = task
    meta = segments(config)[0].parent / "compaction.json"
    meta.write_text("{not json")
    with pytest.raises(CorruptionError, match="compaction.json is corrupt"):
        reopen(config, adapter)


def test_corrupt_stream_metadata_names_the_file(task):
    config, _states, adapter = task
    meta = segments(config)[0].parent.parent / "stream.json"
    meta.write_text("[]")
    with pytest.raises(CorruptionError, match="stream.json is corrupt"):
        reopen(config, adapter)


def test_stray_file_in_the_changelog_directory_is_refused(task):
    config, _states, adapter = task
    (segments(config)[0].parent / "notes.log").write_text("hello")
    with pytest.raises(CorruptionError, match="unexpected file .*notes.log"):
        reopen(config, adapter)


# -- engines with local files --------------------------------------------------------------------------
LOCAL_ENGINES = [e for e in T.torture_engines() if e not in ("memory", "topn", "hyperloglog", "bloom",
                                                               "localstate.contrib.latest_events:LatestEventsFactory")]


def _damage(store_dir: Path, how: str) -> int:
    files = sorted(p for p in store_dir.rglob("*") if p.is_file())
    for p in files:
        size = p.stat().st_size
        if how == "flip" and size:
            data = bytearray(p.read_bytes())
            for at in range(0, size, max(1, size // 16)):
                data[at] ^= 0x5A
            p.write_bytes(bytes(data))
        elif how == "truncate":
            with open(p, "r+b") as f:
                f.truncate(size // 2)
        elif how == "delete":
            p.unlink()
    return len(files)


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("engine", LOCAL_ENGINES)
def test_damaged_local_engine_files_rebuild_or_raise_never_wrong(tmp_path, engine, how):
    """Corrupt RocksDB/LevelDB/tantivy/SQLite files: the reopened store either equals the
    last commit (rebuilt from the changelog) or the error names the store's path."""
    config, states, adapter = setup_task(tmp_path, engine, commits=3)
    store_dir = layout.store_dir(config, T.STORE, 0)
    assert _damage(store_dir, how) > 0, f"{engine} keeps no local files"
    try:
        result = reopen(config, adapter)
    except LocalStateError as e:
        assert str(store_dir) in str(e) or "store" in str(e), str(e)
        if isinstance(e, CorruptionError):
            return
        # an engine refusing to open a damaged directory must say so and be fixable by a rebuild
        shutil.rmtree(store_dir)
        result = reopen(config, adapter)
    assert result == (3, states[3])


def test_inspect_reports_corruption_instead_of_failing(task):
    config, _states, _adapter = task
    from localstate.inspect import inspect_path

    flip(segments(config)[0], 0)
    report = inspect_path(Path(config.systems["file"]["path"]))
    row = next(p for p in report["partitions"] if p["stream"].endswith(f"-{T.STORE}"))
    assert "corrupt" in row["error"]
    assert json.dumps(report, default=str)


# -- zombie keys: a stale local snapshot must not resurrect a deleted key ----------------------------------
DELETE_ENGINES = [e for e in T.torture_engines()
                  if isinstance(T.adapter_for(e), (T.KeyValueWorkload, T.SearchWorkload))]


def _settled(op: Any, *args: Any, **kwargs: Any) -> None:
    # tantivy removes obsolete/temporary index files for a moment after the store is
    # closed; retry a directory operation that raced with it
    for attempt in range(50):
        try:
            op(*args, **kwargs)
            return
        except OSError:
            if attempt == 49:
                raise
            time.sleep(0.05)


def settled_copy(src: Path, dst: Path) -> None:
    def copy() -> None:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".tmp*"))

    _settled(copy)


def settled_rmtree(path: Path) -> None:
    _settled(shutil.rmtree, path)


@pytest.mark.parametrize("engine", DELETE_ENGINES)
def test_deleted_key_stays_deleted_after_compaction_and_an_old_local_snapshot(tmp_path, engine):
    """Delete a key, compact past the tombstone retention (0 ms), then put back a copy of
    the store's local files from before the delete: the reopened store must not show the
    key (the snapshot is older than the compaction horizon, so it is rebuilt)."""
    plan = T.TrialPlan(seed=9, engine=engine, changelog="file", batches=1, ops=1, keys=1,
                       compact_every=0, retention_ms=0, faults=())
    adapter = T.adapter_for(engine)
    # nothing shipped beside the log: the stale local copy is the only snapshot there is
    config = Config.from_dict({**plan.values(tmp_path, None, ""), "systems.file.snapshots": False})
    store_dir = layout.store_dir(config, T.STORE, 0)

    def put(store: Any, key: str, i: int) -> None:
        if isinstance(adapter, T.SearchWorkload):
            store.index(key, {"words": f"w{i % 8}", "n": i})
        else:
            store.put(key, {"n": i, "ops": []})

    def write(s: TaskStorage, start: int, n: int) -> None:
        store = s.store(T.STORE)
        for i in range(start, start + n):
            put(store, f"filler{i}", i)
        s.commit(input_position=start + n)

    with TaskStorage(config) as s:
        put(s.store(T.STORE), "victim", 1)
        for r in range(4):
            write(s, r * 40, 40)
    old = tmp_path / "old-snapshot"
    settled_copy(store_dir, old)
    with TaskStorage(config) as s:
        s.store(T.STORE).delete("victim")
        s.commit(input_position=1000)
        for r in range(4):
            write(s, 2000 + r * 40, 40)
        stats = s.compact()[T.STORE]
        assert stats["tombstones_dropped"] >= 1, stats
        assert "victim" not in adapter.observe(s.store(T.STORE), 1)
        expected = norm(adapter.observe(s.store(T.STORE), 1))
    settled_rmtree(store_dir)
    shutil.copytree(old, store_dir)
    with TaskStorage(config) as s:
        state = norm(adapter.observe(s.store(T.STORE), 1))
        assert "victim" not in state, "a deleted key came back from a stale snapshot"
        assert state == expected
        assert s.last_restore[T.STORE].start_offset == 0, "the stale snapshot should have been rebuilt"
