"""The bulk paths (``get_all``/``put_all``/``delete_all``) through the layers.

Two tiers: targeted tests of the cached layer's batching (what stays dirty, what
goes down together, what the changelog sees), and a hypothesis state machine that
mixes single and bulk operations — repeated keys inside one batch, batches below and
above ``write.batch.size`` — with commits and crash-and-reopen, against a dict model,
over every key-value engine with and without the object cache.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from localstate import Config, TaskStorage
from localstate.changelog.base import ChangelogPartition
from localstate.changelogger import ChangeLogger
from localstate.engines.memory import MemoryEngine
from localstate.errors import InvalidValueError, SerializationError
from localstate.layers import build_store
from localstate.metrics import StoreMetrics
from localstate.records import ChangeRecord
from localstate.serdes import get_serde
from localstate.testing import FULL


class RecordingPartition(ChangelogPartition):
    """A changelog partition that keeps every appended batch in memory."""

    def __init__(self) -> None:
        self.batches: list[list[ChangeRecord]] = []
        self.logger: ChangeLogger | None = None

    def append(self, records: list[ChangeRecord]) -> None:
        self.batches.append(list(records))

    def flush(self) -> int:
        return sum(map(len, self.batches))

    def end_offset(self) -> int:
        return self.flush()

    def read_batches(self, start: int, stop: int) -> Any:
        raise NotImplementedError

    def discard_tail(self, committed_offset: int, current: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def state(self) -> dict[bytes, bytes]:
        """What a restore would rebuild, once the logger has handed over what it holds."""
        if self.logger is not None:
            self.logger.flush()
        out: dict[bytes, bytes | None] = {}
        for batch in self.batches:
            out.update(batch)
        return {k: v for k, v in out.items() if v is not None}


def _stack(cache_size: int = 8, batch_size: int = 4) -> tuple[Any, MemoryEngine, RecordingPartition, StoreMetrics]:
    engine = MemoryEngine()
    partition = RecordingPartition()
    metrics = StoreMetrics()
    logger = ChangeLogger("bulk", partition, batch_size, metrics)
    partition.logger = logger
    store = build_store(engine, name="bulk", logger=logger, key_serde=get_serde("string"),
                        msg_serde=get_serde("json"), cache_size=cache_size, batch_size=batch_size, metrics=metrics)
    return store, engine, partition, metrics


def _engine_state(engine: MemoryEngine) -> dict[bytes, bytes]:
    with engine.all() as it:
        return dict(it)


def test_small_put_all_stays_dirty_until_the_batch_size() -> None:
    store, engine, _, _ = _stack()
    store.put_all([("a", 1), ("b", 2), ("a", 3)])
    assert store.dirty_count() == 2  # build_store: the cache is the task-facing layer
    assert _engine_state(engine) == {}
    assert store.get_all(["a", "b", "c"]) == {"a": 3, "b": 2}
    store.put_all([("c", 4), ("d", 5)])  # 4 distinct dirty keys: the batch size is reached
    assert _engine_state(engine) == {b"a": b"3", b"b": b"2", b"c": b"4", b"d": b"5"}


def test_large_put_all_takes_dirty_writes_down_and_wins_over_them() -> None:
    store, engine, partition, _ = _stack()
    store.put("a", 1)
    store.delete("b")
    store.put("c", 1)
    store.put_all([("b", 10), ("a", 11), ("e", 12), ("f", 13), ("a", 14)])
    assert _engine_state(engine) == {b"a": b"14", b"b": b"10", b"c": b"1", b"e": b"12", b"f": b"13"}
    assert partition.state() == _engine_state(engine)
    assert store.get_all(["a", "b", "c", "x"]) == {"a": 14, "b": 10, "c": 1}


def test_large_delete_all_wins_over_dirty_puts() -> None:
    store, engine, partition, _ = _stack()
    store.put_all([(f"k{i}", i) for i in range(6)])
    store.put("k1", 100)  # dirty
    store.put("x", 1)  # dirty
    store.delete_all(["k1", "k2", "k3", "k1", "missing"])
    assert _engine_state(engine) == {b"k0": b"0", b"k4": b"4", b"k5": b"5", b"x": b"1"}
    assert partition.state() == _engine_state(engine)
    assert store.get("k1") is None and store.get("x") == 1


def test_changelog_batches_stay_within_the_batch_size() -> None:
    store, _, partition, metrics = _stack(cache_size=8, batch_size=4)
    store.put_all([(f"k{i % 30}", i) for i in range(50)])
    store.delete_all([f"k{i}" for i in range(10)])
    store.flush()
    assert partition.batches and max(map(len, partition.batches)) <= 4
    assert partition.state() == {f"k{i}".encode(): str(i + 30 if i < 20 else i).encode() for i in range(10, 30)}
    assert metrics.puts == 50 and metrics.deletes == 10


def test_unencodable_key_in_a_large_batch_changes_nothing() -> None:
    store, engine, _, _ = _stack()
    store.put("a", 1)  # dirty, not yet in the engine
    with pytest.raises(SerializationError, match="key serde 'string'"):
        store.put_all([("b", 2), ("c", 3), (4, 4), ("d", 5), ("e", 6)])
    assert store.get_all(["a", "b", "c"]) == {"a": 1}
    store.flush()
    assert _engine_state(engine) == {b"a": b"1"}


def test_unencodable_value_in_a_large_batch_changes_nothing() -> None:
    store, engine, _, _ = _stack()
    with pytest.raises(SerializationError, match="value serde 'json'"):
        store.put_all([(f"k{i}", {1, 2} if i == 3 else i) for i in range(6)])
    store.flush()
    assert _engine_state(engine) == {}


@pytest.mark.parametrize("cache_size", [0, 8])
def test_none_anywhere_in_put_all_rejects_the_batch(cache_size: int) -> None:
    store, engine, _, _ = _stack(cache_size=cache_size)
    with pytest.raises(InvalidValueError):
        store.put_all([("a", 1), ("a", None), ("a", 2)])  # even when a later pair overrides it
    with pytest.raises(InvalidValueError, match="k7"):  # a mapping goes in as two columns: the key still named
        store.put_all({f"k{i}": (None if i == 7 else i) for i in range(10)})
    store.flush()
    assert _engine_state(engine) == {}


def test_get_all_counts_cache_hits_and_misses() -> None:
    store, _, _, metrics = _stack(cache_size=8, batch_size=4)
    store.put_all([("a", 1), ("b", 2)])
    store.delete("c")
    assert store.get_all(["a", "b", "c", "d"]) == {"a": 1, "b": 2}
    assert (metrics.gets, metrics.hits, metrics.misses) == (4, 3, 1)
    assert store.get_all(["d"]) == {}  # the miss is now cached as absent
    assert (metrics.hits, metrics.misses) == (4, 1)


def test_get_all_with_duplicate_and_absent_keys() -> None:
    store, _, _, _ = _stack(cache_size=0)
    store.put_all([("a", 1), ("b", 2)])
    assert store.get_all(["a", "a", "x", "b", "x"]) == {"a": 1, "b": 2}
    assert store.get_all(iter(["b"])) == {"b": 2}
    assert store.get_all([]) == {}


# -- a state machine over TaskStorage --------------------------------------------------------
keys = st.sampled_from([f"k{i:02d}" for i in range(20)])
values = st.integers(0, 1000)
pairs = st.lists(st.tuples(keys, values), max_size=14)
key_lists = st.lists(keys, max_size=14)


class BulkMachine(RuleBasedStateMachine):
    """Single and bulk writes, reads, commits and crashes vs a dict model."""

    factory = "memory"
    cache_size = 8

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ls-bulk-"))
        self.config = Config.from_dict({
            "job.name": "bulk",
            "job.state.dir": str(self.dir / "state"),
            "systems.file.path": str(self.dir / "changelog"),
            "systems.file.segment.bytes": 4096,
            "stores.kv.factory": self.factory,
            "stores.kv.key.serde": "string",
            "stores.kv.msg.serde": "json",
            "stores.kv.object.cache.size": self.cache_size,
            "stores.kv.write.batch.size": 4,
        })
        self.storage = TaskStorage(self.config)
        self.model: dict[str, int] = {}
        self.committed: dict[str, int] = {}

    @property
    def store(self) -> Any:
        return self.storage.store("kv")

    @rule(k=keys, v=values)
    def put(self, k: str, v: int) -> None:
        self.store.put(k, v)
        self.model[k] = v

    @rule(batch=pairs, as_mapping=st.booleans())
    def put_all(self, batch: list[tuple[str, int]], as_mapping: bool) -> None:
        self.store.put_all(dict(batch) if as_mapping else batch)
        self.model.update(batch)

    @rule(k=keys)
    def delete(self, k: str) -> None:
        self.store.delete(k)
        self.model.pop(k, None)

    @rule(ks=key_lists)
    def delete_all(self, ks: list[str]) -> None:
        self.store.delete_all(ks)
        for k in ks:
            self.model.pop(k, None)

    @rule(ks=key_lists)
    def get_all(self, ks: list[str]) -> None:
        assert self.store.get_all(ks) == {k: self.model[k] for k in ks if k in self.model}

    @rule(k=keys)
    def get(self, k: str) -> None:
        assert self.store.get(k) == self.model.get(k)

    @rule(a=keys, b=keys)
    def range_scan(self, a: str, b: str) -> None:
        with self.store.range(a, b) as it:
            assert list(it) == sorted((k, v) for k, v in self.model.items() if a <= k < b)

    @rule()
    def commit(self) -> None:
        self.storage.commit(input_position=0)
        self.committed = dict(self.model)

    @rule()
    def compact(self) -> None:
        self.storage.compact()

    @rule()
    def crash_and_reopen(self) -> None:
        self.storage.close()  # no commit: everything since the last commit is lost
        self.storage = TaskStorage(self.config)
        self.model = dict(self.committed)

    @invariant()
    def all_matches_model(self) -> None:
        with self.store.all() as it:
            assert dict(it) == self.model

    def teardown(self) -> None:
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class UncachedBulkMachine(BulkMachine):
    cache_size = 0


class RocksDBBulkMachine(BulkMachine):
    factory = "rocksdb"


class LevelDBBulkMachine(BulkMachine):
    factory = "leveldb"


_fast = settings(max_examples=150 if FULL else 25, stateful_step_count=40, deadline=None)
_slow = settings(max_examples=60 if FULL else 6, stateful_step_count=25, deadline=None)
BulkMachine.TestCase.settings = _fast
UncachedBulkMachine.TestCase.settings = _fast
RocksDBBulkMachine.TestCase.settings = _slow
LevelDBBulkMachine.TestCase.settings = _slow
TestMemoryBulkMachine = BulkMachine.TestCase
TestUncachedBulkMachine = UncachedBulkMachine.TestCase
TestRocksDBBulkMachine = RocksDBBulkMachine.TestCase
TestLevelDBBulkMachine = LevelDBBulkMachine.TestCase
