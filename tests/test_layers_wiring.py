"""The layer stack as built is the stack drawn in ``localstate.layers``: every combination
of object cache, ttl, metrics, changelog and read-only view is a chain of layers, each
calling the one below it, none with an instance attribute that shadows a method of its
class (no layer rebinds another's methods), and a put through the top reaches the
engine and the changelog exactly once per commit, counted once."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from localstate.changelog.base import ChangelogPartition
from localstate.changelogger import ChangeLogger
from localstate.engines.memory import MemoryEngine
from localstate.errors import ReadOnlyStoreError
from localstate.layers import (
    CachedStore,
    ExpiringCachedStore,
    LoggedStore,
    MeteredStore,
    ReadOnlyStore,
    SerializedStore,
    TtlPolicy,
    TtlStore,
    build_store,
)
from localstate.layers.ttl import TtlSerializedStore
from localstate.metrics import StoreMetrics
from localstate.records import ChangeRecord
from localstate.serdes import get_serde


class CountingEngine(MemoryEngine):
    """The memory engine, counting the keys each write reaches it with (a probe on the
    real engine: the count of engine writes is what is under test)."""

    def __init__(self) -> None:
        super().__init__("wired")
        self.writes: Counter[bytes] = Counter()

    def put(self, key: bytes, value: bytes) -> None:
        self.writes[key] += 1
        super().put(key, value)

    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        entries = entries if isinstance(entries, (list, Mapping)) else list(entries)
        self.writes.update(list(entries) if isinstance(entries, Mapping) else [k for k, _ in entries])
        super().put_all(entries)


class KeptPartition(ChangelogPartition):
    """A changelog partition keeping what is appended in memory (only the records the
    logger hands over are under test here, not a changelog system)."""

    def __init__(self) -> None:
        self.records: list[ChangeRecord] = []

    def append(self, records: list[ChangeRecord]) -> None:
        self.records.extend(records)

    def flush(self) -> int:
        return len(self.records)

    def end_offset(self) -> int:
        return len(self.records)

    def read_batches(self, start: int, stop: int) -> Any:
        raise NotImplementedError

    def discard_tail(self, committed_offset: int, current: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


COMBINATIONS = list(itertools.product((0, 4), (False, True), (False, True), (False, True), (False, True)))


def _build(cache: int, ttl: bool, metered: bool, logged: bool, read_only: bool) -> tuple[Any, CountingEngine,
                                                                                         ChangeLogger | None,
                                                                                         StoreMetrics]:
    engine = CountingEngine()
    metrics = StoreMetrics()
    logger = ChangeLogger("wired", KeptPartition(), 1000, metrics) if logged else None
    store = build_store(engine, name="wired", logger=logger, key_serde=get_serde("string"),
                        msg_serde=get_serde("json"), cache_size=cache, batch_size=4, metrics=metrics,
                        metered=metered, ttl=TtlPolicy(ms=60_000) if ttl else None, clock=lambda: 0)
    if read_only:
        store = ReadOnlyStore(store, "a test view")
    return store, engine, logger, metrics


def _chain(store: Any) -> list[Any]:
    layers = [store]
    while hasattr(layers[-1], "inner"):
        layers.append(layers[-1].inner)
    return layers


def _drawn(cache: int, ttl: bool, metered: bool, logged: bool, read_only: bool) -> list[type]:
    """The stack the module docstring of ``localstate.layers`` draws for this combination."""
    serialized = TtlSerializedStore if ttl else SerializedStore
    if cache:
        top = [ExpiringCachedStore if ttl else CachedStore]
    else:
        top = [MeteredStore] * metered + [TtlStore] * ttl
    return [ReadOnlyStore] * read_only + top + [serialized] + [LoggedStore] * logged + [CountingEngine]


@pytest.mark.parametrize("cache,ttl,metered,logged,read_only", COMBINATIONS)
def test_the_built_stack_is_the_drawn_one_and_no_layer_shadows_a_method(cache, ttl, metered, logged, read_only):
    store, _, _, _ = _build(cache, ttl, metered, logged, read_only)
    layers = _chain(store)
    assert [type(layer) for layer in layers] == _drawn(cache, ttl, metered, logged, read_only)
    for layer in layers[:-1]:
        cls = type(layer)
        shadowing = sorted(name for name, attr in vars(layer).items()
                           if callable(attr) and callable(getattr(cls, name, None)))
        assert shadowing == [], f"{cls.__name__} instance attributes shadow its methods: {shadowing}"


@pytest.mark.parametrize("cache,ttl,metered,logged,read_only", COMBINATIONS)
def test_a_put_reaches_the_engine_and_the_changelog_once_per_commit(cache, ttl, metered, logged, read_only):
    store, engine, logger, metrics = _build(cache, ttl, metered, logged, read_only)
    keys = [f"k{i}" for i in range(3)]
    if read_only:
        with pytest.raises(ReadOnlyStoreError):
            store.put("k0", 1)
        assert engine.writes == Counter() and metrics.puts == 0
        return
    for commit in range(1, 3):
        for k in keys:
            store.put(k, {"commit": commit})
        store.flush()  # the commit's first steps: the cache into the engine, the logger into the changelog
        if logger is not None:
            logger.flush()
        encoded = [k.encode() for k in keys]
        assert engine.writes == Counter({k: commit for k in encoded})
        if logger is not None:
            logged_keys = Counter(k for k, _ in logger.partition.records)
            assert logged_keys == Counter({k: commit for k in encoded})
        assert metrics.puts == (3 * commit if metered else 0)
        assert [store.get(k) for k in keys] == [{"commit": commit}] * 3
