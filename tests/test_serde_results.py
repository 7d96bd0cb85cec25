"""What a user's serde returns and how often it runs.

A value or key serde whose encoder returns something other than bytes is refused at the
``put`` that passed the value, naming the store and the key — never later at a flush,
commit or close with a storage library's error — and the store commits and closes
normally afterwards. With the object cache on, each value put is encoded exactly once
(the bytes from the validation at ``put`` are the bytes that go down), so a serde with a
cost or a side effect runs once per put.

Real rocksdb and memory engines on a real file changelog.
"""

from __future__ import annotations

from collections import Counter

import pytest
from localstate import Config, Serde, TaskStorage, register_serde
from localstate.errors import SerializationError


def _bad_encode(v):
    if v == "none":
        return None
    if v == "text":
        return "not bytes"
    if v == "int":
        return 7
    if v == "ba":
        return bytearray(b"from a bytearray")
    return v.encode()


register_serde(Serde("results-test", _bad_encode, bytes.decode), clobber=True)

CALLS: Counter = Counter()


def _counting_encode(v):
    CALLS[v] += 1
    return v.encode()


register_serde(Serde("counting-test", _counting_encode, bytes.decode), clobber=True)


def _config(tmp_path, factory: str, cache: int, msg_serde: str, key_serde: str = "string", ttl: bool = False) -> Config:
    values = {
        "job.name": "sr",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": factory,
        "stores.kv.changelog": "file.sr-kv",
        "stores.kv.key.serde": key_serde,
        "stores.kv.msg.serde": msg_serde,
        "stores.kv.object.cache.size": cache,
        "stores.kv.write.batch.size": 4,
    }
    if ttl:
        values["stores.kv.ttl.ms"] = 3_600_000
    return Config.from_dict(values)


def _committed(cfg: Config) -> dict:
    with TaskStorage(cfg) as s, s.store("kv").all() as it:
        return dict(it)


@pytest.mark.parametrize("factory", ["rocksdb", "memory"])
@pytest.mark.parametrize("cache", [0, 8])
@pytest.mark.parametrize("value", ["none", "text", "int"])
def test_a_value_serde_that_returns_no_bytes_is_refused_at_the_put(tmp_path, factory, cache, value):
    cfg = _config(tmp_path, factory, cache, "results-test")
    s = TaskStorage(cfg)
    kv = s.store("kv")
    kv.put("a", "ok")
    with pytest.raises(SerializationError, match=r"store 'kv'.*results-test.*not bytes.*key 'k'"):
        kv.put("k", value)
    with pytest.raises(SerializationError, match="store 'kv'.*not bytes"):
        kv.put_all({"k1": "fine", "k2": value})
    s.commit()
    s.close()  # a rejected write leaves nothing behind that the close could trip on
    assert _committed(cfg) == {"a": "ok"}


@pytest.mark.parametrize("cache", [0, 8])
def test_a_key_serde_that_returns_no_bytes_is_refused_at_the_put(tmp_path, cache):
    cfg = _config(tmp_path, "rocksdb", cache, "string", key_serde="results-test")
    with TaskStorage(cfg) as s:
        kv = s.store("kv")
        kv.put("a", "ok")
        for bad in ("none", "text"):
            with pytest.raises(SerializationError, match="store 'kv'.*key.*not bytes"):
                kv.put(bad, "v")
            with pytest.raises(SerializationError, match="store 'kv'.*key.*not bytes"):
                kv.delete(bad)
        s.commit()
    assert _committed(cfg) == {"a": "ok"}


@pytest.mark.parametrize("cache", [0, 8])
def test_a_bytearray_result_is_stored_as_bytes(tmp_path, cache):
    cfg = _config(tmp_path, "rocksdb", cache, "results-test")
    with TaskStorage(cfg) as s:
        s.store("kv").put("k", "ba")
        s.commit()
    assert _committed(cfg) == {"k": "from a bytearray"}


@pytest.mark.parametrize("factory", ["rocksdb", "memory"])
@pytest.mark.parametrize("ttl", [False, True])
def test_each_value_is_encoded_once_with_the_object_cache(tmp_path, factory, ttl):
    cfg = _config(tmp_path, factory, 8, "counting-test", ttl=ttl)
    CALLS.clear()
    with TaskStorage(cfg) as s:
        kv = s.store("kv")
        for i in range(30):  # more than the cache: evictions push dirty batches down
            kv.put(f"k{i}", f"v{i}")
        kv.put_all({"b1": "w1", "b2": "w2"})  # a small batch joins the dirty set
        kv.put_all({f"c{i}": f"x{i}" for i in range(10)})  # a large one goes straight down
        s.commit()
    values = [f"v{i}" for i in range(30)] + ["w1", "w2"] + [f"x{i}" for i in range(10)]
    assert {v: CALLS[v] for v in values} == dict.fromkeys(values, 1)
    got = _committed(cfg)
    assert got == {**{f"k{i}": f"v{i}" for i in range(30)}, "b1": "w1", "b2": "w2",
                   **{f"c{i}": f"x{i}" for i in range(10)}}


def _column_values(columns):
    return [str(v).encode() for v in columns[0].to_pylist()]


COLUMN_CALLS: Counter = Counter()


def _counted_columns(columns):
    COLUMN_CALLS["encode_columns"] += 1
    return _column_values(columns)


register_serde(Serde("columns-test", lambda v: str(v).encode(), lambda b: int(b), True,
                     encode_columns=_counted_columns), clobber=True)
register_serde(Serde("bad-columns-test", lambda v: str(v).encode(), lambda b: int(b), True,
                     encode_columns=lambda columns: [str(v) for v in columns[0].to_pylist()]), clobber=True)


def test_a_user_serde_s_column_encoder_is_used_and_its_results_are_checked(make_config):
    """``Serde.encode_columns`` is the columnar path's encoder; what it returns is checked like
    ``encode_many``'s, so a str instead of bytes is refused naming the store, nothing written."""
    import pyarrow as pa

    store = {"factory": "rocksdb", "msg.serde": "long", "object.cache.size": 0}
    config = make_config(good={**store, "key.serde": "columns-test", "changelog": "file.good"},
                         bad={**store, "key.serde": "bad-columns-test", "changelog": "file.bad"})
    with TaskStorage(config) as storage:
        columns = storage.columns("good")
        keys = columns.encode_keys([pa.array([1, 2], pa.int64())])
        assert keys.data == [b"1", b"2"] and COLUMN_CALLS["encode_columns"] == 1
        with pytest.raises(SerializationError, match="store 'bad'.*returned str"):
            storage.columns("bad").encode_keys([pa.array([1], pa.int64())])
        with storage.store("bad").all() as pairs:
            assert list(pairs) == []
