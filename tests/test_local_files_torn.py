"""Files a crash can leave torn in a task's local state dir.

rocksdict rewrites its own marker (``rocksdict-config.json``) in place at every open, so
a SIGKILL during an open can leave it empty or cut short (seen as 2 kills in 60 with six
rocksdb stores). Such a local copy is damaged like any other: a logged store sets it
aside and rebuilds it from the changelog, exactly, on this open and every later one; a
store without a changelog refuses with an error that names the file. The marker is
damaged here by truncating it (what the torn write leaves), on real RocksDB files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localstate import Config, TaskStorage
from localstate.errors import CorruptionError


def _config(tmp: Path, logged: bool = True) -> Config:
    values = {
        "job.name": "torn",
        "job.state.dir": str(tmp / "state"),
        "systems.file.path": str(tmp / "changelog"),
        "stores.s.factory": "rocksdb",
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "string",
        "stores.s.changelog": "file.torn-s" if logged else "none",
    }
    return Config.from_dict(values)


def _fill(cfg: Config, commits: int = 3) -> dict[str, str]:
    expected: dict[str, str] = {}
    with TaskStorage(cfg) as s:
        for c in range(commits):
            batch = {f"k{c}-{i}": f"v{c}-{i}" for i in range(50)}
            s.store("s").put_all(batch)
            expected.update(batch)
            s.commit(input_position=c)
    return expected


def _marker(tmp: Path) -> Path:
    return tmp / "state" / "torn" / "s" / "0" / "db" / "rocksdict-config.json"


@pytest.mark.parametrize("torn", [b"", b'{"raw_mode":tr', b"\x00\x00\x00\x00"])
def test_a_torn_rocksdict_marker_is_rebuilt_from_the_changelog(tmp_path, torn, caplog):
    cfg = _config(tmp_path)
    expected = _fill(cfg)
    marker = _marker(tmp_path)
    assert json.loads(marker.read_text())["raw_mode"] is True
    marker.write_bytes(torn)
    for _ in range(2):  # this open and the next both come back exact
        with TaskStorage(cfg) as s, s.store("s").all() as it:
            assert dict(it) == expected
            assert s.checkpoint.input_position == 2
    assert "rocksdict-config.json" in caplog.text
    assert json.loads(marker.read_text())["raw_mode"] is True


def test_a_torn_marker_of_a_store_without_a_changelog_is_a_clear_error(tmp_path):
    cfg = _config(tmp_path, logged=False)
    _fill(cfg, commits=1)
    marker = _marker(tmp_path)
    marker.write_bytes(b"")
    with pytest.raises(CorruptionError, match="rocksdict-config.json is damaged.*rebuild"):
        TaskStorage(cfg).store("s")
    assert marker.read_bytes() == b""  # nothing was changed
