"""The worked example plug-in (contrib/sqlite_engine.py) through the same tests as built-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from localstate import Config, CorruptionError, TaskStorage
from localstate.contrib.sqlite_engine import SQLiteEngine
from localstate.engine import StoreContext
from localstate.testing import LAYER_COMBOS, KeyValueStoreConformance, layer_stack

FACTORY = "localstate.contrib.sqlite_engine:SQLiteEngineFactory"


class TestSQLiteConformance(KeyValueStoreConformance):
    @pytest.fixture(params=LAYER_COMBOS)
    def store(self, request, tmp_path):
        with layer_stack(SQLiteEngine(StoreContext.local(tmp_path / "db", "sq")), request.param, tmp_path) as s:
            yield s


def _config(tmp_path, **extra):
    return Config.from_dict({
        "job.name": "sq",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": FACTORY,
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        **extra,
    })


def test_reopen_after_commit_replays_nothing(tmp_path):
    config = _config(tmp_path)
    with TaskStorage(config) as s:
        s.store("kv").put_all([(f"k{i}", i) for i in range(1000)])
        s.commit(1)
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records == 0
        assert s.store("kv")["k999"] == 999
    with TaskStorage(config) as s:
        s.store("kv").put_all([(f"k{i}", -i) for i in range(10)])
        s.commit(2)
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records == 0 and s.store("kv")["k3"] == -3


def test_local_copy_behind_replays_only_the_tail(tmp_path):
    config = _config(tmp_path)
    with TaskStorage(config) as s:
        s.store("kv").put_all([(f"k{i}", i) for i in range(100)])
        s.commit(1)
    snapshot = (tmp_path / "state" / "sq" / "kv" / "0" / "store.sqlite").read_bytes()
    with TaskStorage(config) as s:
        s.store("kv").put_all([(f"k{i}", -i) for i in range(7)])
        s.commit(2)
    db = tmp_path / "state" / "sq" / "kv" / "0" / "store.sqlite"
    for suffix in ("-wal", "-shm"):
        p = db.with_name(db.name + suffix)
        if p.exists():
            p.unlink()
    db.write_bytes(snapshot)  # host affinity with a stale local copy (offset 100 < committed 107)
    with TaskStorage(config) as s:
        assert s.last_restore["kv"].records == 7
        assert s.store("kv")["k3"] == -3 and s.store("kv")["k50"] == 50


def test_corrupt_database_file_is_reported(tmp_path):
    config = _config(tmp_path)
    with TaskStorage(config) as s:
        s.store("kv")["a"] = 1
        s.commit(1)
    db = tmp_path / "state" / "sq" / "kv" / "0" / "store.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CorruptionError, match="rebuild"):
        TaskStorage(config)


CHILD = textwrap.dedent(
    """
    import json, sys
    from localstate import Config, TaskStorage
    config = Config.from_dict(json.loads(sys.argv[1]))
    with TaskStorage(config) as s:
        kv = s.store("kv")
        start = s.checkpoint.input_position if s.checkpoint else 0
        for n in range(start + 1, 9):
            for i in range(50):
                kv.put("k%d" % ((n * 7 + i) % 60), n * 100 + i)
            kv.delete("k%d" % n)
            s.commit(input_position=n)
    """
)


def _model(n):
    state = {}
    for b in range(1, n + 1):
        for i in range(50):
            state[f"k{(b * 7 + i) % 60}"] = b * 100 + i
        state.pop(f"k{b}", None)
    return state


@pytest.mark.parametrize("point", ["commit.after_changelog_flush", "checkpoint.before_rename", "commit.after_engine_checkpoint"])
def test_sigkill_mid_commit_then_reopen_equals_last_commit(tmp_path, point):
    config = _config(tmp_path)
    values = config.to_dict()
    env = {**os.environ, "LOCALSTATE_FAULTS": f"{point}=kill@4"}
    assert subprocess.run([sys.executable, "-c", CHILD, json.dumps(values)], env=env).returncode == -9
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == 3
        with s.store("kv").all() as it:
            assert dict(it) == _model(3)
    env.pop("LOCALSTATE_FAULTS")
    assert subprocess.run([sys.executable, "-c", CHILD, json.dumps(values)], env=env).returncode == 0
    with TaskStorage(config) as s, s.store("kv").all() as it:
        assert dict(it) == _model(8)
