"""Issue 14 case 6: a local copy is verified or rebuilt from the changelog, never
trusted into returning wrong bytes. Real LevelDB/RocksDB files, damaged on disk while
the task is stopped (one flipped byte), then reopened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.errors import CorruptionError

VALUE = "v" * 40


def config(tmp: Path, engine: str, **extra: Any) -> Config:
    return Config.from_dict({
        "job.name": "copies",
        "job.state.dir": str(tmp / "state"),
        "systems.file.path": str(tmp / "changelog"),
        "stores.s.factory": engine,
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "string",
        "stores.s.object.cache.size": 10,
        "stores.s.write.batch.size": 10,
        **extra,
    })


def fill(cfg: Config, n: int = 610) -> dict[str, str]:
    expected = {f"key-{i:05d}": f"{VALUE}-{i:05d}" for i in range(n)}
    with TaskStorage(cfg) as s:
        items = list(expected.items())
        for i in range(0, n, 100):
            s.store("s").put_all(items[i:i + 100])
            s.commit(input_position=i)
    return expected


def read_all(cfg: Config) -> dict[str, str]:
    with TaskStorage(cfg) as s, s.store("s").all() as it:
        return dict(it)


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


def db_dir(tmp: Path) -> Path:
    return tmp / "state" / "copies" / "s" / "0" / "db"


def test_leveldb_flipped_byte_inside_a_table_value_is_never_returned(tmp_path):
    cfg = config(tmp_path, "leveldb", **{"stores.s.leveldb.compression": "none"})
    expected = fill(cfg)
    with TaskStorage(cfg) as s:  # push everything into .ldb tables
        s.engine("s")._raw.compact_range()
    tables = sorted(db_dir(tmp_path).glob("*.ldb"))
    assert tables, "the data should be in a table file"
    table = max(tables, key=lambda p: p.stat().st_size)
    data = table.read_bytes()
    at = data.find(b"-00300")
    assert at > 0
    flip(table, at - 3)
    with TaskStorage(cfg) as s:
        store = s.store("s")
        try:
            got = store.get("key-00300")
        except CorruptionError as e:
            assert "corrupt" in str(e)  # an error naming the store, never wrong bytes
        else:
            assert got == expected["key-00300"], "a damaged value was returned"
    # whatever the engine decided, a rebuild gives exactly the committed state
    import shutil

    shutil.rmtree(db_dir(tmp_path).parent)
    assert read_all(cfg) == expected


def test_leveldb_flipped_byte_in_its_log_rebuilds_instead_of_dropping_keys(tmp_path):
    cfg = config(tmp_path, "leveldb")
    expected = fill(cfg)
    (log,) = db_dir(tmp_path).glob("*.log")
    assert log.stat().st_size > 1000
    flip(log, 1000)
    assert read_all(cfg) == expected  # 610 of 610 (was: 110, with the offset key intact)


def test_leveldb_without_paranoid_checks_is_still_an_option(tmp_path):
    cfg = config(tmp_path, "leveldb", **{"stores.s.leveldb.paranoid.checks": False,
                                         "stores.s.leveldb.verify.checksums": False})
    assert read_all(cfg) == {} and fill(cfg)


@pytest.mark.parametrize("target", ["sst", "manifest", "current"])
def test_rocksdb_damaged_files_rebuild_or_error_never_wrong_bytes(tmp_path, target):
    cfg = config(tmp_path, "rocksdb")
    expected = fill(cfg)
    snaps = sorted((db_dir(tmp_path).parent / "snapshots").iterdir())
    victims = {
        "sst": sorted(db_dir(tmp_path).glob("*.sst")) + sorted(snaps[-1].glob("*.sst")),
        "manifest": sorted(db_dir(tmp_path).glob("MANIFEST-*")) + sorted(snaps[-1].glob("MANIFEST-*")),
        "current": [db_dir(tmp_path) / "CURRENT", snaps[-1] / "CURRENT"],
    }[target]
    assert victims
    for v in victims:
        flip(v, min(v.stat().st_size - 1, 60))
    try:
        got = read_all(cfg)
    except CorruptionError:
        return  # an error naming the store is allowed; wrong data is not
    assert got == expected
