"""The fused per-record path (issue 17): the cached layer's one-function put/delete and
its bytes shortcuts behave exactly like the layered path — counts, validation, reads.

Real rocksdb files and a real file changelog; each case runs with the object cache on
(the fused path) and off (the plain layers), which must agree.
"""

from __future__ import annotations

import pytest
from localstate import Config, TaskStorage
from localstate.errors import InvalidValueError, SerializationError


def _config(tmp_path, serde: str, cache: int) -> Config:
    return Config.from_dict({
        "job.name": "pp",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.pp-kv",
        "stores.kv.key.serde": serde,
        "stores.kv.msg.serde": serde,
        "stores.kv.object.cache.size": cache,
        "stores.kv.write.batch.size": min(cache, 4) if cache else 4,
    })


@pytest.mark.parametrize("cache", [0, 8])
def test_bytes_puts_deletes_and_gets_are_counted_and_read_back(tmp_path, cache):
    with TaskStorage(_config(tmp_path, "bytes", cache)) as s:
        kv = s.store("kv")
        for i in range(20):
            kv.put(b"k%02d" % i, b"v%02d" % i)
        for i in range(0, 20, 2):
            kv.delete(b"k%02d" % i)
        kv.put(b"k01", bytearray(b"from a bytearray"))  # the bytes serde takes it, as bytes
        got = [kv.get(b"k%02d" % i) for i in range(20)]
        m = s.metrics("kv")
        assert (m.puts, m.deletes) == (21, 10)
        assert m.gets == 20 and m.hits + m.misses == 20
        assert got[0] is None and got[3] == b"v03"
        assert bytes(got[1]) == b"from a bytearray"
        s.commit()
    with TaskStorage(_config(tmp_path, "bytes", cache)) as s, s.store("kv").all() as it:
        stored = dict(it)
    assert stored == {b"k01": b"from a bytearray", **{b"k%02d" % i: b"v%02d" % i for i in range(3, 20, 2)}}


@pytest.mark.parametrize("cache", [0, 8])
@pytest.mark.parametrize(("key", "value", "error", "match"), [
    ("text", b"v", SerializationError, "store 'kv'.*key"),
    (b"k", "text", SerializationError, "store 'kv'.*value"),
    (b"k", 3.5, SerializationError, "store 'kv'.*value"),
    (None, b"v", InvalidValueError, "None is not a valid key"),
    (b"k", None, InvalidValueError, "store 'kv'"),
])
def test_a_bad_key_or_value_is_refused_at_the_put_and_changes_nothing(tmp_path, cache, key, value, error, match):
    with TaskStorage(_config(tmp_path, "bytes", cache)) as s:
        kv = s.store("kv")
        kv.put(b"a", b"1")
        with pytest.raises(error, match=match):
            kv.put(key, value)
        assert s.metrics("kv").puts == 1
        s.commit()
        with kv.all() as it:
            assert dict(it) == {b"a": b"1"}


def test_the_fused_path_agrees_with_the_plain_layers_on_json(tmp_path):
    """Same operations, cache on and off, json serdes (no bytes shortcut): same state, same counts."""
    results = []
    for cache in (0, 8):
        root = tmp_path / f"c{cache}"
        with TaskStorage(_config(root, "json", cache)) as s:
            kv = s.store("kv")
            for i in range(30):
                kv.put(f"k{i % 7}", {"i": i})
                if i % 5 == 0:
                    kv.delete(f"k{(i + 3) % 7}")
            s.commit()
            m = s.metrics("kv")
            with kv.all() as it:
                results.append((dict(it), m.puts, m.deletes, m.records_logged))
    assert results[0][:3] == results[1][:3]
    assert results[1][3] <= results[0][3]  # the cache only ever logs fewer (deduplicated) records


def test_a_put_after_close_is_refused(tmp_path):
    s = TaskStorage(_config(tmp_path, "bytes", 8))
    kv = s.store("kv")
    s.close()
    with pytest.raises(Exception, match="closed"):
        kv.put(b"k", b"v")
    with pytest.raises(Exception, match="closed"):
        kv.delete(b"k")


