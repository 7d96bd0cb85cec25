"""TTL per key-value store (stores.<s>.ttl.*): visibility, sweep, tombstones, restore, config."""

from __future__ import annotations

import time

import pytest
from localstate import ConfigError, InvalidValueError, TaskStorage
from localstate.layers import ExpiringCachedStore
from localstate.storage import Recovery

ENGINES = ["memory", "rocksdb", "leveldb"]


def ttl_store(engine: str = "memory", **extra: object) -> dict[str, object]:
    return {"factory": engine, "key.serde": "string", "msg.serde": "json",
            "object.cache.size": 100, "write.batch.size": 10,
            "ttl.ms": 1000, "ttl.time": "event", **extra}


def changelog_records(storage: TaskStorage, name: str) -> list[tuple[bytes, bytes | None]]:
    log = storage.changelog(name)
    assert log is not None
    return [r for records, _ in log.read_batches(0, log.end_offset()) for r in records]


@pytest.mark.parametrize("engine", ENGINES)
def test_expired_entries_are_invisible_to_every_read_at_once(make_config, engine):
    with TaskStorage(make_config(s=ttl_store(engine))) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s["old"] = 1
        st.advance_event_time(600)
        s.put_all({"new": 2, "new2": 3})
        assert s["old"] == 1 and sorted(k for k, _ in s.all()) == ["new", "new2", "old"]
        st.advance_event_time(1000)  # old expires at 0 + 1000 (expired when now >= expiry)
        assert s.get("old") is None and "old" not in s
        with pytest.raises(KeyError):
            s["old"]
        assert s.get_all(["old", "new"]) == {"new": 2}
        with s.all() as it:
            assert dict(it) == {"new": 2, "new2": 3}
        with s.range("a", "z") as it:
            assert [k for k, _ in it] == ["new", "new2"]
        with s.prefix("o") as it:
            assert list(it) == []
        s["old"] = 5  # written again: a fresh expiry (OnCreateAndWrite)
        assert s["old"] == 5


@pytest.mark.parametrize("engine", ENGINES)
def test_the_mapping_protocol_sees_only_live_entries(make_config, engine):
    """len/bool/get(k, default)/pop/setdefault/keys over expired, unswept entries."""
    with TaskStorage(make_config(s=ttl_store(engine))) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s.update({"a": 1, "b": 2})
        st.advance_event_time(1000)  # both expired, not yet swept
        assert len(s) == 0 and not s and s.get("a", "gone") == "gone"
        assert s.pop("a", None) is None and s.setdefault("b", 7) == 7
        with s.keys() as keys:
            assert list(keys) == ["b"]
        assert len(s) == 1 and dict(s) == {"b": 7}


def test_sweep_logs_tombstones_so_restore_never_resurrects(make_config):
    config = make_config(s=ttl_store())
    with TaskStorage(config) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s.put_all({f"k{i}": i for i in range(30)})
        st.commit()
        st.advance_event_time(5000)
        st.commit()  # the commit-time sweep deletes all 30
        records = changelog_records(st, "s")
        assert sorted(k for k, v in records if v is None) == sorted(f"k{i}".encode() for i in range(30))
        assert isinstance(st.store("s"), ExpiringCachedStore)  # with an object cache, the task-facing layer
        assert st.store("s").expired_deleted == 30
    # a restore into a fresh state dir replays the tombstones: nothing comes back, even
    # before the event-time clock is known (it is committed with the checkpoint)
    with TaskStorage(config) as st:
        assert st.event_time == 5000
        with st.engine("s").all() as it:
            assert list(it) == []


def test_entries_that_expired_while_the_task_was_down_are_hidden_after_restore(make_config):
    # processing time: the wall clock moves while the task is down
    config = make_config(s=ttl_store(**{"ttl.time": "processing", "ttl.ms": 300}))
    with TaskStorage(config) as st:
        st.store("s")["a"] = 1
        st.commit()
    time.sleep(0.35)
    with TaskStorage(config) as st:
        s = st.store("s")
        assert s.get("a") is None and list(s.all()) == []
        with st.engine("s").all() as it:
            assert len(list(it)) == 1  # still in the engine until a sweep: invisible anyway
        st.commit()
        with st.engine("s").all() as it:
            assert list(it) == []


