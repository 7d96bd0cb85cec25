"""The ``search`` engine's writer feeder: batches of deletes and adds reach the tantivy writer
on a background thread, in order; a failed batch blocks every later write and commit until
the store is reopened (and rebuilt from the changelog); the thread ends with the store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from localstate import Config, EngineError, TaskStorage
from localstate.engines import search_feeder as feeder_module

FIELDS = "name:text:stored, age:int:fast"


def _config(tmp_path: Path) -> Config:
    return Config.from_dict({
        "job.name": "feed", "job.state.dir": str(tmp_path / "state"), "systems.file.path": str(tmp_path / "log"),
        "stores.profiles.factory": "search", "stores.profiles.key.serde": "string",
        "stores.profiles.search.fields": FIELDS, "stores.profiles.search.write.buffer.docs": 8,
    })


def _feeder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("localstate-search-")]


def test_batches_reach_the_writer_in_order(tmp_path):
    """Many big batches rewriting the same ids, then deletes, all queued before one read:
    each id ends with its last write, indexed once."""
    with TaskStorage(_config(tmp_path)) as s:
        p = s.store("profiles")
        for round_ in range(6):
            p.index_all([(f"d{i}", {"name": f"round{round_}", "age": round_}) for i in range(round_, 40)])
        p.delete_all([f"d{i}" for i in range(35, 40)])
        p.index("d0", {"name": "single", "age": 99})
        engine = s.engine("profiles")
        engine._check()
        assert len(p) == 35
        assert p.count("round5") == 30 and p.count("round4") == 1 and p.count("single") == 1
        assert p.get("d37") is None and p.get("d5") == {"name": "round5", "age": 5}
        s.commit(1)
    assert _feeder_threads() == []  # the thread ends with the store
    with TaskStorage(_config(tmp_path)) as s:
        assert s.store("profiles").count("round5") == 30


def test_a_failed_batch_blocks_every_later_write_and_commit(tmp_path, monkeypatch):
    """A test double makes one batch fail on the feeder thread (a batch that passed every
    check cannot fail in tantivy otherwise): the next write or commit raises an
    EngineError naming the cause, the commit never happens, and reopening the store
    gives the committed state."""
    config = _config(tmp_path)
    with TaskStorage(config) as s:
        p = s.store("profiles")
        p.index_all([(f"c{i}", {"name": "committed"}) for i in range(10)])
        s.commit(1)
    real_add_to = feeder_module.add_to
    failures = [OSError("injected: the writer refused the batch")]

    def add_to_failing_once(writer, items):
        if failures:
            raise failures.pop()
        real_add_to(writer, items)

    monkeypatch.setattr(feeder_module, "add_to", add_to_failing_once)
    with TaskStorage(config) as s:
        p = s.store("profiles")
        p.index_all([(f"n{i}", {"name": "lost"}) for i in range(10)])  # handed over; fails on the thread
        with pytest.raises(EngineError, match="injected: the writer refused the batch"):
            s.commit(2)
        with pytest.raises(EngineError, match="did not reach the tantivy writer"):
            p.index_all([(f"m{i}", {"name": "later"}) for i in range(10)])
        with pytest.raises(EngineError, match="close the task and reopen"):
            p.count("committed")
    assert _feeder_threads() == []
    with TaskStorage(config) as s:
        p = s.store("profiles")
        assert p.count("committed") == 10 and p.count("lost") == 0 and len(p) == 10
        p.index_all([(f"n{i}", {"name": "found"}) for i in range(10)])
        s.commit(2)
        assert len(p) == 20 and p.count("found") == 10
        s.engine("profiles")._check()
