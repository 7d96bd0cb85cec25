"""rocksdb's ``snapshot.interval.records``: commits between snapshots leave the memtable
alone, and every reopen still equals the last commit.

Real RocksDB files and a real file changelog; the crash is a real process exit without
close (``os._exit`` in a child), so nothing is flushed or snapshotted on the way out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from localstate import Config, TaskStorage
from localstate.errors import ConfigError


def _values(tmp_path: Path, interval: object = 50) -> dict[str, object]:
    return {
        "job.name": "si",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.si-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.rocksdb.snapshot.interval.records": interval,
    }


def _snapshot_offsets(tmp_path: Path) -> list[int]:
    snaps = tmp_path / "state" / "si" / "kv" / "0" / "snapshots"
    return sorted(int(p.name) for p in snaps.iterdir() if p.name.isdigit()) if snaps.is_dir() else []


def _write(storage: TaskStorage, start: int, n: int) -> None:
    store = storage.store("kv")
    for i in range(start, start + n):
        store.put(f"k{i}", {"i": i})


def _contents(storage: TaskStorage) -> dict:
    with storage.store("kv").all() as it:
        return dict(it)


def _expected(n: int) -> dict:
    return {f"k{i}": {"i": i} for i in range(n)}


def test_commits_below_the_interval_defer_and_one_past_it_snapshots(tmp_path):
    config = Config.from_dict(_values(tmp_path, 50))
    with TaskStorage(config) as s:
        _write(s, 0, 10)
        s.commit()
        first = s.committed_offset("kv")
        assert _snapshot_offsets(tmp_path) == [first]  # no snapshot yet: the first commit takes one
        for c in range(3):
            _write(s, 10 + 10 * c, 10)
            s.commit()
        assert _snapshot_offsets(tmp_path) == [first]  # 30 records < 50: deferred
        _write(s, 40, 30)
        s.commit()
        assert _snapshot_offsets(tmp_path) == [first, s.committed_offset("kv")]


def _claim(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "si" / "kv" / "0" / "db.clean").read_text())


def test_a_clean_close_after_a_commit_claims_the_commit_instead_of_a_snapshot(tmp_path):
    """The deferred snapshot is not taken at close (a task opened per micro-batch would take
    one per micro-batch): the claim names the commit and the records since the snapshot,
    and the next open keeps the live database and replays nothing."""
    config = Config.from_dict(_values(tmp_path, 1000))
    with TaskStorage(config) as s:
        _write(s, 0, 10)
        s.commit()
        first = s.committed_offset("kv")
        _write(s, 10, 10)
        s.commit()
        committed = s.committed_offset("kv")
    assert _snapshot_offsets(tmp_path) == [first]
    assert _claim(tmp_path) == {"offset": committed, "records": 10}
    with TaskStorage(config) as s:
        assert s.last_restore.get("kv") is None or s.last_restore["kv"].records == 0
        assert _contents(s) == _expected(20)


def test_micro_batches_carry_the_count_to_the_interval_and_a_crash_replays_at_most_that(tmp_path):
    """One open per micro-batch of 15 records, interval 40: the claims carry the records
    written since the newest snapshot from close to open, so a commit snapshots once 40 are
    reached (not never, not at every close); a crash after that replays from the newest
    snapshot, fewer records than the interval plus one batch."""
    config = Config.from_dict(_values(tmp_path, 40))
    offsets = []
    for b in range(8):
        with TaskStorage(config) as s:
            _write(s, 15 * b, 15)
            s.commit()
            offsets.append(s.committed_offset("kv"))
        assert _claim(tmp_path)["offset"] == offsets[-1]
    # the first commit snapshots; then one every third batch (15 + 15 + 15 >= 40), and
    # snapshots.keep (2) keeps the newest two
    assert _snapshot_offsets(tmp_path) == [offsets[3], offsets[6]]
    assert _claim(tmp_path)["records"] == 15
    child = textwrap.dedent("""
        import json, os, sys
        from localstate import Config, TaskStorage
        s = TaskStorage(Config.from_dict(json.loads(sys.argv[1])))
        for i in range(1000, 1020):
            s.store("kv").put(f"k{i}", {"i": i})
        s.store("kv").flush()  # uncommitted writes reach the engine before the crash
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", child, json.dumps(_values(tmp_path, 40))], check=True, timeout=120)
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records == offsets[7] - offsets[6] == 15
        assert _contents(s) == _expected(120)