def test_a_bytes_store_with_the_cache_writes_and_logs_exactly_the_model(tmp_path):
    """The bytes store's dirty set goes down as it is while it holds only bytes puts, and
    through the general flush once a delete, a bytearray or a small put_all joins it: mixed
    in every order over commits, the live reads, a scan, the committed changelog (restored
    into a fresh local copy) and the records logged all match a dict of the same writes."""
    import random
    import shutil

    rnd = random.Random(7)
    model: dict[bytes, bytes] = {}
    cfg = _config(tmp_path, "bytes", 8)
    with TaskStorage(cfg) as s:
        kv = s.store("kv")
        for step in range(600):
            key = b"k%02d" % rnd.randrange(24)
            op = rnd.random()
            if op < 0.6:
                value = b"v%d" % step
                kv.put(key, value)
                model[key] = value
            elif op < 0.75:
                kv.delete(key)
                model.pop(key, None)
            elif op < 0.85:
                kv.put(key, bytearray(b"ba%d" % step))
                model[key] = b"ba%d" % step
            elif op < 0.95:
                batch = {b"k%02d" % rnd.randrange(24): b"p%d" % step for _ in range(3)}
                kv.put_all(batch)
                model.update(batch)
            else:
                s.commit()
            if step % 50 == 0:
                assert {k: kv.get(k) for k in model} == model
        with kv.all() as it:
            assert {k: bytes(v) for k, v in it} == model
        s.commit()
    shutil.rmtree(tmp_path / "state")  # the local copy goes: the store is rebuilt from the changelog alone
    with TaskStorage(cfg) as s, s.store("kv").all() as it:
        assert {k: bytes(v) for k, v in it} == model


@pytest.fixture
def encoder_calls():
    """Counts every encode of the built-in json, string and bytes serdes (single and
    ``encode_many`` items), per serde and encoded object; the serdes are restored after."""
    from collections import Counter

    from localstate.serdes import get_serde

    calls: Counter = Counter()
    saved = []
    for name in ("json", "string", "bytes"):
        serde = get_serde(name)
        saved.append((serde, serde.encode, serde.encode_many))

        def one(v, _name=name, _encode=serde.encode):
            calls[_name, repr(v)] += 1
            return _encode(v)

        def many(items, _name=name, _many=serde.encode_many):
            for v in items:
                calls[_name, repr(v)] += 1
            return _many(items)

        object.__setattr__(serde, "encode", one)  # a frozen dataclass: set for this test only
        object.__setattr__(serde, "encode_many", many)
    try:
        yield calls
    finally:
        for serde, encode, encode_many in saved:
            object.__setattr__(serde, "encode", encode)
            object.__setattr__(serde, "encode_many", encode_many)


@pytest.mark.parametrize("serde", ["json", "string", "bytes"])
@pytest.mark.parametrize("cache", [0, 8])
def test_each_key_and_value_is_encoded_at_most_once_per_put(tmp_path, encoder_calls, serde, cache):
    """The per-record put path, cache on and off, over commits and a dirty set flushed
    many times: no key or value is encoded twice (bytes with the cache: not at all)."""
    key_serde = "bytes" if serde == "bytes" else "string"
    values = {
        "job.name": "pp", "job.state.dir": str(tmp_path / "state"), "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb", "stores.kv.changelog": "file.pp-kv",
        "stores.kv.key.serde": key_serde, "stores.kv.msg.serde": serde,
        "stores.kv.object.cache.size": cache, "stores.kv.write.batch.size": 4,
    }
    cfg = Config.from_dict(values)
    key = (lambda i: b"k%d" % i) if serde == "bytes" else (lambda i: f"k{i}")
    value = {"json": lambda i: {"n": i}, "string": lambda i: f"v{i}", "bytes": lambda i: b"v%d" % i}[serde]
    with TaskStorage(cfg) as s:
        kv = s.store("kv")
        for i in range(60):
            kv.put(key(i), value(i))
            if i % 25 == 24:
                s.commit()
        s.commit()
    assert max(encoder_calls.values(), default=0) <= 1, [k for k, n in encoder_calls.items() if n > 1]
    if serde != "bytes" or not cache:  # each put's key and value encoded exactly once
        puts = [(key_serde, repr(key(i))) for i in range(60)] + [(serde, repr(value(i))) for i in range(60)]
        assert [p for p in puts if encoder_calls[p] != 1] == []
