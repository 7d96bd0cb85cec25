"""The ttl rules fused into the object cache (ExpiringCachedStore): same behaviour as
without a cache — values checked with their own serde, expiry stamped, metrics counted
once — and the memory engine's slice delete of a contiguous run (the timers' firing path)."""

from __future__ import annotations

import pytest
from localstate import InvalidValueError, SerializationError, TaskStorage
from localstate.engines.memory import MemoryEngine
from localstate.layers import ExpiringCachedStore
from localstate.timers import EVENT_TIME, Timers


def ttl_store(cache: int, **extra: object) -> dict[str, object]:
    return {"factory": "memory", "key.serde": "string", "msg.serde": "json", "object.cache.size": cache,
            "write.batch.size": 2, "ttl.ms": 1000, "ttl.time": "event", **extra}


def counts(st: TaskStorage) -> tuple[int, int, int]:
    m = st.metrics("s")
    return m.puts, m.deletes, m.gets


@pytest.mark.parametrize("update", ["on-create-and-write", "on-read-and-write"])
def test_same_results_and_counts_with_and_without_the_cache(make_config, update):
    seen = []
    for cache in (0, 3):  # 3 < the keys used: evictions of dirty and clean pairs too
        config = make_config({"job.name": f"cache{cache}"}, s=ttl_store(cache, **{"ttl.update": update}))
        with TaskStorage(config) as st:
            s = st.store("s")
            st.advance_event_time(0)
            for i in range(6):
                s[f"k{i}"] = {"n": i}
            st.advance_event_time(500)
            s["k0"] = {"n": 10}  # rewritten: expires at 1500
            reads = [s.get(f"k{i}") for i in range(6)] + [s.get("absent", "d")]
            del s["k5"]
            st.advance_event_time(1000)  # the rest written at 0 expired (k1..k4) unless read-refreshed
            late = {k: s.get(k) for k in ("k0", "k1", "k4", "k5")}
            counted = counts(st)  # before the commit: with a cache, the sweep's own reads count as gets
            st.commit()
            seen.append((reads, late, dict(s), counted))
    assert seen[0] == seen[1]
    reads, late, live, (puts, deletes, gets) = seen[0]
    assert reads[0] == {"n": 10} and reads[-1] == "d"
    if update == "on-create-and-write":
        assert late == {"k0": {"n": 10}, "k1": None, "k4": None, "k5": None}
        assert (puts, deletes, gets) == (7, 1, 11)
    else:  # each read hit at 500 moved the expiry to 1500, and counts as a write
        assert late == {"k0": {"n": 10}, "k1": {"n": 1}, "k4": {"n": 4}, "k5": None}


def test_the_fused_put_checks_the_value_with_its_own_serde_and_changes_nothing_on_a_bad_one(make_config):
    with TaskStorage(make_config(s=ttl_store(16))) as st:
        s = st.store("s")
        assert isinstance(s, ExpiringCachedStore)  # the cache is the task-facing layer
        st.advance_event_time(5)
        s["ok"] = [1]
        for bad in (float("inf"), {"x": {1}}, b"raw"):
            with pytest.raises(SerializationError, match=r"store 's'.*'bad'"):
                s["bad"] = bad
        with pytest.raises(InvalidValueError, match="use delete"):
            s.put("bad", None)
        with pytest.raises(InvalidValueError, match="None is not a valid key"):
            s.put(None, 1)
        st.commit()
        assert dict(s) == {"ok": [1]} and st.metrics("s").puts == 1


def test_bytes_values_under_ttl_and_a_cache(make_config):
    store = ttl_store(8, **{"msg.serde": "bytes", "ttl.time": "processing", "ttl.ms": "1h"})
    with TaskStorage(make_config(s=store)) as st:
        s = st.store("s")
        s["a"] = b"x"
        with pytest.raises(Exception, match=r"store 's'"):
            s["b"] = "not bytes"
        st.commit()
        raw = st.engine("s").get(b"a")
        assert raw is not None and len(raw) == 9 and raw.endswith(b"x")  # 8-byte expiry + the value
        assert dict(s) == {"a": b"x"} and s.get("b") is None


def test_event_time_unknown_refuses_the_fused_put_and_writes_nothing(make_config):
    with TaskStorage(make_config(s=ttl_store(16))) as st:
        s = st.store("s")
        with pytest.raises(InvalidValueError, match="no event time yet"):
            s["a"] = 1
        st.commit()
        assert dict(s) == {} and st.metrics("s").puts == 0 and s.get("a") is None


