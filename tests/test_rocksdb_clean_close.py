"""rocksdb trusts its live database on open only after a clean close at its newest snapshot.

A task opened once per micro-batch used to rebuild ``db/`` from its snapshot at every
open (close, delete, hard-link the snapshot back, open again). A clean close that leaves
the live database equal to its newest snapshot now writes ``db.clean``; the next open
consumes it before anything can write and keeps ``db/``. Every other path — a close after
uncommitted writes, a crash after the claim was consumed, a damaged or stale claim — must
still give exactly the last commit. Real RocksDB files, a real file changelog, and a real
process exit without close (``os._exit`` in a child) for the crash.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from localstate import Config, TaskStorage


def _values(tmp_path: Path, interval: int = 500_000) -> dict[str, object]:
    return {
        "job.name": "cc",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.cc-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.rocksdb.snapshot.interval.records": interval,
    }


def _store_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "cc" / "kv" / "0"


def _marker(tmp_path: Path) -> Path:
    return _store_dir(tmp_path) / "db.clean"


def _mark_live(tmp_path: Path) -> Path:
    """A file of our own in db/: a rebuild from a snapshot makes a new db/ without it."""
    sentinel = _store_dir(tmp_path) / "db" / "TEST-SENTINEL"
    sentinel.write_text("kept")
    return sentinel


def _contents(storage: TaskStorage) -> dict:
    with storage.store("kv").all() as it:
        return dict(it)


def _commit_batches(config: Config, batches: range, model: dict | None = None) -> dict:
    """Commit ``batches`` (one TaskStorage open each, as a micro-batch does); the model of
    the whole state, starting from ``model``."""
    model = {} if model is None else dict(model)
    for b in batches:
        with TaskStorage(config) as s:
            kv = s.store("kv")
            for i in range(50):
                kv.put(f"k{(b * 31 + i) % 120}", {"b": b, "i": i})
                model[f"k{(b * 31 + i) % 120}"] = {"b": b, "i": i}
            kv.delete(f"k{b % 120}")
            model.pop(f"k{b % 120}", None)
            s.commit(input_position=b)
    return model


@pytest.mark.parametrize("interval", [0, 500_000])
def test_an_open_after_a_clean_close_keeps_the_live_database(tmp_path, interval):
    config = Config.from_dict(_values(tmp_path, interval))
    model = _commit_batches(config, range(1, 3))
    claim = json.loads(_marker(tmp_path).read_text())
    live = _mark_live(tmp_path)
    with TaskStorage(config) as s:
        assert not _marker(tmp_path).exists()  # consumed by the open, before any write
        assert s.committed_offset("kv") == claim["offset"]
        assert s.last_restore["kv"].records == 0
        assert _contents(s) == model
    assert live.exists()  # not rebuilt from the snapshot
    model = _commit_batches(config, range(3, 8), model)  # micro-batch after micro-batch
    assert live.exists()
    with TaskStorage(config) as s:
        assert _contents(s) == model and s.checkpoint.input_position == 7


def test_a_close_after_uncommitted_writes_leaves_no_claim(tmp_path):
    config = Config.from_dict(_values(tmp_path))
    model = _commit_batches(config, range(1, 3))
    with TaskStorage(config) as s:
        s.store("kv").put("k1", {"uncommitted": True})
        s.store("kv").put("brand-new", {"uncommitted": True})
        s.store("kv").flush()  # into the live database
    assert not _marker(tmp_path).exists()
    with TaskStorage(config) as s:
        assert _contents(s) == model


def test_a_crash_after_the_claim_was_consumed_gives_the_last_commit(tmp_path):
    """The open consumes db.clean; the child writes past the commit, flushes them into the
    live database and exits without close: the next open must not keep that database."""
    config_values = _values(tmp_path)
    model = _commit_batches(Config.from_dict(config_values), range(1, 3))
    assert _marker(tmp_path).exists()
    child = textwrap.dedent(f"""
        import os
        from localstate import Config, TaskStorage
        s = TaskStorage(Config.from_dict({config_values!r}))
        kv = s.store("kv")
        for i in range(200):
            kv.put(f"k{{i}}", {{"crashed": i}})
        kv.flush()
        s.engine("kv").flush()
        os._exit(0)
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not _marker(tmp_path).exists()
    with TaskStorage(Config.from_dict(config_values)) as s:
        assert _contents(s) == model


@pytest.mark.parametrize("claim", [b"", b"{", b'{"offset": -1}', b'{"offset": "7"}', b'{"offset": 99999}', b"[]",
                                   b'{"offset": 0, "records": -1}', b'{"offset": 0, "records": 1.5}'])
def test_a_damaged_or_unknown_claim_is_ignored_and_the_database_rebuilt(tmp_path, claim, caplog):
    config = Config.from_dict(_values(tmp_path))
    model = _commit_batches(config, range(1, 3))
    _marker(tmp_path).write_bytes(claim)
    live = _mark_live(tmp_path)
    with TaskStorage(config) as s:
        assert _contents(s) == model
    assert not live.exists()  # rebuilt from the snapshot


def test_the_claim_stays_exact_when_the_newest_snapshot_is_gone(tmp_path):
    config = Config.from_dict(_values(tmp_path))
    model = _commit_batches(config, range(1, 3))
    snapshot = max((_store_dir(tmp_path) / "snapshots").iterdir())
    for f in snapshot.iterdir():
        f.unlink()
    snapshot.rmdir()
    with TaskStorage(config) as s:  # the older snapshot or the changelog: still exact
        assert _contents(s) == model


def test_a_claim_older_than_the_last_commit_is_not_trusted(tmp_path):
    """db.clean copied back from an earlier close (an operator restoring a backup of the
    store directory): the snapshot it names is not the newest, so the database is rebuilt."""
    config = Config.from_dict(_values(tmp_path, interval=0))
    model = _commit_batches(config, range(1, 2))
    old_claim = _marker(tmp_path).read_bytes()
    model = _commit_batches(config, range(2, 4), model)
    _marker(tmp_path).write_bytes(old_claim)
    live = _mark_live(tmp_path)
    with TaskStorage(config) as s:
        assert _contents(s) == model and s.checkpoint.input_position == 3
    assert not live.exists()


def test_the_claim_is_complete_before_the_engine_lock_is_released(tmp_path):
    """Another attempt of the task may be waiting for the engine lock: it must find db.clean
    written or absent, never appearing after it opened (and consumed nothing). The lock's
    release is wrapped to look at the directory at that moment (a test double for a timing
    a real second process cannot hit on demand)."""
    config = Config.from_dict(_values(tmp_path))
    _commit_batches(config, range(1, 2))
    seen: list[bool] = []
    s = TaskStorage(config)
    s.store("kv").put("k1", {"b": 9})
    s.commit(input_position=2)
    engine = s.engine("kv")
    release = engine._lock.release

    def observed_release() -> None:
        seen.append(_marker(tmp_path).exists())
        release()

    engine._lock.release = observed_release
    s.close()
    assert seen == [True]
