"""Serdes: round trips, and byte order == value order for the order-preserving ones."""

from __future__ import annotations

import pytest
from hypothesis import given
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
