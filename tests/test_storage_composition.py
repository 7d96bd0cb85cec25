"""TaskStorage is a composition: an opener and a committer over one explicit TaskState,
neither mixed into TaskStorage nor holding a reference back to it. The rocksdb engine
owns its snapshots the same way."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

from localstate import TaskStorage
from localstate.commit import TaskCommitter
from localstate.metrics import TaskMetrics
from localstate.store_open import ChangelogSystems, Recovery, StoreOpener, TaskState

COUNTS = {"factory": "memory", "key.serde": "string", "msg.serde": "json", "object.cache.size": 100,
          "write.batch.size": 10}
EXPIRING = {"factory": "memory", "key.serde": "string", "msg.serde": "json", "ttl.ms": 60_000,
            "ttl.time": "event"}


def reaches(start: Any, target: Any) -> bool:
    """Whether ``target`` is reachable from ``start`` through object references, not
    counting modules, classes and module globals (shared by everything)."""
    module_dicts = {id(m.__dict__) for m in list(sys.modules.values()) if m is not None}
    seen: set[int] = set()
    todo = [start]
    while todo:
        obj = todo.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type)) or id(obj) in module_dicts:
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return False


def test_task_storage_mixes_in_nothing() -> None:
    assert TaskStorage.__bases__ == (object,)


def test_committer_and_the_opened_stores_hold_no_reference_to_the_task_storage(make_config):
    config = make_config(counts=COUNTS, expiring=EXPIRING)
    with TaskStorage(config) as s:
        s.advance_event_time(1_000)
        s.store("counts")["a"] = 1
        s.store("expiring")["b"] = 2  # its TTL clock reads the task's event time
        s.commit(input_position=1)
        assert isinstance(s._committer, TaskCommitter)
        assert not reaches(s._committer, s)
        for name in s.stores:
            assert not reaches(s.store(name), s), name
            assert not reaches(s.engine(name), s), name


def test_opener_and_committer_work_from_their_explicit_state_alone(make_config):
    """An opener and a committer built by hand over one TaskState open, commit and
    reopen a store: what they need is what they are given."""
    config = make_config(counts=COUNTS)

    def state() -> TaskState:
        return TaskState(config, 0, {}, offsets={}, meta={}, epoch=1, event_time=None)

    systems = ChangelogSystems(config)
    try:
        first = state()
        opener = StoreOpener(first, systems, Recovery(), None, evidence=[])
        opener.open(config.stores["counts"])
        assert opener.register  # a new store: a checkpoint is written at open
        checkpoints = systems.get(config.checkpoint_system).checkpoints()
        committer = TaskCommitter(first, checkpoints, TaskMetrics(), None)
        first.stores["counts"].view["k"] = 7
        ckpt = committer.commit("in-7")
        assert committer.checkpoint == ckpt and ckpt.offsets["counts"] == 1
        for entry in first.stores.values():
            entry.view.close()
            entry.engine.close()
            entry.changelog.close()
    finally:
        assert systems.close() == []
    with TaskStorage(config) as s:
        assert s.store("counts")["k"] == 7 and s.checkpoint.input_position == "in-7"


def test_rocksdb_engine_owns_its_snapshots_instead_of_mixing_them_in(make_config):
    from localstate.engines._persistent import NativeKVEngine
    from localstate.engines.rocksdb import RocksDBEngine
    from localstate.engines.rocksdb_snapshots import RocksDBSnapshots

    assert RocksDBEngine.__bases__ == (NativeKVEngine,)
    config = make_config(kv={"factory": "rocksdb", "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as s:
        s.store("kv")["a"] = 1
        s.commit()
        engine = s.engine("kv")
        assert isinstance(engine._snapshots, RocksDBSnapshots)
        assert [offset for offset, _ in engine.snapshots()] == [1]
