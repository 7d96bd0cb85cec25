"""The serialized layer's bulk paths: scans decode a chunk at a time, ``put_all`` unzips
its pairs in C-level passes. Same results, same errors as item by item; a bad entry
or a bad stored byte is named, and a refused ``put_all`` writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from localstate.engines.memory import MemoryEngine
from localstate.errors import InvalidValueError, SerializationError
from localstate.layers import build_store
from localstate.serdes import get_serde


def _store(key_serde: str = "tuple", msg_serde: str = "long") -> tuple[Any, MemoryEngine]:
    engine = MemoryEngine()
    store = build_store(engine, name="scans", key_serde=get_serde(key_serde), msg_serde=get_serde(msg_serde))
    return store, engine


def _windowed(n: int) -> dict[tuple[int, str], int]:
    return {(3600 * (i % 3), f"u{i:06d}"): i for i in range(n)}


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 272, 273, 5000])
def test_scans_across_chunk_boundaries_give_every_pair_in_order(n: int) -> None:
    store, engine = _store()
    data = _windowed(n)
    store.put_all(data)
    with store.all() as it:
        assert list(it) == sorted(data.items())
    scans = _record_engine_scans(engine)
    with store.range((3600,), (7200,)) as it:
        assert it.take(10**6) == sorted((k, v) for k, v in data.items() if k[0] == 3600)
    with store.prefix((0,)) as it:
        assert list(it) == sorted((k, v) for k, v in data.items() if k[0] == 0)
    assert all(scan.closed for scan in scans)  # run to their end: closed without close()


def test_a_probe_and_a_partial_take_leave_the_rest_of_the_scan_intact() -> None:
    store, _ = _store()
    data = _windowed(1000)
    store.put_all(data)
    expected = sorted(data.items())
    with store.all() as it:
        assert next(it) == expected[0]
        assert it.take(20) == expected[1:21]  # crosses the first chunk of 16
        assert list(it) == expected[21:]


def _record_engine_scans(engine: MemoryEngine) -> list[Any]:
    """The engine's scan iterators, as the layer above gets them (kept to check they close)."""
    handed_out: list[Any] = []
    inner_range = engine.range

    def range_(start: bytes | None, stop: bytes | None) -> Any:
        handed_out.append(inner_range(start, stop))
        return handed_out[-1]

    engine.range = range_  # type: ignore[method-assign]
    return handed_out


def test_closing_a_scan_early_closes_the_engine_iterator() -> None:
    store, engine = _store()
    store.put_all(_windowed(5000))
    scans = _record_engine_scans(engine)
    it = store.all()
    it.take(3)
    assert not scans[0].closed
    it.close()
    assert it.closed and scans[0].closed
    with pytest.raises(Exception, match="closed"):
        next(it)


def test_a_stored_key_the_serde_cannot_read_is_named_mid_scan() -> None:
    store, engine = _store()
    store.put_all(_windowed(100))
    engine.put(b"\x10\x80\x00\x00\x00\x00\x00\x00\x05\x7fjunk", get_serde("long").encode(1))  # bad tag 0x7f
    with store.all() as it, pytest.raises(SerializationError, match=r"store 'scans': stored key .*serde 'tuple'"):
        list(it)


def test_the_pairs_before_a_bad_one_are_handed_out_before_the_error() -> None:
    store, engine = _store()
    data = _windowed(10)
    store.put_all(data)
    engine.put(get_serde("tuple").encode((7200, "u999999")), b"short")  # sorts last
    with store.all() as it:
        assert [next(it) for _ in range(10)] == sorted(data.items())  # same chunk as the bad pair
        with pytest.raises(SerializationError, match=r"stored value b'short'"):
            next(it)


def test_a_stored_value_the_serde_cannot_read_is_named_mid_scan() -> None:
    store, engine = _store()
    store.put_all(_windowed(100))
    engine.put(get_serde("tuple").encode((3600, "u999999")), b"short")
    with store.all() as it, pytest.raises(SerializationError, match=r"stored value b'short'.*serde 'long'"):
        list(it)


@pytest.mark.parametrize("entries", [
    [((0, "a"), 1), ((0, "b"), 2, 3)],  # a triple
    [((0, "a"), 1), 7],  # not a pair at all
    [((0, "a"), 1), ((0, "b"),)],  # a single
])
def test_put_all_refuses_an_entry_that_is_not_a_pair_and_writes_nothing(entries: list[Any]) -> None:
    store, engine = _store()
    with pytest.raises(InvalidValueError, match=r"store 'scans': put_all takes a mapping or \(key, value\) pairs"):
        store.put_all(entries)
    with engine.all() as it:
        assert list(it) == []


def test_put_all_of_pairs_as_lists_and_tuples_and_later_pairs_win() -> None:
    store, _ = _store("string", "json")
    store.put_all([("a", 1), ["b", [2]], ("a", 3)])
    assert store.get_all(["a", "b"]) == {"a": 3, "b": [2]}


def test_bytes_stores_scan_unchanged() -> None:
    store, _ = _store("bytes", "bytes")
    store.put_all({b"k%03d" % i: b"v" for i in range(300)})
    with store.all() as it:
        assert [k for k, _ in it] == [b"k%03d" % i for i in range(300)]
