"""The batch paths the timers ride on (issue 16's throughput target), checked for the
same results as the general paths: the memory engine's ``put_all`` (one copy of a
value every key shares; all-new keys in one insert), the serialized layer handing an
all-bytes dict of a bytes store down unchanged, and ``register_all``'s record keys for
``str`` keys built in one concatenation."""

from __future__ import annotations

from typing import Any

import pytest
from localstate import InvalidValueError, TaskStorage
from localstate.engines.memory import MemoryEngine
from localstate.errors import SerializationError
from localstate.timers import EVENT_TIME, Timers

TIMERS = {"factory": "memory", "object.cache.size": 0, "write.batch.size": 64}


def _contents(engine: MemoryEngine) -> list[tuple[bytes, bytes]]:
    with engine.all() as it:
        return list(it)


@pytest.mark.parametrize("value", [b"\x01", b"", b"same value", bytes(bytearray(b"x" * 300))])
def test_memory_put_all_of_one_shared_value_mixes_new_and_existing_keys(value):
    engine = MemoryEngine()
    engine.put_all({b"k%04d" % i: b"old" for i in range(0, 1000, 2)})
    batch = {b"k%04d" % i: value for i in range(500, 1500)}
    engine.put_all(batch)
    expected = {b"k%04d" % i: b"old" for i in range(0, 500, 2)} | batch
    assert _contents(engine) == sorted(expected.items())
    assert len(engine) == len(expected)
    engine.put_all({b"k%04d" % i: bytes(bytearray(value)) for i in range(1480, 1490)})  # equal, not identical
    engine.put_all({b"k%04d" % i: b"v%d" % i for i in range(1490, 1510)})  # values that differ
    assert engine.get(b"k1495") == b"v1495" and engine.get(b"k1489") == value and engine.get(b"k1509") == b"v1509"
    assert [k for k, _ in _contents(engine)] == sorted(k for k, _ in _contents(engine))


def test_memory_put_all_all_new_keys_into_a_non_empty_map_keeps_order_and_open_scans():
    engine = MemoryEngine()
    engine.put_all({b"b%03d" % i: b"1" for i in range(100)})
    scan = engine.range(None, None)
    first = scan.take(1)
    engine.put_all({b"a%03d" % i: b"2" for i in range(50)} | {b"c%03d" % i: b"3" for i in range(5)})
    assert first + list(scan) == [(b"b%03d" % i, b"1") for i in range(100)]  # as of its creation
    keys = engine.range_keys(None, None).take(10**6)
    assert keys == sorted(keys) and len(keys) == 155
    assert engine.get(b"a049") == b"2" and engine.get(b"c004") == b"3"


@pytest.mark.parametrize("bad", [{b"k": None}, {b"k": "str"}, {"k": b"v"}, {b"k": 1}])
def test_memory_put_all_still_refuses_non_bytes_and_writes_nothing(bad):
    engine = MemoryEngine()
    engine.put_all({b"a": b"1"})
    with pytest.raises(Exception, match="bytes|None"):
        engine.put_all({b"z": b"1", **bad})
    assert _contents(engine) == [(b"a", b"1")]


@pytest.mark.parametrize("bad", ["k0001", 1, None, ("k",)])
def test_memory_delete_of_a_non_bytes_key_is_an_error_that_deletes_nothing(bad):
    """As the other engines: a key that is not bytes reaching the engine is named, not
    silently ignored (it can never be stored, so ignoring it hid a missing key serde)."""
    engine = MemoryEngine("m")
    keys = [b"k%04d" % i for i in range(3000)]
    engine.put_all(dict.fromkeys(keys, b"v"))
    with pytest.raises(SerializationError, match="store 'm': engines store bytes"):
        engine.delete(bad)
    for batch in ([b"k0001", bad], keys[:2000] + [bad]):  # the general path and the long-run path
        with pytest.raises(SerializationError, match="store 'm'"):
            engine.delete_all(batch)
    assert len(engine) == 3000


def test_a_bytes_store_takes_an_all_bytes_dict_as_it_is_and_checks_anything_else(make_config):
    config = make_config(b={"factory": "memory", "object.cache.size": 0})
    with TaskStorage(config) as st:
        b = st.store("b")
        b.put_all({b"k1": b"v1", b"k2": b"\x01"})
        b.put_all({})
        b.put_all({b"k3": bytearray(b"v3"), b"k4": memoryview(b"v4")})  # the serde's conversions
        assert dict(b.items()) == {b"k1": b"v1", b"k2": b"\x01", b"k3": b"v3", b"k4": b"v4"}
        with pytest.raises(InvalidValueError, match=r"put\(b'k5', None\)"):
            b.put_all({b"k5": None})
        with pytest.raises((SerializationError, InvalidValueError), match="store 'b'"):
            b.put_all({b"k6": b"v", "text": b"v"})
        assert sorted(b.keys()) == [b"k1", b"k2", b"k3", b"k4"]
        assert st.metrics("b").puts == 4  # the refused batches counted nothing
        st.commit()
        assert st.metrics("b").records_logged == 4  # and logged nothing


