"""Columnar store access (``TaskStorage.columns``, ``layers/columnar.py``) and the Arrow
column codecs under it (``serdes_columns.py``).

The codecs must give exactly the row serdes' bytes (byte identity is what makes a key
written through columns the same key as one written through ``put``), decode them back,
and fail with the row serde's error where the row serde fails. The store must behave
like the row API over real RocksDB files and a real file changelog: same state after a
restore, same metrics, refusals that name the store and write nothing."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from localstate import Config, TaskStorage
from localstate.errors import ConfigError, InvalidValueError, SerializationError, StoreClosedError
from localstate.layers.columnar import ColumnChunk
from localstate.serdes import get_serde
from localstate.serdes_columns import column_decoder, column_encoder

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def _rows(columns: list[pa.Array]) -> list[tuple[Any, ...]]:
    return list(zip(*(c.to_pylist() for c in columns)))


# -- byte identity with the row serdes ---------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ints64, st.text(max_size=6)), max_size=40))
def test_tuple_int_str_columns_encode_and_decode_like_the_row_serde(rows: list[tuple[int, str]]) -> None:
    serde = get_serde("tuple")
    columns = [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows], pa.string())]
    encoded = column_encoder(serde)(columns)
    assert encoded == serde.encode_many(rows)  # zero bytes inside strings included (escaped)
    assert _rows(column_decoder(serde)(encoded)) == rows


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(ints64, st.binary(max_size=5), ints64, st.text(max_size=3)), min_size=1, max_size=30))
def test_tuple_columns_of_other_layouts_encode_like_the_row_serde(rows: list[tuple[Any, ...]]) -> None:
    serde = get_serde("tuple")
    columns = [pa.array([r[i] for r in rows]) for i in range(4)]
    encoded = column_encoder(serde)(columns)
    assert encoded == serde.encode_many(rows)
    assert _rows(column_decoder(serde)(encoded)) == rows  # the row decoder's path, same result


@pytest.mark.parametrize("kind", [pa.int8(), pa.int16(), pa.int32(), pa.uint32(), pa.large_string()])
def test_tuple_columns_of_other_arrow_types_give_the_same_bytes(kind: pa.DataType) -> None:
    serde = get_serde("tuple")
    values = ["a", "b\x00c", ""] if pa.types.is_large_string(kind) else [0, 7, 100]
    columns = [pa.array(values, kind), pa.array(["x", "y", "z"])]
    assert column_encoder(serde)(columns) == serde.encode_many(list(zip(values, ["x", "y", "z"])))


@settings(max_examples=100, deadline=None)
@given(st.lists(ints64, max_size=40), st.lists(ints32, max_size=40))
def test_long_and_int_columns_encode_and_decode_like_the_row_serdes(longs: list[int], ints: list[int]) -> None:
    for name, values, kind in (("long", longs, pa.int64()), ("int", ints, pa.int32())):
        serde = get_serde(name)
        encoded = column_encoder(serde)([pa.array(values, kind)])
        assert encoded == serde.encode_many(values)
        (decoded,) = column_decoder(serde)(encoded)
        assert decoded.to_pylist() == values


def test_missing_values_decode_as_nulls() -> None:
    long = get_serde("long")
    (decoded,) = column_decoder(long)([long.encode(-3), None, long.encode(2**62), None])
    assert decoded.to_pylist() == [-3, None, 2**62, None]
    (strings,) = column_decoder(get_serde("string"))([b"a", None])
    assert strings.to_pylist() == ["a", None]


def test_string_bytes_and_json_columns_encode_like_the_row_serdes() -> None:
    for name, values in (("string", ["é", "", "a\x00"]), ("bytes", [b"\x00", b"", b"zz"])):
        serde = get_serde(name)
        assert column_encoder(serde)([pa.array(values)]) == serde.encode_many(values)
        assert column_decoder(serde)(serde.encode_many(values))[0].to_pylist() == values
    json = get_serde("json")  # no fast path: the row codec, same bytes
    assert column_encoder(json)([pa.array([1, 2, None])]) == json.encode_many([1, 2, None])
    assert column_decoder(json)(json.encode_many([1, 2]))[0].to_pylist() == [1, 2]


@pytest.mark.parametrize("name, column, match", [
    ("long", pa.array([2**63 - 1, 2**63], pa.uint64()), "does not fit"),
    ("int", pa.array([2**40]), "does not fit"),
    ("long", pa.array(["1"]), "expected int"),
    ("string", pa.array([b"x"]), "expected str"),
])
def test_what_the_row_serde_refuses_the_column_codec_refuses(name: str, column: pa.Array, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        column_encoder(get_serde(name))([column])


def test_bad_stored_bytes_fail_like_the_row_decoder() -> None:
    with pytest.raises(Exception, match="unpack requires a buffer of 8 bytes"):
        column_decoder(get_serde("long"))([b"\x80" * 8, b"\x80" * 7])
    with pytest.raises(UnicodeDecodeError):
        column_decoder(get_serde("string"))([b"\xff"])
    with pytest.raises(ValueError, match="bad tuple tag"):
        column_decoder(get_serde("tuple"))([get_serde("tuple").encode((1, "a")), b"\x99"])


# -- the store -----------------------------------------------------------------------------------
_HOURLY = {"factory": "rocksdb", "changelog": "file.hourly", "key.serde": "tuple", "msg.serde": "long",
           "object.cache.size": 0}


def _windows(n: int, window: int = 0) -> tuple[pa.Array, pa.Array]:
    return pa.array([window] * n, pa.int64()), pa.array([f"u{i:05d}" for i in range(n)])


def test_columnar_writes_are_the_row_api_s_keys_and_survive_a_restore(make_config: Any) -> None:
    config = make_config(hourly=_HOURLY)
    with TaskStorage(config) as storage:
        columns, rows = storage.columns("hourly"), storage.store("hourly")
        w, u = _windows(1000)
        keys = columns.encode_keys([w, u])
        columns.put_all(keys, [pa.array(range(1000), pa.int64())])
        rows.put((0, "u00001"), 41)  # the row API sees and updates the same key
        (stored,) = columns.get_all(keys)
        assert stored.to_pylist()[:3] == [0, 41, 2]
        columns.delete_all(columns.encode_keys([pa.array([0], pa.int64()), pa.array(["u00002"])]))
        assert rows.get((0, "u00002")) is None
        storage.commit(input_position=1)
    with TaskStorage(config, discard_local=True) as storage:  # rebuilt from the changelog alone
        with storage.store("hourly").all() as pairs:
            state = dict(pairs)
    assert len(state) == 999 and state[(0, "u00001")] == 41 and state[(0, "u00999")] == 999


def test_get_all_gives_nulls_for_absent_keys_and_counts_hits_and_misses(make_config: Any) -> None:
    with TaskStorage(make_config(hourly=_HOURLY)) as storage:
        columns = storage.columns("hourly")
        w, u = _windows(4)
        columns.put_all(columns.encode_keys([w[:2], u[:2]]), [pa.array([5, 6], pa.int64())])
        (stored,) = columns.get_all(columns.encode_keys([w, u]))
        assert stored.to_pylist() == [5, 6, None, None]
        m = storage.metrics("hourly")
        assert (m.gets, m.hits, m.misses, m.puts) == (4, 2, 2, 2)


@pytest.mark.parametrize("chunk_rows", [1, 7, 65_536])
def test_range_gives_columns_in_key_order_with_their_encoded_keys(make_config: Any, chunk_rows: int) -> None:
    with TaskStorage(make_config(hourly=_HOURLY)) as storage:
        columns, rows = storage.columns("hourly"), storage.store("hourly")
        for window in (7200, 0, 3600):
            w, u = _windows(10, window)
            columns.put_all(columns.encode_keys([w, u]), [pa.array([window + i for i in range(10)], pa.int64())])
        with columns.range((0,), (7200,), chunk_rows=chunk_rows) as chunks:
            got = list(chunks)
        assert all(isinstance(c, ColumnChunk) and len(c.keys) <= chunk_rows for c in got)
        scanned = [(w, u, n) for c in got for w, u, n in zip(*(a.to_pylist() for a in (*c.key_columns, *c.value_columns)))]
        with rows.range((0,), (7200,)) as pairs:
            assert scanned == [(k[0], k[1], v) for k, v in pairs]
        for chunk in got:  # the scanned keys delete without being encoded again
            columns.delete_all(chunk.keys)
        with rows.all() as pairs:
            assert [k[0] for k, _ in pairs] == [7200] * 10


def test_range_over_a_key_serde_that_is_not_order_preserving_warns_once(make_config: Any, caplog: Any) -> None:
    """As the row ``range`` does: the scan follows the encoded bytes, not the key order."""
    config = make_config(by_json={"factory": "rocksdb", "changelog": "file.by_json", "key.serde": "json",
                                  "msg.serde": "long", "object.cache.size": 0}, hourly=_HOURLY)
    with TaskStorage(config) as storage, caplog.at_level("WARNING", logger="localstate"):
        columns = storage.columns("by_json")
        columns.put_all(columns.encode_keys([pa.array(["b", "a"])]), [pa.array([1, 2], pa.int64())])
        for _ in range(2):
            with columns.range(None, None) as chunks:
                assert sum(len(c.keys) for c in chunks) == 2
        warned = [r for r in caplog.records if "not order-preserving" in r.getMessage()]
        assert len(warned) == 1 and "'by_json'" in warned[0].getMessage()
        caplog.clear()
        with storage.columns("hourly").range(None, None) as chunks:
            list(chunks)
        assert not [r for r in caplog.records if "not order-preserving" in r.getMessage()]


def test_refusals_name_the_store_and_write_nothing(make_config: Any) -> None:
    config = make_config(hourly=_HOURLY, daily={**_HOURLY, "changelog": "file.daily"}, cached={**_HOURLY, "changelog": "file.cached", "object.cache.size": 1000},
                         expiring={**_HOURLY, "changelog": "file.expiring", "ttl.ms": 1000},
                         top={"factory": "topn", "changelog": "file.top"})
    with TaskStorage(config) as storage:
        for name, match in (("cached", "object cache"), ("expiring", "TTL"), ("top", "not a key-value store")):
            with pytest.raises(ConfigError, match=f"store {name!r}: no columnar access: .*{match}"):
                storage.columns(name)
        columns, other = storage.columns("hourly"), storage.columns("hourly")
        assert columns is other
        w, u = _windows(3)
        keys = columns.encode_keys([w, u])
        with pytest.raises(InvalidValueError, match="lengths"):
            columns.put_all(keys, [pa.array([1, 2], pa.int64())])
        with pytest.raises(InvalidValueError, match="null value"):
            columns.put_all(keys, [pa.array([1, None, 3], pa.int64())])
        with pytest.raises(SerializationError, match="store 'hourly': the value serde 'long' cannot encode"):
            columns.put_all(keys, [pa.array(["1", "2", "3"])])
        with pytest.raises(SerializationError, match="the key serde 'tuple' cannot encode the key columns"):
            columns.encode_keys([pa.array([1.5]), pa.array([{"a": 1}])])  # a dict is no tuple element
        with pytest.raises(InvalidValueError, match="EncodedKeys from this store"):
            columns.put_all(storage.columns("daily").encode_keys([w, u]), [pa.array([1, 2, 3], pa.int64())])
        with pytest.raises(InvalidValueError, match="EncodedKeys"):
            columns.delete_all([b"raw bytes"])  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match="chunk_rows"):
            columns.range(None, None, chunk_rows=0)
        for name in ("hourly", "daily"):
            with storage.store(name).all() as pairs:
                assert list(pairs) == []
            assert storage.metrics(name).puts == 0


def test_a_stored_value_of_another_serde_is_named_when_scanned(make_config: Any) -> None:
    with TaskStorage(make_config(hourly=_HOURLY)) as storage:
        storage.engine("hourly").put(get_serde("tuple").encode((0, "u")), b"not eight")  # type: ignore[attr-defined]
        with pytest.raises(SerializationError, match="store 'hourly': a stored value cannot be decoded by serde 'long'"):
            with storage.columns("hourly").range(None, None) as chunks:
                list(chunks)


def test_closed_storage_refuses_columnar_access(make_config: Any) -> None:
    storage = TaskStorage(make_config(hourly=_HOURLY))
    columns = storage.columns("hourly")
    keys = columns.encode_keys(list(_windows(1)))
    storage.close()
    with pytest.raises(StoreClosedError):
        storage.columns("hourly")
    with pytest.raises(StoreClosedError):
        columns.get_all(keys)


def test_the_windowed_job_with_an_object_cache_is_refused_naming_the_store(tmp_path: Any) -> None:
    from localstate.contrib.spark import runner
    from localstate.contrib.spark.job_windowed import PageViewsPerHour
    from localstate.contrib.spark.jobs import job_config

    config = job_config(PageViewsPerHour, tmp_path, partitions=1, engine="rocksdb",
                        extra={"stores.hourly.object.cache.size": 20_000})
    batch = pa.record_batch({"ts": pa.array([7200], pa.int64()), "user_id": pa.array(["u1"])})
    schema = pa.schema([("window_start", pa.int64()), ("user_id", pa.string()), ("views", pa.int64())])  # the DDL's
    run = runner.TaskRun(config, PageViewsPerHour, schema, batch_id=0)
    with pytest.raises(ConfigError, match="store 'hourly': no columnar access: .*object.cache.size = 0"):
        list(runner.run_partition(run, 0, iter([batch])))
    with TaskStorage(config) as storage:  # nothing was committed
        assert storage.checkpoint is None


def test_a_crash_after_uncommitted_columnar_writes_reopens_at_the_last_commit(tmp_path: Any) -> None:
    """A child process writes and commits through columns, then overwrites, deletes and
    adds keys without committing, and exits without closing (``os._exit``): a real crash.
    The reopened store equals the last commit, whichever way it was read."""
    import json
    import subprocess
    import sys
    import textwrap

    values = {"job.name": "crash", "job.state.dir": str(tmp_path / "state"),
              "systems.file.path": str(tmp_path / "changelog"),
              **{f"stores.hourly.{k}": v for k, v in _HOURLY.items()},
              "stores.hourly.write.batch.size": 50}  # uncommitted records reach the changelog file
    child = textwrap.dedent("""
        import json, os, sys
        import pyarrow as pa
        from localstate import Config, TaskStorage
        s = TaskStorage(Config.from_dict(json.loads(sys.argv[1])))
        columns = s.columns("hourly")
        w, u = pa.array([0] * 300, pa.int64()), pa.array([f"u{i:03d}" for i in range(300)])
        keys = columns.encode_keys([w, u])
        columns.put_all(keys, [pa.array(range(300), pa.int64())])
        s.commit(input_position=1)
        columns.put_all(keys, [pa.array([-1] * 300, pa.int64())])          # never committed
        with columns.range(None, None, chunk_rows=100) as chunks:
            for chunk in list(chunks)[:1]:
                columns.delete_all(chunk.keys)                              # never committed
        more = columns.encode_keys([pa.array([3600], pa.int64()), pa.array(["new"])])
        columns.put_all(more, [pa.array([7], pa.int64())])                  # never committed
        assert s.changelog("hourly").end_offset() > s.committed_offset("hourly")
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", child, json.dumps(values)], check=True, timeout=120)
    with TaskStorage(Config.from_dict(values)) as storage:
        assert storage.checkpoint is not None and storage.checkpoint.input_position == 1
        with storage.store("hourly").all() as pairs:
            assert dict(pairs) == {(0, f"u{i:03d}"): i for i in range(300)}
        columns = storage.columns("hourly")
        (stored,) = columns.get_all(columns.encode_keys([pa.array([0, 3600], pa.int64()), pa.array(["u005", "new"])]))
        assert stored.to_pylist() == [5, None]