def test_a_close_with_uncommitted_writes_snapshots_nothing_past_the_commit(tmp_path):
    config = Config.from_dict(_values(tmp_path, 1000))
    with TaskStorage(config) as s:
        _write(s, 0, 10)
        s.commit()
        first = s.committed_offset("kv")
        _write(s, 10, 10)
        s.commit()
        _write(s, 100, 5)  # never committed
    assert _snapshot_offsets(tmp_path) == [first]
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records == 10  # the deferred commit, replayed
        assert _contents(s) == _expected(20)


def test_a_crash_after_deferred_commits_reopens_at_the_last_commit(tmp_path):
    """A child commits past its snapshot, writes more, and exits without closing."""
    child = textwrap.dedent("""
        import json, os, sys
        from localstate import Config, TaskStorage
        s = TaskStorage(Config.from_dict(json.loads(sys.argv[1])))
        store = s.store("kv")
        for i in range(40):
            store.put(f"k{i}", {"i": i})
            if i % 10 == 9:
                s.commit()
        for i in range(40, 45):
            store.put(f"k{i}", {"i": i})
        store.flush()  # uncommitted writes reach the engine before the crash
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", child, json.dumps(_values(tmp_path, 1000))], check=True, timeout=120)
    assert len(_snapshot_offsets(tmp_path)) == 1  # only the first commit's
    with TaskStorage(Config.from_dict(_values(tmp_path, 1000))) as s:
        assert s.last_restore["kv"].records == 30
        assert _contents(s) == _expected(40)
    # the reopen's restore ended with a snapshot: the next open replays nothing
    with TaskStorage(Config.from_dict(_values(tmp_path, 1000))) as s:
        assert s.last_restore.get("kv") is None or s.last_restore["kv"].records == 0
        assert _contents(s) == _expected(40)


def test_compaction_takes_the_deferred_snapshot_first(tmp_path):
    """Compaction may drop the records an old snapshot would replay from; the deferred
    snapshot at the commit is taken before, so the reopen does not restore everything."""
    config = Config.from_dict({**_values(tmp_path, 1000), "systems.file.segment.bytes": 4096,
                               "systems.file.delete.retention.ms": 0})
    with TaskStorage(config) as s:
        for c in range(5):
            for i in range(20):
                s.store("kv").put(f"k{i}", {"i": i, "c": c, "pad": "x" * 200})
            s.commit()
        s.commit()  # a second checkpoint at the same offset: compaction may reach it
        compacted = s.compact()
        assert compacted["kv"], "nothing was compacted: the test would test nothing"
        assert _snapshot_offsets(tmp_path)[-1] == s.committed_offset("kv")
        _write(s, 100, 1)  # uncommitted: the close must not snapshot
    with TaskStorage(config) as s:
        assert s.last_restore.get("kv") is None or s.last_restore["kv"].records == 0
        assert _contents(s) == {f"k{i}": {"i": i, "c": 4, "pad": "x" * 200} for i in range(20)}


def test_interval_zero_snapshots_at_every_commit(tmp_path):
    config = Config.from_dict(_values(tmp_path, 0))
    with TaskStorage(config) as s:
        offsets = []
        for c in range(3):
            _write(s, c, 1)
            s.commit()
            offsets.append(s.committed_offset("kv"))
            assert _snapshot_offsets(tmp_path)[-1] == offsets[-1]


@pytest.mark.parametrize(("value", "match"), [(-1, "snapshot.interval.records = -1"), (2.5, "snapshot.interval.records"),
                                              ("lots", "snapshot.interval.records")])
def test_a_bad_interval_is_rejected_naming_the_key(tmp_path, value, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(_values(tmp_path, value))
    assert not (tmp_path / "state").exists()


def test_a_commit_failing_after_the_deferred_persist_reopens_at_the_previous_commit(tmp_path):
    """The engine deferred its snapshot at an offset whose checkpoint was never written
    (an injected error between persist and the checkpoint, a test double for a crash
    there): the close may snapshot that offset, and the reopen must discard it."""
    from localstate import faults
    from localstate.faults import InjectedFault

    config = Config.from_dict(_values(tmp_path, 1000))
    with TaskStorage(config) as s:
        _write(s, 0, 10)
        s.commit()
        _write(s, 10, 10)
        s.commit()
        committed = s.committed_offset("kv")
        _write(s, 20, 10)
        faults.configure("commit.after_engine_checkpoint=raise")
        try:
            with pytest.raises(InjectedFault):
                s.commit()
        finally:
            faults.configure(None)
    with TaskStorage(config) as s:
        assert s.committed_offset("kv") == committed
        assert _contents(s) == _expected(20)
        assert all(offset <= committed for offset in _snapshot_offsets(tmp_path))
