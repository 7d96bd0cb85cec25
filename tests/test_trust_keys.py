"""Issue 14 ("Trust"), keys and values: two keys are one key exactly when their
encodings are equal — with the object cache on or off, at any cache size, before and
after a restart; what cannot be stored fails at the call that passed it."""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.errors import InvalidValueError, SerializationError

SERDES = ["json", "msgpack", "tuple"]
CACHES = [0, 2, 1000]


def config(tmp: Path, key_serde: str, cache: int, msg_serde: str = "json") -> Config:
    return Config.from_dict({
        "job.name": "keys",
        "job.state.dir": str(tmp / "state"),
        "systems.file.path": str(tmp / "changelog"),
        "stores.s.factory": "memory",
        "stores.s.key.serde": key_serde,
        "stores.s.msg.serde": msg_serde,
        "stores.s.object.cache.size": cache,
        "stores.s.write.batch.size": 1 if cache == 0 else min(cache, 10),
    })


def aliases(key_serde: str) -> list[Any]:
    if key_serde == "tuple":
        return [(1, "u"), (1.0, "u"), (True, "u")]
    return [1, 1.0, True]


def expected_distinct(key_serde: str) -> int:
    return 3


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("key_serde", SERDES)
def test_keys_equal_in_python_but_encoded_apart_stay_apart(tmp_path, key_serde, cache):
    keys = aliases(key_serde)
    cfg = config(tmp_path, key_serde, cache)
    with TaskStorage(cfg) as s:
        st = s.store("s")
        st.put(keys[0], "A")
        assert st.get(keys[1]) is None and st.get(keys[2]) is None  # the case from the issue
        for i, k in enumerate(keys):
            st.put(k, f"v{i}")
        seen = {repr(k): st.get(k) for k in keys}
        s.commit()
    assert seen == {repr(k): f"v{i}" for i, k in enumerate(keys)}
    with TaskStorage(cfg) as s:  # after a restart: the same answers
        st = s.store("s")
        assert {repr(k): st.get(k) for k in keys} == seen
        with st.all() as it:
            assert len(list(it)) == expected_distinct(key_serde)


@pytest.mark.parametrize("cache", CACHES)
def test_put_all_and_delete_all_keep_aliases_apart(tmp_path, cache):
    cfg = config(tmp_path, "json", cache)
    with TaskStorage(cfg) as s:
        st = s.store("s")
        st.put_all([(1, "int"), (True, "bool"), (1.0, "float"), ("x", "str")])
        st.delete_all([True])
        assert [st.get(1), st.get(True), st.get(1.0), st.get("x")] == ["int", None, "float", "str"]
        s.commit()
    with TaskStorage(cfg) as s:
        st = s.store("s")
        assert [st.get(1), st.get(True), st.get(1.0), st.get("x")] == ["int", None, "float", "str"]


class Color(str, enum.Enum):
    RED = "red"


@pytest.mark.parametrize("cache", CACHES)
def test_keys_with_equal_encodings_are_one_key(tmp_path, cache):
    """The other direction: a str-subclass member and its plain string encode alike (json),
    so they are one key; so are a json tuple and list."""
    cfg = config(tmp_path, "json", cache)
    with TaskStorage(cfg) as s:
        st = s.store("s")
        st.put(Color.RED, 1)
        assert st.get("red") == 1
        st.put("red", 2)
        assert st.get(Color.RED) == 2
        st.put((1, 2), "t")
        assert st.get([1, 2]) == "t"
        s.commit()
    with TaskStorage(cfg) as s:
        assert s.store("s").get(Color.RED) == 2 and s.store("s").get((1, 2)) == "t"


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("key_serde", ["json", "msgpack", "pickle", "string", "tuple", "bytes"])
def test_none_key_is_rejected_with_every_serde(tmp_path, key_serde, cache):
    cfg = config(tmp_path, key_serde, cache)
    with TaskStorage(cfg) as s:
        st = s.store("s")
        for call in (lambda: st.put(None, 1), lambda: st.put_all([(None, 1)]), lambda: st.delete(None),
                     lambda: st.delete_all([None]), lambda: st.get(None), lambda: st.get_all([None])):
            with pytest.raises((InvalidValueError, SerializationError), match=r"None|NoneType"):
                call()
        s.commit()
        assert s.changelog("s").end_offset() == 0


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("bad", [object(), {"nan": math.nan}, [math.inf], {1: "int key"}])
def test_unencodable_value_fails_at_put_and_the_store_goes_on(tmp_path, cache, bad):
    cfg = config(tmp_path, "string", cache)
    with TaskStorage(cfg) as s:
        st = s.store("s")
        st.put("good", 1)
        with pytest.raises(SerializationError, match=r"store 's'.*'bad'"):
            st.put("bad", bad)
        with pytest.raises(SerializationError, match="store 's'"):
            st.put_all([("a", 1), ("bad", bad)] + [(f"k{i}", i) for i in range(30)])
        assert st.get("a") is None and st.get("bad") is None
        st.put("after", 2)  # later writes, the commit and close all work
        s.commit()
    with TaskStorage(cfg) as s:
        st = s.store("s")
        assert (st.get("good"), st.get("after"), st.get("bad")) == (1, 2, None)