@pytest.mark.parametrize("cache", [0, 16])
def test_keys_cached_under_their_encoding_under_ttl(make_config, cache):
    """json keys that Python merges (1, 1.0, True) or that are not simple (floats in a
    tuple) take the cache's per-key path; under TTL they still expire and stay apart."""
    store = ttl_store(cache, **{"key.serde": "json"})
    with TaskStorage(make_config(s=store)) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s[1] = "int"
        s[1.0] = "float"
        s[(2.5, "a")] = "tuple"
        st.advance_event_time(400)
        s[True] = "bool"
        assert [s.get(1), s.get(1.0), s.get(True), s.get((2.5, "a"))] == ["int", "float", "bool", "tuple"]
        assert s.get_all([1.0, (2.5, "a")]) == {1.0: "float", (2.5, "a"): "tuple"}
        st.advance_event_time(1000)
        assert s.get(1) is None and s.get(1.0) is None and s.get(True) == "bool"
        assert s.get_all([1.0, (2.5, "a"), True]) == {True: "bool"}
        st.commit()  # the sweep: 1 and 1.0 are two keys, the array key comes back as a list
        top = st.store("s")  # the ttl layer: the cache itself, or under the metered layer
        assert (top if isinstance(top, ExpiringCachedStore) else top.inner).expired_deleted == 3
        assert list(st.engine("s").all()) == [(b"true", st.engine("s").get(b"true"))]
        with s.all() as it:
            assert list(it) == [(True, "bool")]


def test_memory_delete_all_of_a_contiguous_run_keeps_the_rest_and_open_scans():
    engine = MemoryEngine("m")
    keys = [b"k%05d" % i for i in range(5000)]
    engine.put_all(dict.fromkeys(keys, b"v"))
    with engine.range(None, None) as scan:
        first = scan.take(10)
        engine.delete_all(keys[1000:4000])  # a sorted run longer than a scan chunk: one slice delete
        assert len(first) + len(scan.take(10_000)) == 5000  # the scan still shows the map as of its creation
    assert len(engine) == 2000
    assert engine.get(keys[999]) == b"v" and engine.get(keys[1000]) is None and engine.get(keys[4000]) == b"v"
    with engine.all() as it:
        assert [k for k, _ in it] == keys[:1000] + keys[4000:]
    # not a run of present neighbours (a gap, duplicates, absent or unsorted keys): the general path
    engine.delete_all([keys[0], keys[2]] + keys[4000:5000] + [keys[4000], b"zz"])
    assert len(engine) == 998 and engine.get(keys[1]) == b"v"
    engine.delete_all(list(reversed(keys[:1000])))
    with engine.all() as it:
        assert list(it) == []


@pytest.mark.parametrize("factory", ["memory", "rocksdb"])
def test_fire_batch_in_large_chunks_fires_each_timer_once_and_leaves_the_future(make_config, factory):
    timers_store = {"factory": factory, "object.cache.size": 0}
    with TaskStorage(make_config(timers=timers_store)) as st:
        t = Timers(st.store("timers"), EVENT_TIME, lambda: 0)
        n = 12_000
        t.register_all([f"u{i:05d}" for i in range(n)] + [7, b"b"], [i % 1000 for i in range(n)] + [5, 2000])
        seen: list[tuple[object, int]] = []
        fired = t.fire_batch(lambda ks, ts: seen.extend(zip(ks, ts)), up_to=999, chunk=3000)
        assert fired == n + 1 and len(set(seen)) == n + 1 and (7, 5) in seen
        assert [ts for _, ts in seen] == sorted(ts for _, ts in seen)
        assert t.pending() == [(b"b", 2000)]
        st.commit()


@pytest.mark.parametrize("cache", [0, 16])
def test_bad_bulk_input_under_ttl_changes_nothing(make_config, cache):
    with TaskStorage(make_config(s=ttl_store(cache))) as st:
        s = st.store("s")
        with pytest.raises(InvalidValueError, match="no event time yet"):
            s.put_all({"a": 1})
        st.advance_event_time(1)
        with pytest.raises(InvalidValueError, match="use delete"):
            s.put_all([("a", 1), ("b", None)])
        with pytest.raises(SerializationError, match=r"store 's'"):
            s.put_all({"a": 1, "b": float("nan")})
        with pytest.raises(InvalidValueError, match="None is not a valid key"):
            s.put_all([(None, 1)])
        with pytest.raises(InvalidValueError, match="None is not a valid key"):
            s.get_all(["a", None])
        st.commit()
        assert dict(s) == {} and st.metrics("s").puts == 0
        s.put_all({"a": 1})
        st.commit()
        assert dict(s) == {"a": 1}
