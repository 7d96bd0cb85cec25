"""The KeyValueStore conformance suite (shipped, so any engine can run it).

Usage in a plug-in's tests::

    import pytest
    from localstate.testing import KeyValueStoreConformance, LAYER_COMBOS, layer_stack

    class TestMyEngine(KeyValueStoreConformance):
        @pytest.fixture(params=LAYER_COMBOS)
        def store(self, request, tmp_path):
            engine = MyEngine(StoreContext.local(tmp_path / "db"))  # Engine(context, options)
            with layer_stack(engine, request.param, tmp_path) as s:
                yield s

Keys and values are bytes; with the ``serialized`` layer they pass through the
``bytes`` serde, so the same assertions hold for every combination. For the
``logged`` combinations the suite also checks that the changelog replays to
exactly what the store holds.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from localstate.changelogger import ChangeLogger
from localstate.engine import KeyValueEngine
from localstate.errors import InvalidValueError, StoreClosedError
from localstate.kv import KeyValueStore
from localstate.layers import TtlPolicy, build_store
from localstate.serdes import get_serde

__all__ = ["KeyValueStoreConformance", "layer_stack", "LAYER_COMBOS"]

LAYER_COMBOS = ("none", "serialized", "cached", "cached+serialized", "logged+cached+serialized",
                "ttl+cached+serialized", "ttl")


@contextlib.contextmanager
def layer_stack(
    engine: KeyValueEngine, combo: str, tmp_path: Path, *, cache_size: int = 64, batch_size: int = 16
) -> Iterator[KeyValueStore[Any, Any]]:
    """``engine`` wrapped in the layers named by ``combo`` (one of :data:`LAYER_COMBOS`).

    With ``logged``, records go to a real file changelog under ``tmp_path``; the store
    object gets a ``changelog_state()`` helper returning the replayed changelog content.
    """
    layers = set(combo.split("+")) - {"none"}
    unknown = layers - {"serialized", "cached", "logged", "ttl"}
    if unknown:
        raise ValueError(f"unknown layer(s) {sorted(unknown)}; combos are {LAYER_COMBOS}")
    logger = partition = None
    if "logged" in layers:
        from localstate.changelog.file import FileChangelogPartition

        partition = FileChangelogPartition(tmp_path / "conformance-changelog" / "0")
        logger = ChangeLogger("conformance", partition, batch_size)
    bytes_serde = get_serde("bytes")
    store = build_store(
        engine,
        name="conformance",
        logger=logger,
        key_serde=bytes_serde if "serialized" in layers else None,
        msg_serde=bytes_serde if "serialized" in layers else None,
        cache_size=cache_size if "cached" in layers else 0,
        batch_size=batch_size,
        # a day: nothing expires during a test; the contracts must hold through the layer
        ttl=TtlPolicy(ms=86_400_000) if "ttl" in layers else None,
    )
    if partition is not None and logger is not None:
        def changelog_state() -> dict[bytes, bytes]:
            store.flush()
            end = logger.flush()
            state: dict[bytes, bytes | None] = {}
            for k, v in partition.read(0, end):
                state[k] = v
            return {k: v for k, v in state.items() if v is not None}

        store.changelog_state = changelog_state  # type: ignore[attr-defined]
    try:
        yield store
    finally:
        store.close()
        if partition is not None:
            partition.close()


def _items(it: Any) -> list[tuple[Any, Any]]:
    with it:
        return list(it)


class KeyValueStoreConformance:
    """Every KeyValueStore contract as a pytest test. Provide a ``store`` fixture.

    Set ``binary_keys = False`` in a subclass whose stack cannot take arbitrary bytes.
    """

    binary_keys = True

    # -- point operations ----------------------------------------------------------
    def test_get_missing_is_none(self, store: KeyValueStore) -> None:
        assert store.get(b"missing") is None
        assert b"missing" not in store

    def test_put_get_overwrite(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        assert store.get(b"a") == b"1"
        store.put(b"a", b"2")
        assert store.get(b"a") == b"2"
        assert b"a" in store

    def test_delete_and_delete_missing(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        store.delete(b"a")
        assert store.get(b"a") is None
        store.delete(b"never-existed")

    def test_put_none_is_an_error(self, store: KeyValueStore) -> None:
        with pytest.raises(InvalidValueError, match="delete"):
            store.put(b"a", None)

    def test_mapping_dunders(self, store: KeyValueStore) -> None:
        store[b"k"] = b"v"
        assert store[b"k"] == b"v"
        del store[b"k"]
        with pytest.raises(KeyError):
            store[b"k"]

    # -- the mapping protocol (MutableMapping) ------------------------------------------
    def test_is_a_mutable_mapping(self, store: KeyValueStore) -> None:
        assert isinstance(store, MutableMapping)

    def test_get_with_default(self, store: KeyValueStore) -> None:
        assert store.get(b"absent", b"dflt") == b"dflt"
        store.put(b"a", b"1")
        assert store.get(b"a", b"dflt") == b"1"
        store.put(b"e", b"")
        assert store.get(b"e", b"dflt") == b"", "an empty value is a value, not absent"

    def test_setdefault(self, store: KeyValueStore) -> None:
        assert store.setdefault(b"a", b"1") == b"1"
        assert store.setdefault(b"a", b"2") == b"1"
        assert store[b"a"] == b"1"
        with pytest.raises(InvalidValueError):
            store.setdefault(b"b", None)
        assert b"b" not in store

    def test_pop(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        assert store.pop(b"a") == b"1"
        assert b"a" not in store
        assert store.pop(b"a", b"gone") == b"gone"
        assert store.pop(b"a", None) is None
        with pytest.raises(KeyError):
            store.pop(b"a")

    def test_popitem_takes_the_smallest_key(self, store: KeyValueStore) -> None:
        with pytest.raises(KeyError):
            store.popitem()
        store.update({b"b": b"2", b"a": b"1"})
        assert store.popitem() == (b"a", b"1")
        assert store.popitem() == (b"b", b"2")
        assert len(store) == 0

    def test_len_bool_and_approximate_len(self, store: KeyValueStore) -> None:
        assert len(store) == 0 and not store
        store.put_all([(b"k%02d" % i, b"v") for i in range(20)])
        store.delete(b"k05")
        store.put(b"k03", b"again")
        assert len(store) == 19 and store
        assert store.approximate_len() >= 0
        store.clear()
        assert len(store) == 0 and not store

    def test_keys_values_items_iter_are_ordered_and_closeable(self, store: KeyValueStore) -> None:
        data = {b"c": b"3", b"a": b"1", b"b": b"2"}
        store.update(data)
        with store.keys() as keys:
            assert list(keys) == [b"a", b"b", b"c"]
        with store.values() as values:
            assert list(values) == [b"1", b"2", b"3"]
        with store.items() as items:
            assert list(items) == sorted(data.items())
        it = iter(store)
        assert next(it) == b"a"
        it.close()
        it.close()
        assert it.closed
        with pytest.raises(StoreClosedError):
            next(it)
        assert dict(store) == data
        assert sorted(store) == sorted(data)
        keys = store.keys()
        assert list(keys) == [b"a", b"b", b"c"]
        assert keys.closed, "an iterator run to its end releases the engine iterator"
        assert list(keys) == [], "and stays exhausted"

    def test_update_forms_and_none_rejects_the_batch(self, store: KeyValueStore) -> None:
        store.update({b"a": b"1"})
        store.update([(b"b", b"2")])
        store.update(dict.fromkeys([b"c"], b"3"))
        assert dict(store) == {b"a": b"1", b"b": b"2", b"c": b"3"}
        with pytest.raises(InvalidValueError):
            store.update([(b"d", b"4"), (b"a", None)])
        assert dict(store) == {b"a": b"1", b"b": b"2", b"c": b"3"}

    def test_del_of_an_absent_key_is_not_an_error(self, store: KeyValueStore) -> None:
        del store[b"never"]
        assert b"never" not in store

    def test_identity_equality(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        assert store == store
        assert store != {b"a": b"1"}
        assert dict(store) == {b"a": b"1"}
        assert hash(store) == hash(store)

    def test_empty_value_is_a_value(self, store: KeyValueStore) -> None:
        store.put(b"e", b"")
        assert store.get(b"e") == b""
        assert b"e" in store

    def test_large_value(self, store: KeyValueStore) -> None:
        big = bytes(range(256)) * 4096
        store.put(b"big", big)
        assert store.get(b"big") == big

    # -- bulk operations -----------------------------------------------------------
    def test_get_all_leaves_out_absent(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2")])
        assert store.get_all([b"a", b"b", b"c"]) == {b"a": b"1", b"b": b"2"}

    def test_put_all_mapping_and_later_wins(self, store: KeyValueStore) -> None:
        store.put_all({b"x": b"1", b"y": b"2"})
        store.put_all([(b"x", b"3"), (b"x", b"4")])
        assert store.get(b"x") == b"4" and store.get(b"y") == b"2"

    def test_delete_all(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
        store.delete_all([b"a", b"c", b"zz"])
        assert _items(store.all()) == [(b"b", b"2")]

    def test_put_all_with_a_none_value_writes_nothing(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        for batch in ([(b"a", b"2"), (b"b", None)], [(b"k%03d" % i, b"v") for i in range(100)] + [(b"z", None)]):
            with pytest.raises(InvalidValueError, match="delete"):
                store.put_all(batch)
        assert _items(store.all()) == [(b"a", b"1")]

    def test_bulk_operations_match_a_dict(self, store: KeyValueStore) -> None:
        """Batches below and above the layers' batch sizes, with repeated keys in one batch."""
        rng = random.Random(4321)
        model: dict[bytes, bytes] = {}
        keys = [b"k%03d" % i for i in range(150)]
        for step in range(400):
            n = rng.choice((1, 2, 5, 15, 16, 17, 63, 64, 65, 200))
            r = rng.random()
            if r < 0.35:
                batch = [(rng.choice(keys), b"%d.%d" % (step, j)) for j in range(n)]
                store.put_all(dict(batch) if r < 0.05 else batch)
                model.update(batch)
            elif r < 0.5:
                ks = [rng.choice(keys) for _ in range(n)]
                store.delete_all(ks)
                for k in ks:
                    model.pop(k, None)
            elif r < 0.6:
                k = rng.choice(keys)
                if r < 0.55:
                    store.put(k, b"p%d" % step)
                    model[k] = b"p%d" % step
                else:
                    store.delete(k)
                    model.pop(k, None)
            elif r < 0.9:
                ks = [rng.choice(keys) for _ in range(n)] + [b"absent"]
                assert store.get_all(ks) == {k: model[k] for k in ks if k in model}, f"step {step}: get_all"
                k = rng.choice(keys)
                assert store.get(k) == model.get(k), f"step {step}: get({k!r})"
            else:
                _check_range(store, model, rng, keys, step)
        _check_final(store, model)

    # -- scans -----------------------------------------------------------------------
    def test_range_is_half_open_and_ordered(self, store: KeyValueStore) -> None:
        for i in range(20):
            store.put(b"k%02d" % i, b"%d" % i)
        got = _items(store.range(b"k05", b"k10"))
        assert [k for k, _ in got] == [b"k%02d" % i for i in range(5, 10)]
        assert got[0] == (b"k05", b"5")

    def test_range_open_bounds(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
        assert [k for k, _ in _items(store.range(None, b"b"))] == [b"a"]
        assert [k for k, _ in _items(store.range(b"b", None))] == [b"b", b"c"]
        assert [k for k, _ in _items(store.range(None, None))] == [b"a", b"b", b"c"]

    def test_empty_and_inverted_range(self, store: KeyValueStore) -> None:
        store.put(b"b", b"1")
        assert _items(store.range(b"c", b"a")) == []
        assert _items(store.range(b"b", b"b")) == []

    def test_prefix(self, store: KeyValueStore) -> None:
        store.put_all([(b"ab", b"1"), (b"abc", b"2"), (b"abd", b"3"), (b"ac", b"4"), (b"a", b"5")])
        assert [k for k, _ in _items(store.prefix(b"ab"))] == [b"ab", b"abc", b"abd"]

    def test_prefix_with_ff_bytes(self, store: KeyValueStore) -> None:
        if not self.binary_keys:
            pytest.skip("stack takes text keys only")
        store.put_all([(b"a\xff", b"1"), (b"a\xff\x00", b"2"), (b"b", b"3"), (b"\xff\xff", b"4")])
        assert [k for k, _ in _items(store.prefix(b"a\xff"))] == [b"a\xff", b"a\xff\x00"]
        assert [k for k, _ in _items(store.prefix(b"\xff"))] == [b"\xff\xff"]

    def test_binary_keys_order_bytewise(self, store: KeyValueStore) -> None:
        if not self.binary_keys:
            pytest.skip("stack takes text keys only")
        keys = [b"\x00", b"\x00\x00", b"\x01", b"\x7f", b"\x80", b"\xff", b"\xff\x00"]
        store.put_all([(k, b"v") for k in reversed(keys)])
        assert [k for k, _ in _items(store.all())] == sorted(keys)

    def test_scans_see_unflushed_writes_and_deletes(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
        store.flush()
        store.delete(b"b")
        store.put(b"d", b"4")
        store.put(b"a", b"9")
        assert _items(store.all()) == [(b"a", b"9"), (b"c", b"3"), (b"d", b"4")]
        assert _items(store.range(b"a", b"c")) == [(b"a", b"9")]

    def test_range_keys_are_the_keys_of_range(self, store: KeyValueStore) -> None:
        store.put_all([(b"k%03d" % i, b"%d" % i) for i in range(300)])
        store.flush()
        store.delete_all([b"k%03d" % i for i in range(0, 300, 4)])
        store.put(b"k100x", b"new")  # unflushed writes and deletes are seen, as by range()
        store.delete(b"k101")
        for start, stop in [(None, None), (b"k050", b"k150"), (None, b"k010"), (b"k290", None),
                            (b"k200", b"k200"), (b"k200", b"k100")]:
            expected = [k for k, _ in _items(store.range(start, stop))]
            with store.range_keys(start, stop) as it:
                assert list(it) == expected, (start, stop)
        with store.keys() as it:
            assert it.take(3) == [b"k001", b"k002", b"k003"]  # closed early by the with
        it = store.range_keys(b"k050", None)
        store.put(b"k050a", b"written after the scan was created")
        with it:
            assert b"k050a" not in list(it)
        assert it.closed

    def test_iterator_close_is_idempotent_and_final(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2")])
        it = store.all()
        assert next(it) == (b"a", b"1")
        it.close()
        it.close()
        with pytest.raises(StoreClosedError):
            next(it)

    def test_iterator_left_open_then_store_closes(self, store: KeyValueStore) -> None:
        store.put_all([(b"a", b"1"), (b"b", b"2")])
        it = store.all()
        next(it)
        store.close()
        with pytest.raises(StoreClosedError):
            store.get(b"a")

    # The consistency rule every engine and layer stack follows: an iterator shows the
    # store as of the call that created it (range/prefix/all), not as of its first
    # next(); writes made while it is open are not seen and never break or extend it.
    def test_iterators_see_the_store_as_of_their_creation(self, store: KeyValueStore) -> None:
        store.put_all([(b"k%03d" % i, b"v") for i in range(50)])
        it = store.range(b"k000", b"k999")  # created, not started
        store.put(b"k010-new", b"n")
        store.delete(b"k020")
        store.put(b"k030", b"changed")
        with it:
            got = dict(_items(it))
        assert len(got) == 50 and b"k010-new" not in got
        assert got[b"k020"] == b"v" and got[b"k030"] == b"v"
        with store.all() as it:  # a new iterator sees the writes
            now = dict(_items(it))
        assert b"k010-new" in now and b"k020" not in now and now[b"k030"] == b"changed"

    def test_writes_during_iteration_neither_break_nor_extend_it(self, store: KeyValueStore) -> None:
        store.put_all([(b"k%03d" % i, b"v") for i in range(50)])
        seen = 0
        with store.all() as it:
            for k, _ in it:
                store.put(k + b"-x", b"w")  # inserts right after the cursor
                store.delete(b"k%03d" % min(49, seen + 5))
                seen += 1
                assert seen <= 50, "the scan saw keys written after it was created"
        assert seen == 50

    # -- lifecycle -------------------------------------------------------------------
    def test_close_is_idempotent_and_ops_fail_after(self, store: KeyValueStore) -> None:
        store.put(b"a", b"1")
        store.close()
        store.close()
        for op in (lambda: store.get(b"a"), lambda: store.put(b"a", b"2"), lambda: store.all(),
                   lambda: len(store), lambda: store.keys(), lambda: store.pop(b"a", None),
                   lambda: store.setdefault(b"a", b"1"), lambda: store.update({b"a": b"1"})):
            with pytest.raises(StoreClosedError):
                op()

    # -- a model check -----------------------------------------------------------------
    def test_random_operations_match_a_dict(self, store: KeyValueStore) -> None:
        rng = random.Random(1234)
        model: dict[bytes, bytes] = {}
        keys = [b"k%03d" % i for i in range(60)]
        for step in range(1500):
            k = rng.choice(keys)
            r = rng.random()
            if r < 0.45:
                v = b"%d" % step
                store.put(k, v)
                model[k] = v
            elif r < 0.6:
                store.delete(k)
                model.pop(k, None)
            elif r < 0.7:
                batch = [(rng.choice(keys), b"b%d" % step) for _ in range(5)]
                store.put_all(batch)
                model.update(batch)
            elif r < 0.75:
                ks = rng.sample(keys, 4)
                store.delete_all(ks)
                for x in ks:
                    model.pop(x, None)
            elif r < 0.9:
                assert store.get(k) == model.get(k), f"step {step}: get({k!r})"
            else:
                _check_range(store, model, rng, keys, step)
        _check_final(store, model)


def _check_range(store: Any, model: dict[bytes, bytes], rng: Any, keys: list[bytes], step: int) -> None:
    """A random ``range(a, b)`` of ``store`` equals the model's pairs in ``[a, b)``."""
    a, b = sorted(rng.sample(keys, 2))
    expect = sorted((x, y) for x, y in model.items() if a <= x < b)
    assert _items(store.range(a, b)) == expect, f"step {step}: range({a!r}, {b!r})"


def _check_final(store: Any, model: dict[bytes, bytes]) -> None:
    """After a random run: every pair equals the model, and so does the changelog where
    the test store exposes it (``changelog_state()``)."""
    assert _items(store.all()) == sorted(model.items())
    changelog_state = getattr(store, "changelog_state", None)
    if changelog_state is not None:
        assert changelog_state() == model