def test_empty_columns_and_chunked_arrays_work_like_lists(make_config: Any) -> None:
    with TaskStorage(make_config(hourly=_HOURLY)) as storage:
        columns = storage.columns("hourly")
        none = columns.encode_keys([pa.array([], pa.int64()), pa.array([], pa.string())])
        assert len(none) == 0 and [c.to_pylist() for c in columns.get_all(none)] == [[]]
        columns.put_all(none, [pa.array([], pa.int64())])
        columns.delete_all(none)
        keys = columns.encode_keys([pa.chunked_array([[0], [0, 3600]]), pa.chunked_array([["a", "b"], ["a"]])])
        assert keys.data == get_serde("tuple").encode_many([(0, "a"), (0, "b"), (3600, "a")])
        columns.put_all(keys, [pa.chunked_array([[1], [2, 3]])])
        with storage.store("hourly").all() as pairs:
            assert dict(pairs) == {(0, "a"): 1, (0, "b"): 2, (3600, "a"): 3}
        with pytest.raises(SerializationError, match="of equal length"):
            columns.encode_keys([pa.array([1, 2]), pa.array(["a"])])
        assert storage.metrics("hourly").puts == 3


def test_a_float_where_an_int_belongs_and_mixed_stored_keys_are_named(make_config: Any) -> None:
    with TaskStorage(make_config(hourly=_HOURLY)) as storage:
        columns, rows = storage.columns("hourly"), storage.store("hourly")
        keys = columns.encode_keys(list(_windows(2)))
        with pytest.raises(SerializationError, match=r"value serde 'long' cannot encode the value columns \(double\)"
                                                     r".*expected int, got float"):
            columns.put_all(keys, [pa.array([1.0, 2.5])])
        rows.put((0, "a"), 1)
        rows.put((0, "b", 7), 2)  # a key of another shape in the same store: no columns fit both
        with pytest.raises(SerializationError, match="store 'hourly': a stored key cannot be decoded.*different lengths"):
            with columns.range(None, None) as chunks:
                list(chunks)
        with rows.all() as pairs:
            assert dict(pairs) == {(0, "a"): 1, (0, "b", 7): 2}
