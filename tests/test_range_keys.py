"""Keys-only scans (``range_keys``, and ``keys()`` built on it) through the public API:
the same keys, in the same order, as the keys of the full scan, for every key-value
engine and every layer stack (serdes, object cache with dirty entries, TTL with expired
entries), after deletes; closing one early releases the engine's scan; a closed store
or a key the serde cannot read is an error, never a silently short list."""

from __future__ import annotations

from typing import Any

import pytest
from localstate import TaskStorage
from localstate.engines.memory import MemoryEngine
from localstate.errors import StoreClosedError
from localstate.layers import build_store
from localstate.serdes import get_serde

ENGINES = ["memory", "rocksdb", "leveldb"]


def _keys_of_full_scan(store: Any, start: Any = None, stop: Any = None) -> list[Any]:
    with (store.all() if start is None and stop is None else store.range(start, stop)) as it:
        return [k for k, _ in it]


def _range_keys(store: Any, start: Any = None, stop: Any = None) -> list[Any]:
    with store.range_keys(start, stop) as it:
        return list(it)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("cache", [0, 100])
def test_range_keys_equal_the_full_scans_keys_after_writes_and_deletes(make_config, engine, cache):
    config = make_config(s={"factory": engine, "key.serde": "string", "msg.serde": "json",
                            "object.cache.size": cache, "write.batch.size": 50})
    with TaskStorage(config) as st:
        s = st.store("s")
        s.put_all({f"k{i:05d}": {"i": i} for i in range(3000)})
        s.delete_all([f"k{i:05d}" for i in range(0, 3000, 3)])
        for i in range(1, 400, 7):  # single writes and deletes: with a cache, dirty when scanned
            s.put(f"k{i:05d}x", i)
            s.delete(f"k{i + 1:05d}")
        for start, stop in [(None, None), ("k00100", "k02000"), ("k00100", None), (None, "k00050"),
                            ("k9", "k99"), ("k00500", "k00500"), ("k00600", "k00400")]:
            expected = _keys_of_full_scan(s, start, stop)
            assert _range_keys(s, start, stop) == expected, (start, stop)
        with s.keys() as it:
            assert list(it) == _keys_of_full_scan(s)
        assert set(_range_keys(s)) == set(dict(s.items()))


@pytest.mark.parametrize("engine", ENGINES)
def test_range_keys_of_bytes_and_tuple_keyed_stores(make_config, engine):
    config = make_config(b={"factory": engine, "object.cache.size": 0},
                         t={"factory": engine, "key.serde": "tuple", "msg.serde": "long"})
    with TaskStorage(config) as st:
        b, t = st.store("b"), st.store("t")
        b.put_all({bytes([i % 7]) + i.to_bytes(4, "big"): b"\x01" for i in range(2000)})
        b.delete_all([bytes([3]) + i.to_bytes(4, "big") for i in range(3, 2000, 7)])
        t.put_all({(i % 5, f"u{i:05d}"): i for i in range(2000)})
        t.delete((2, "u00002"))
        assert _range_keys(b, b"\x02", b"\x04") == _keys_of_full_scan(b, b"\x02", b"\x04")
        assert _range_keys(b) == _keys_of_full_scan(b)
        assert _range_keys(t, (1,), (3,)) == _keys_of_full_scan(t, (1,), (3,))
        assert all(type(k) is tuple for k in _range_keys(t))
        assert (2, "u00002") not in _range_keys(t, (2,), (3,))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("cache", [0, 100])