def test_sweep_is_bounded_and_walks_the_whole_key_space(make_config):
    config = make_config(s=ttl_store(**{"ttl.cleanup.batch": 7, "object.cache.size": 0}))
    with TaskStorage(config) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s.put_all({f"k{i:02}": i for i in range(20)})
        st.advance_event_time(600)
        s.put_all({f"live{i}": i for i in range(5)})  # 'live*' sort before 'k*'
        st.advance_event_time(1200)
        deleted = [s.inner.sweep() for _ in range(6)]
        assert all(d <= 7 for d in deleted) and sum(deleted) == 20
        assert sorted(k for k, _ in s.all()) == [f"live{i}" for i in range(5)]


def test_reads_found_expired_are_swept_even_with_cleanup_batch_zero(make_config):
    with TaskStorage(make_config(s=ttl_store(**{"ttl.cleanup.batch": 0}))) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s.put_all({"a": 1, "b": 2})
        st.commit()
        st.advance_event_time(2000)
        assert s.get("a") is None  # noticed by the read
        st.commit()
        assert [k for k, v in changelog_records(st, "s") if v is None] == [b"a"]


def test_on_read_and_write_refreshes_the_expiry(make_config):
    with TaskStorage(make_config(s=ttl_store(**{"ttl.update": "on-read-and-write"}))) as st:
        s = st.store("s")
        st.advance_event_time(0)
        s["a"] = 1
        s["b"] = 2
        st.advance_event_time(900)
        assert s["a"] == 1  # read at 900: now expires at 1900
        st.advance_event_time(1500)
        assert s.get("a") == 1 and s.get("b") is None


def test_adding_or_removing_ttl_on_a_committed_store_is_refused(make_config, tmp_path):
    plain = {"factory": "memory", "key.serde": "string", "msg.serde": "json"}
    with TaskStorage(make_config(s=plain)) as st:
        st.store("s")["a"] = 1
        st.commit()
    with pytest.raises(ConfigError, match=r"ttl.ms was added to store 's'.*Nothing was changed"):
        TaskStorage(make_config(s={**plain, "ttl.ms": "1h"}))
    with pytest.raises(ConfigError, match="ttl.ms was added"):  # accepting a config change cannot help
        TaskStorage(make_config(s={**plain, "ttl.ms": "1h"}), recovery=Recovery(accept_config_change={"s"}))
    with TaskStorage(make_config(s=plain)) as st:  # unchanged by the refusals
        assert st.store("s")["a"] == 1
    with TaskStorage(make_config(s={**plain, "ttl.ms": "1h"}), recovery=Recovery(reset={"s"})) as st:
        assert st.store("s").get("a") is None
        st.store("s")["b"] = 2
        st.commit()
    with pytest.raises(ConfigError, match="ttl.ms was removed from store 's'"):
        TaskStorage(make_config(s=plain))
    with TaskStorage(make_config(s={**plain, "ttl.ms": "2h"})) as st:  # a new ttl value is fine
        assert st.store("s")["b"] == 2


@pytest.mark.parametrize(("value", "message"), [
    (-5, "must be > 0"),
    (0, "must be > 0"),
    (1.5, "expected an integer"),
    ("soon", "ttl.ms"),
    (True, "expected an integer"),
    ("-1h", "must be > 0"),
])
def test_bad_ttl_values_are_config_errors(make_config, value, message):
    with pytest.raises(ConfigError, match=message):
        make_config(s={"factory": "memory", "ttl.ms": value})


