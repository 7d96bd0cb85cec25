"""CloseableIterator.take (batch scans) and the serialized layer handing bytes through."""

from __future__ import annotations

from pathlib import Path

import pytest
from localstate.engine import StoreContext
from localstate.engines.memory import MemoryEngine
from localstate.engines.rocksdb import RocksDBEngine
from localstate.errors import StoreClosedError
from localstate.kv import KeyValueStore
from localstate.layers import build_store
from localstate.serdes import get_serde


def engine(kind: str, tmp_path: Path) -> KeyValueStore[bytes, bytes]:
    if kind == "memory":
        return MemoryEngine("m")
    return RocksDBEngine(StoreContext.local(tmp_path / "rocks", "rocks"))


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_take_gives_batches_then_empty_and_closes_at_the_end(kind, tmp_path):
    with engine(kind, tmp_path) as e:
        e.put_all([(b"k%03d" % i, b"v") for i in range(10)])
        it = e.range(b"k002", b"k009")
        assert [k for k, _ in it.take(4)] == [b"k002", b"k003", b"k004", b"k005"]
        assert not it.closed
        assert [k for k, _ in it.take(4)] == [b"k006", b"k007", b"k008"]  # fewer: the end
        assert it.closed and it.take(4) == []  # exhausted, like next() after the end
        it2 = e.all()
        it2.close()
        with pytest.raises(StoreClosedError):
            it2.take(1)  # closed before its end: an error, as for next()


def test_bytes_serdes_pass_engine_pairs_through_unchanged_and_others_still_decode(tmp_path):
    raw = build_store(MemoryEngine("raw"), name="raw", key_serde=get_serde("bytes"), msg_serde=get_serde("bytes"))
    raw.put(b"a", b"\x00\x01")
    with raw.all() as it:
        assert it.take(5) == [(b"a", b"\x00\x01")]
    with pytest.raises(Exception, match="raw"):
        raw.put("text", b"x")  # still validated on the way in
    typed = build_store(MemoryEngine("typed"), name="typed", key_serde=get_serde("string"),
                        msg_serde=get_serde("json"))
    typed.put("a", {"n": 1})
    with typed.all() as it:
        assert it.take(5) == [("a", {"n": 1})]


@pytest.mark.parametrize("n", [-1, 1.5, "3", None])
def test_take_refuses_a_count_that_is_not_a_non_negative_int(n):
    from localstate import InvalidValueError

    with MemoryEngine("m") as e:
        e.put(b"a", b"1")
        with e.all() as it:
            with pytest.raises(InvalidValueError, match="take"):
                it.take(n)
            assert it.take(0) == [] and not it.closed and it.take(1) == [(b"a", b"1")]