@pytest.mark.parametrize("keys", [
    ["a", "é", "日本", "", "user-00000001"],
    ["b", 7, b"raw", ("t", 1), -3],  # mixed types: the general encoder
])
def test_register_all_stores_the_same_record_keys_as_register(make_config, keys: list[Any]):
    stamps = list(range(len(keys)))
    with TaskStorage(make_config(one=TIMERS, many=TIMERS)) as st:
        one = Timers(st.store("one"), EVENT_TIME, lambda: 0)
        many = Timers(st.store("many"), EVENT_TIME, lambda: 0)
        for k, ts in zip(keys, stamps):
            one.register(k, ts)
        many.register_all(keys, stamps)
        with st.store("one").keys() as a, st.store("many").keys() as b:
            assert list(a) == list(b)
        assert many.pending() == one.pending() == list(zip(keys, stamps))
        fired: list[tuple[Any, int]] = []
        assert many.fire_batch(lambda ks, ts: fired.extend(zip(ks, ts)), up_to=len(keys)) == len(keys)
        assert fired == list(zip(keys, stamps)) and many.pending() == []


def test_register_all_of_a_str_key_utf8_cannot_encode_names_it_and_stores_nothing(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = Timers(st.store("timers"), EVENT_TIME, lambda: 0)
        with pytest.raises(InvalidValueError, match="timer key"):
            t.register_all(["fine", "bad\ud800"], [1, 2])
        assert t.pending() == []


def test_fire_batch_after_restore_fires_the_committed_timers_once(make_config):
    """The keys-only firing path over a store restored from its changelog (the memory
    engine starts empty and is rebuilt), with deletes of fired timers logged as
    tombstones: a second restore has nothing left to fire."""
    config = make_config(timers=TIMERS)
    with TaskStorage(config) as st:
        t = Timers(st.store("timers"), EVENT_TIME, lambda: 0)
        t.register_all([f"u{i:05d}" for i in range(5000)], [i % 97 for i in range(5000)])
        st.commit()
    with TaskStorage(config) as st:
        t = Timers(st.store("timers"), EVENT_TIME, lambda: 0)
        fired: list[Any] = []
        assert t.fire_batch(lambda ks, ts: fired.extend(zip(ts, ks)), up_to=50, chunk=1000) == len(fired)
        assert fired == sorted(fired) and {ts for ts, _ in fired} == set(range(51))
        st.commit()
    with TaskStorage(config) as st:
        t = Timers(st.store("timers"), EVENT_TIME, lambda: 0)
        assert t.fire_batch(lambda ks, ts: None, up_to=50) == 0
        assert len(t.pending()) == 5000 - len(fired)


@pytest.mark.parametrize("batch", [7, 100_000])  # tombstones drained at once / left pending to the commit
def test_bulk_deletes_of_a_bytes_store_are_logged_and_restore_exactly(make_config, batch):
    """The bulk-delete path (serialized layer hands bytes keys down as they are, the change
    logger takes the tombstones' dict as its pending dict when it has nothing pending)
    logs every tombstone after the writes it follows: a restore gives exactly the state."""
    config = make_config(b={"factory": "memory", "object.cache.size": 0, "write.batch.size": batch})
    keys = [b"k%04d" % i for i in range(300)]
    with TaskStorage(config) as st:
        b = st.store("b")
        b.put_all(dict.fromkeys(keys, b"v"))
        st.commit()  # nothing pending now: the next bulk delete starts the pending dict
        b.delete_all(keys[:100])
        b.put_all({k: b"again" for k in keys[50:60]})  # re-written after its tombstone: later wins
        b.delete_all(iter(keys[200:250]))  # any iterable, and with records already pending
        b.delete_all([])
        expected = dict(b.items())
        st.commit()
    assert len(expected) == 300 - 100 + 10 - 50 and expected[b"k0055"] == b"again"
    with TaskStorage(config) as st:  # the memory engine starts empty: all of it from the changelog
        assert dict(st.store("b").items()) == expected