def test_range_keys_hide_ttl_expired_entries_as_the_full_scan_does(make_config, engine, cache):
    config = make_config(s={"factory": engine, "key.serde": "string", "msg.serde": "json", "ttl.ms": 1000,
                            "ttl.time": "event", "object.cache.size": cache, "write.batch.size": 50,
                            "ttl.cleanup.batch": 0})
    with TaskStorage(config) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s.put_all({f"old{i:04d}": i for i in range(300)})
        st.advance_event_time(600)
        for i in range(0, 300, 2):
            s.put(f"new{i:04d}", i)  # expires at 1600
        s.put("old0005", "rewritten")  # a rewrite moves its expiry
        st.advance_event_time(1000)  # every "old" but old0005 expired, none swept yet
        expected = [f"new{i:04d}" for i in range(0, 300, 2)] + ["old0005"]
        assert _range_keys(s) == expected == _keys_of_full_scan(s)
        assert _range_keys(s, "old", "old9") == ["old0005"] == _keys_of_full_scan(s, "old", "old9")
        st.advance_event_time(2000)
        assert _range_keys(s) == [] and list(s) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_closing_a_keys_scan_early_releases_it_and_later_reads_raise(make_config, engine):
    config = make_config(s={"factory": engine, "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as st:
        s = st.store("s")
        s.put_all({f"k{i:05d}": i for i in range(5000)})
        it = s.range_keys("k00010", None)
        assert next(it) == "k00010"
        assert it.take(3) == ["k00011", "k00012", "k00013"]
        it.close()
        assert it.closed
        with pytest.raises(StoreClosedError, match="closed"):
            next(it)
        with pytest.raises(StoreClosedError, match="closed"):
            it.take(1)
        # writes after the early close are not disturbed, and a new scan sees them
        s.put("k00010a", 1)
        assert _range_keys(s, "k00010", "k00011") == ["k00010", "k00010a"]
        done = s.range_keys("k04998", None)  # a scan run to its end closes itself
        assert list(done) == ["k04998", "k04999"] and done.closed and list(done) == []


def test_a_memory_keys_scan_shows_the_map_as_of_its_creation():
    """As ``range``: writes made while the scan is open are not seen (the scan is frozen
    before the first write), so firing timers while registering new ones cannot loop."""
    engine = MemoryEngine()
    engine.put_all({b"k%04d" % i: b"v" for i in range(3000)})
    it = engine.range_keys(b"k0100", None)
    first = it.take(2)
    engine.delete_all([b"k%04d" % i for i in range(100, 3000)])
    engine.put(b"k0100a", b"new")
    assert first + list(it) == [b"k%04d" % i for i in range(100, 3000)]
    assert engine.range_keys(None, None).take(10**6) == [b"k%04d" % i for i in range(100)] + [b"k0100a"]


def test_keys_scan_of_a_closed_engine_raises():
    engine = MemoryEngine()
    engine.put_all({b"k%05d" % i: b"v" for i in range(5000)})
    it = engine.range_keys(None, None)
    it.take(10)
    engine.close()
    with pytest.raises(StoreClosedError):
        list(it)
    with pytest.raises(StoreClosedError):
        engine.range_keys(None, None)


@pytest.mark.parametrize("engine", ["rocksdb", "leveldb"])
def test_a_persistent_engine_closing_its_iterators_stops_a_keys_scan(make_config, engine):
    """An engine closes its open iterators when it closes: a keys-only scan must not read
    the native iterator after that. A bytes-keyed one raises at once; a decoding one hands
    out what it decoded before (as the full scan does, up to one chunk) and then raises."""
    config = make_config(s={"factory": engine, "key.serde": "string", "msg.serde": "json",
                            "object.cache.size": 0}, b={"factory": engine, "object.cache.size": 0})
    st = TaskStorage(config)
    s, b = st.store("s"), st.store("b")
    s.put_all({f"k{i:05d}": i for i in range(3000)})
    b.put_all({b"k%05d" % i: b"v" for i in range(3000)})
    keys, pairs, raw = s.range_keys(None, None), s.range(None, None), b.range_keys(None, None)
    assert keys.take(2) == ["k00000", "k00001"] and len(pairs.take(2)) == 2 and raw.take(2) == [b"k00000", b"k00001"]
    st.close()
    with pytest.raises(StoreClosedError):
        next(raw)
    got: dict[str, list[Any]] = {"keys": [], "pairs": []}
    for name, it in (("keys", keys), ("pairs", pairs)):
        with pytest.raises(StoreClosedError):
            for item in it:
                got[name].append(item)
    assert got["keys"] == [k for k, _ in got["pairs"]] and len(got["keys"]) < 16


def test_a_stored_key_the_serde_cannot_read_is_named_mid_keys_scan():
    engine = MemoryEngine()
    store = build_store(engine, name="scans", key_serde=get_serde("long"), msg_serde=get_serde("json"))
    store.put_all({i: i for i in range(40)})
    engine.put(b"\x80\x00\x00\x00\x00\x00\x00\x14x", b"1")  # 9 bytes: not a long
    with store.range_keys(None, None) as it:
        got = []
        with pytest.raises(Exception, match=r"store 'scans'.*long") as e:
            for k in it:
                got.append(k)
    assert got == list(range(21))  # every key before the bad one, then the error naming it
    assert "cannot be decoded" in str(e.value)


def test_range_keys_counts_one_scan_in_the_metrics(make_config):
    config = make_config(s={"factory": "memory", "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as st:
        s = st.store("s")
        s.put_all({"a": 1, "b": 2})
        before = st.metrics("s").range_scans
        assert _range_keys(s) == ["a", "b"]
        assert list(s.keys()) == ["a", "b"]
        assert st.metrics("s").range_scans == before + 2


def test_keys_of_keeps_the_rules_of_a_closed_or_exhausted_pair_iterator():
    from localstate.kv import KeyValueIterator, keys_of

    done = KeyValueIterator(iter([(b"a", b"1")]))
    assert list(done) == [(b"a", b"1")] and done.closed
    assert list(keys_of(done)) == []  # exhausted: ends, as the pairs do
    closed = KeyValueIterator(iter([(b"a", b"1")]))
    closed.close()
    with pytest.raises(StoreClosedError):
        next(keys_of(closed))
    live = KeyValueIterator(iter([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))
    keys = keys_of(live)
    assert keys.take(2) == [b"a", b"b"]
    keys.close()
    assert live.closed  # closing the keys closes the pairs