def test_bad_ttl_keys_are_all_reported(make_config):
    with pytest.raises(ConfigError) as e:
        make_config(s={"factory": "memory", "ttl.ms": "1h", "ttl.time": "wall", "ttl.updte": "x"})
    assert "ttl.updte" in str(e.value) and "ttl.time = 'wall'" in str(e.value)
    with pytest.raises(ConfigError, match="ttl.ms is not"):
        make_config(s={"factory": "memory", "ttl.time": "event"})


@pytest.mark.parametrize("engine", ["topn", "hyperloglog", "bloom", "search"])
def test_ttl_on_a_non_key_value_engine_is_refused_in_validation(make_config, engine):
    with pytest.raises(ConfigError, match="not a key-value store and has no TTL"):
        extra = {"search.fields": "name:text:stored"} if engine == "search" else {}
        make_config(s={"factory": engine, "ttl.ms": 1000, **extra})


def test_ttl_units_and_put_none(make_config):
    config = make_config(s={"factory": "memory", "ttl.ms": "24h"})
    assert config.stores["s"].ttl.ms == 24 * 3600 * 1000
    with TaskStorage(config) as st:
        with pytest.raises(Exception, match="use delete"):
            st.store("s").put(b"k", None)


def test_event_time_ttl_write_before_any_event_time_is_an_error(make_config):
    with TaskStorage(make_config(s=ttl_store())) as st:
        s = st.store("s")
        with pytest.raises(InvalidValueError, match="no event time yet"):
            s["a"] = 1
        assert s.get("a") is None and list(s.all()) == []  # nothing was written
        st.advance_event_time(10)
        s["a"] = 1
        assert s["a"] == 1


def test_ttl_too_large_is_refused(make_config):
    with pytest.raises(ConfigError, match="must be <="):
        make_config(s={"factory": "memory", "ttl.ms": 1 << 60})


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("ttl.cleanup.batch", -1, "must be >= 0"),
    ("ttl.cleanup.batch", "lots", "ttl.cleanup.batch"),
    ("ttl.update", "on-read", "on-create-and-write"),
])
def test_bad_ttl_options(make_config, key, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        make_config(s={"factory": "memory", "ttl.ms": "1h", key: value})


def test_a_damaged_value_without_its_expiry_is_a_clear_error(make_config):
    with TaskStorage(make_config(s=ttl_store(**{"ttl.time": "processing"}))) as st:
        st.engine("s").put(b"k", b"abc")  # written under the layers: a value too short to hold an expiry
        with pytest.raises(Exception, match=r"store 's'.*cannot be decoded by serde 'ttl\+json'"):
            st.store("s").get("k")


@pytest.mark.parametrize("cache", [0, 16])
def test_a_damaged_value_after_a_good_expiry_is_a_clear_error(make_config, cache):
    """The pair is decoded inline on a read (TtlSerializedStore.get): a value whose expiry
    parses but whose own bytes do not still names the store and the pair serde."""
    import struct
    with TaskStorage(make_config(s=ttl_store(**{"ttl.time": "processing", "object.cache.size": cache}))) as st:
        st.engine("s").put(b"k", struct.pack(">q", 1 << 62) + b"{not json")
        with pytest.raises(Exception, match=r"store 's'.*cannot be decoded by serde 'ttl\+json'"):
            st.store("s").get("k")


@pytest.mark.parametrize("cache", [0, 16])
def test_a_value_its_serde_cannot_encode_is_refused_at_the_put_naming_store_and_key(make_config, cache):
    from localstate import SerializationError

    with TaskStorage(make_config(s=ttl_store("rocksdb", **{"object.cache.size": cache}))) as st:
        st.advance_event_time(10)
        s = st.store("s")
        s.put("ok", {"n": 1})
        for bad in ({"n": float("nan")}, {"n": object()}, {1, 2}):
            with pytest.raises(SerializationError, match=r"store 's'.*'k'"):
                s.put("k", bad)
        st.commit()
        assert dict(s) == {"ok": {"n": 1}}
        assert [k for k, _ in changelog_records(st, "s")] == [b"ok"]
