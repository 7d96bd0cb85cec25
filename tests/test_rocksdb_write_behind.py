"""rocksdb's write-behind buffer: ``put_all``/``delete_all`` of bytes are held back and
written as one batch sorted by key, and nothing observable may differ but the cost.

Real RocksDB files throughout; the crash is a real process exit without close
(``os._exit`` in a child). The one test double is a write that fails once (a disk error
cannot be caused on demand here), and the test says so.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from localstate import Config, TaskStorage
from localstate.engine import StoreContext
from localstate.engines.rocksdb import RocksDBEngine
from localstate.errors import EngineError, InvalidValueError, SerializationError, StoreClosedError


def _engine(tmp_path: Path, *, logged: bool = False, limit: int | None = None) -> RocksDBEngine:
    engine = RocksDBEngine(StoreContext.local(tmp_path / "db", "wb", logged=logged))
    if limit is not None:
        engine.write_behind_records = limit  # type: ignore[misc]
    return engine


def _raw_contents(engine: RocksDBEngine) -> dict[bytes, bytes]:
    """What RocksDB itself holds, bypassing the buffer (the test looks underneath)."""
    return dict(engine._db.items())


def test_a_bulk_write_is_buffered_and_every_read_sees_it(tmp_path):
    e = _engine(tmp_path)
    try:
        e.put_all({b"b": b"2", b"a": b"1", b"c": b"3"})
        assert e._pending and _raw_contents(e) == {}  # held back, not yet in RocksDB
        assert e.get(b"a") == b"1" and e.get(b"zz") is None and e.get(b"zz", b"d") == b"d"
        assert e._pending  # a point read is answered from the buffer without writing it
        assert e.get_all([b"a", b"c", b"x"]) == {b"a": b"1", b"c": b"3"}
        assert not e._pending and _raw_contents(e) == {b"a": b"1", b"b": b"2", b"c": b"3"}
        e.delete_all([b"b"])
        e.put_all([(b"d", b"4"), (b"d", b"5")])  # pairs: later ones win, written at once
        assert e.get(b"b") is None and e.get(b"d") == b"5"
        with e.all() as it:
            assert list(it) == [(b"a", b"1"), (b"c", b"3"), (b"d", b"5")]
        assert len(e) == 3
        assert list(e.current([b"a", b"b"])) == [(b"a", b"1"), (b"b", None)]
    finally:
        e.close()


def test_deletes_and_rewrites_of_one_key_keep_their_order(tmp_path):
    e = _engine(tmp_path)
    try:
        e.put_all({b"k": b"1"})
        e.delete_all([b"k"])
        assert e.get(b"k") is None and e.get(b"k", b"dflt") == b"dflt"
        e.put_all({b"k": b"2"})
        assert e.get(b"k") == b"2"
        e.delete_all([b"k"])
        e.put(b"k", b"3")  # a single put goes straight to RocksDB, after the buffer
        assert not e._pending and e.get(b"k") == b"3"
        e.put_all({b"k": b"4"})
        e.delete(b"k")
        assert e.get(b"k") is None
        with e.all() as it:
            assert list(it) == []
    finally:
        e.close()


def test_a_scan_open_before_a_buffered_write_does_not_see_it(tmp_path):
    e = _engine(tmp_path)
    try:
        e.put_all({b"a": b"1"})
        it = e.all()  # the buffer is written first, then the scan's snapshot is taken
        e.put_all({b"b": b"2"})
        assert list(it) == [(b"a", b"1")]
        with e.all() as again:
            assert list(again) == [(b"a", b"1"), (b"b", b"2")]
    finally:
        e.close()


def test_the_buffer_is_written_once_full_by_records_or_bytes(tmp_path):
    e = _engine(tmp_path, limit=4)
    try:
        e.put_all({b"a": b"1", b"b": b"2", b"c": b"3"})
        assert len(e._pending) == 3
        e.put_all({b"d": b"4"})
        assert not e._pending and len(_raw_contents(e)) == 4
        e.write_behind_bytes = 10  # type: ignore[misc]
        e.put_all({b"e": b"x" * 6})
        assert e._pending
        e.put_all({b"f": b"y" * 6})
        assert not e._pending and _raw_contents(e)[b"f"] == b"y" * 6
    finally:
        e.close()


@pytest.mark.parametrize(
    "bad",
    [{b"k": "text"}, {"k": b"v"}, {b"k": None}, {b"k": 3}, {b"k": bytearray(b"v")}],
    ids=["str-value", "str-key", "none-value", "int-value", "bytearray-value"],
)
def test_a_bad_bulk_write_raises_at_the_call_and_changes_nothing(tmp_path, bad):
    e = _engine(tmp_path)
    try:
        e.put_all({b"good": b"1"})
        with pytest.raises((SerializationError, InvalidValueError, EngineError)) as err:
            e.put_all(bad)
        assert "'wb'" in str(err.value)  # names the store
        assert e.get(b"k") is None
        with e.all() as it:
            assert list(it) == [(b"good", b"1")]
    finally:
        e.close()


def test_a_bad_bulk_delete_raises_and_changes_nothing(tmp_path):
    e = _engine(tmp_path)
    try:
        e.put_all({b"a": b"1"})
        with pytest.raises(SerializationError, match="'wb'"):
            e.delete_all([b"a", "b"])
        assert e.get(b"a") == b"1"
    finally:
        e.close()


def test_a_failed_write_keeps_the_buffer(tmp_path, monkeypatch):
    # Test double: RocksDB's write fails once (an I/O error cannot be caused on demand).
    e = _engine(tmp_path)
    try:
        e.put_all({b"a": b"1", b"b": b"2"})
        real = RocksDBEngine._write_batch

        def failing(self, batch):
            monkeypatch.setattr(RocksDBEngine, "_write_batch", real)
            raise EngineError("store 'wb': simulated write failure")

        monkeypatch.setattr(RocksDBEngine, "_write_batch", failing)
        with pytest.raises(EngineError, match="simulated"):
            e.flush()
        assert e.get(b"a") == b"1"  # still buffered, still readable
        with e.all() as it:  # the next read writes it
            assert list(it) == [(b"a", b"1"), (b"b", b"2")]
    finally:
        e.close()


def test_close_writes_the_buffer_and_a_closed_engine_refuses(tmp_path):
    e = _engine(tmp_path)  # no changelog: RocksDB keeps its WAL, the data outlives close
    e.put_all({b"a": b"1"})
    e.delete_all([b"gone"])
    e.close()
    with pytest.raises(StoreClosedError):
        e.put_all({b"b": b"2"})
    with pytest.raises(StoreClosedError):
        e.delete_all([b"a"])
    again = _engine(tmp_path)
    try:
        assert again.get(b"a") == b"1"
    finally:
        again.close()


def _config(tmp_path: Path) -> dict[str, object]:
    return {
        "job.name": "wb",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.wb-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.rocksdb.snapshot.interval.records": 0,  # a snapshot per commit: the buffer must be in it
    }


def test_a_commit_snapshots_buffered_writes_and_a_crash_reopens_at_the_commit(tmp_path):
    values = _config(tmp_path)
    child = textwrap.dedent(f"""
        import os
        from localstate import Config, TaskStorage
        with TaskStorage(Config.from_dict({values!r})) as s:
            kv = s.store("kv")
            kv.put_all([(f"k{{i}}", i) for i in range(3000)])
            kv.delete_all([f"k{{i}}" for i in range(0, 3000, 3)])
            s.commit()
            kv.put_all([(f"k{{i}}", -i) for i in range(3000)])  # uncommitted, buffered
            kv.put_all([(f"new{{i}}", i) for i in range(700)])
            os._exit(0)  # a crash: no close, no flush
    """)
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120)
    expected = {f"k{i}": i for i in range(3000) if i % 3}
    with TaskStorage(Config.from_dict(values)) as s:
        with s.store("kv").all() as it:
            assert dict(it) == expected
        assert s.last_restore["kv"].records == 0  # the commit's snapshot held every buffered write