def test_a_close_error_never_replaces_the_users_exception_and_bad_values_never_reach_close(tmp_path):
    cfg = config(tmp_path, "string", 100)

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        with TaskStorage(cfg) as s:
            with pytest.raises(SerializationError):
                s.store("s").put("k", object())
            raise Mine()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, math.nan], {"a": {"b": math.inf}}])
def test_json_serde_refuses_nan_and_infinities_instead_of_writing_null(value):
    from localstate.serdes import get_serde

    json = get_serde("json")
    with pytest.raises(ValueError, match="NaN and infinities"):
        json.encode(value)
    with pytest.raises(ValueError, match="NaN and infinities"):
        json.encode_many([1, value])
    assert json.decode(json.encode({"ok": [None, 1.5]})) == {"ok": [None, 1.5]}


@pytest.mark.parametrize("cache", CACHES)
def test_get_has_a_default_like_a_dict(tmp_path, cache):
    cfg = config(tmp_path, "string", cache)
    with TaskStorage(cfg) as s:
        counts = s.store("counts" if False else "s")
        counts["/home"] = counts.get("/home", 0) + 1
        counts["/home"] = counts.get("/home", 0) + 1
        assert counts.get("/home", 0) == 2 and counts.get("/none", "d") == "d"


# -- the other engines' keys (issue 14 cases 8 and 12) ----------------------------------------------------
def special(tmp: Path, **stores: dict[str, Any]) -> Config:
    values: dict[str, Any] = {"job.name": "sp", "job.state.dir": str(tmp / "state"),
                              "systems.file.path": str(tmp / "changelog")}
    for name, opts in stores.items():
        values.update({f"stores.{name}.{k}": v for k, v in opts.items()})
    return Config.from_dict(values)


def test_keyed_bloom_filter_refuses_the_empty_key_and_stays_reopenable(tmp_path):
    cfg = special(tmp_path, b={"factory": "bloom", "key.serde": "string", "bloom.capacity": 1000,
                               "bloom.keyed": True})
    with TaskStorage(cfg) as s:
        bloom = s.store("b")
        with pytest.raises(InvalidValueError, match="empty bytes"):
            bloom.add("x", key="")
        with pytest.raises((InvalidValueError, SerializationError)):
            bloom.add("x", key=None)
        bloom.add("x", key="k")
        s.commit()
    with TaskStorage(cfg) as s:
        assert s.store("b").might_contain("x", key="k")


def test_none_keys_are_refused_by_the_special_engines(tmp_path):
    cfg = special(tmp_path, h={"factory": "hyperloglog", "key.serde": "json"},
                  t={"factory": "topn", "key.serde": "json", "topn.size": 3})
    with TaskStorage(cfg) as s:
        with pytest.raises(InvalidValueError, match="None is not a valid key"):
            s.store("h").add(None, "item")
        with pytest.raises(InvalidValueError, match="None is not a valid key"):
            s.store("t").offer(None, 1)
        s.commit()
        assert s.changelog("h").end_offset() == 0 and s.changelog("t").end_offset() == 0
