"""Serdes: round trips, and byte order == value order for the order-preserving ones."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from localstate import Serde, get_serde, register_serde
from localstate.errors import ConfigError

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
elements = st.one_of(
    st.none(), st.booleans(), ints64, st.floats(allow_nan=False), st.binary(max_size=8), st.text(max_size=8)
)
tuples = st.lists(elements, max_size=4).map(tuple)


@given(st.lists(ints64, min_size=2, max_size=2))
def test_long_is_order_preserving(pair):
    long = get_serde("long")
    a, b = pair
    assert long.decode(long.encode(a)) == a
    assert (long.encode(a) < long.encode(b)) == (a < b)


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1), st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_int_is_order_preserving(a, b):
    s = get_serde("int")
    assert s.decode(s.encode(a)) == a
    assert (s.encode(a) < s.encode(b)) == (a < b)


@given(tuples)
def test_tuple_round_trip(t):
    s = get_serde("tuple")
    assert s.decode(s.encode(t)) == t


def _sort_key(t):
    rank = {type(None): 0, bool: 1, int: 2, float: 3, bytes: 4, str: 5}
    return tuple((rank[type(x)], x.encode() if isinstance(x, str) else x) for x in t)


@given(st.lists(st.one_of(ints64, st.text(max_size=6)), min_size=1, max_size=3).map(tuple),
       st.lists(st.one_of(ints64, st.text(max_size=6)), min_size=1, max_size=3).map(tuple))
def test_tuple_is_order_preserving(a, b):
    s = get_serde("tuple")
    if [type(x) for x in a] != [type(x) for x in b]:
        return
    assert (s.encode(a) < s.encode(b)) == (_sort_key(a) < _sort_key(b))


def test_tuple_prefix_is_a_byte_prefix():
    s = get_serde("tuple")
    assert s.encode((1, "user")).startswith(s.encode((1,)))


@pytest.mark.parametrize("name, value", [("json", {"a": [1, 2]}), ("msgpack", {"a": b"x"}), ("string", "héllo"),
                                         ("pickle", {1, 2}), ("bytes", b"\x00\xff")])
def test_round_trips(name, value):
    s = get_serde(name)
    assert s.decode(s.encode(value)) == value


@pytest.mark.parametrize("name, value", [("long", 2**64), ("long", "1"), ("int", 2**31), ("string", b"x"),
                                         ("tuple", [1]), ("tuple", (object(),)), ("bytes", "str")])
def test_unencodable_values_raise(name, value):
    with pytest.raises(TypeError):
        get_serde(name).encode(value)


def test_user_serde_registration():
    upper = Serde("upper-test", lambda s: s.upper().encode(), bytes.decode)
    register_serde(upper)
    assert get_serde("upper-test") is upper
    with pytest.raises(ConfigError, match="already registered"):
        register_serde(Serde("upper-test", str.encode, bytes.decode))


# -- serdes: the list fast paths equal the per-item ones ------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), ints64, st.floats(allow_nan=False), st.text(max_size=6))
_json_scalars = st.one_of(st.none(), st.booleans(), ints64, st.floats(allow_nan=False, allow_infinity=False),
                          st.text(max_size=6))
_SERDE_VALUES = {
    "bytes": st.binary(max_size=8),
    "string": st.text(max_size=8),
    # JSON has no NaN or infinities: the json serde refuses them (tests/test_trust_keys.py)
    "json": st.one_of(_json_scalars, st.lists(_json_scalars, max_size=3),
                      st.dictionaries(st.text(max_size=4), _json_scalars, max_size=3)),
    "msgpack": st.one_of(_scalars, st.binary(max_size=6), st.lists(_scalars, max_size=3)),
    "int": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "long": ints64,
    "tuple": st.lists(st.one_of(_scalars, st.binary(max_size=6)), max_size=4).map(tuple),
    "pickle": st.one_of(_scalars, st.frozensets(st.integers(), max_size=3)),
}


@pytest.mark.parametrize("name", sorted(_SERDE_VALUES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_encode_many_and_decode_many_equal_the_per_item_serde(name: str, data: st.DataObject) -> None:
    serde = get_serde(name)
    items = data.draw(st.lists(_SERDE_VALUES[name], max_size=12))
    encoded = serde.encode_many(items)
    assert encoded == [serde.encode(x) for x in items]
    assert serde.decode_many(encoded) == [serde.decode(b) for b in encoded]


_COLUMN = st.one_of(
    st.just(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.just(st.text(max_size=5, alphabet=st.sampled_from("ab\x00é\U0001f600"))),
    st.just(st.binary(max_size=5)),
    st.just(st.one_of(st.integers(min_value=-3, max_value=3), st.text(max_size=2))),  # mixed: falls back
    st.just(st.integers(min_value=2**63, max_value=2**64)),  # out of range: falls back, then raises
)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_tuple_encode_many_of_one_shape_is_byte_identical_and_decodes(data: st.DataObject) -> None:
    """The column-wise fast path (tuples of one shape of int/str/bytes) and the (int, str)
    decode fast path give exactly the per-item encoding and decoding."""
    serde = get_serde("tuple")
    columns = data.draw(st.lists(_COLUMN, min_size=1, max_size=3))
    items = data.draw(st.lists(st.tuples(*columns), min_size=0, max_size=40))
    try:
        expected = [serde.encode(x) for x in items]
    except TypeError:
        with pytest.raises(TypeError):
            serde.encode_many(items)
        return
    assert serde.encode_many(items) == expected
    assert serde.decode_many(expected) == items == [serde.decode(b) for b in expected]


@pytest.mark.parametrize("name, bad", [("string", [b"x"]), ("string", ["a", 1]), ("bytes", ["x"]), ("int", [2**31]),
                                       ("long", [True]), ("long", [1.5]), ("tuple", [[1]]), ("tuple", [(object(),)])])
def test_encode_many_rejects_what_encode_rejects(name: str, bad: list[Any]) -> None:
    serde = get_serde(name)
    with pytest.raises(TypeError):
        serde.encode(bad[-1])
    with pytest.raises(TypeError):
        serde.encode_many(bad)
