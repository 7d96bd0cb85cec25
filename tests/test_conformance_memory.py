"""The shipped conformance suite over the memory engine × every layer combination."""

from __future__ import annotations

from itertools import islice

import pytest
from localstate.engine import StoreContext
from localstate.engines.memory import MemoryEngine
from localstate.testing import LAYER_COMBOS, KeyValueStoreConformance, layer_stack


class TestMemoryConformance(KeyValueStoreConformance):
    @pytest.fixture(params=LAYER_COMBOS)
    def store(self, request, tmp_path):
        with layer_stack(MemoryEngine(StoreContext.local(tmp_path / "mem", "mem")), request.param, tmp_path) as s:
            yield s


@pytest.mark.parametrize("size", [10, 300, 5000, 100_000])
@pytest.mark.parametrize("write", ["put", "put_all", "delete", "delete_all", "wipe", "restore"])
def test_a_scan_shows_the_map_as_of_its_creation_across_chunk_boundaries(size, write):
    """The memory engine copies a scan's range lazily, chunk by chunk; a write freezes
    every open scan first. Whatever the chunk a write lands in, the scan is unchanged."""
    e = MemoryEngine("m")
    e.put_all({b"k%06d" % i: b"v%d" % i for i in range(size)})
    expected = [(b"k%06d" % i, b"v%d" % i) for i in range(size)]
    for stop_after in sorted({0, 1, size // 3, size - 1}):
        scans = [e.all(), e.range(b"k%06d" % (size // 2), None)]
        got = [list(islice(scans[0], stop_after)), []]
        later = b"k%06d" % (size - 1)
        if write == "put":
            e.put(later, b"changed")
            e.put(b"k999999", b"new")
        elif write == "put_all":
            e.put_all({later: b"changed", b"k999999": b"new"})
        elif write == "delete":
            e.delete(later)
        elif write == "delete_all":
            e.delete_all([b"k%06d" % i for i in range(size)])  # the bulk path replaces the map
        elif write == "wipe":
            e.wipe()
        else:
            e.restore([(later, None), (b"k999999", b"new")])
        got[0] += list(scans[0])
        got[1] = list(scans[1])
        for s in scans:
            s.close()
        assert got[0] == expected
        assert got[1] == expected[size // 2:]
        e.wipe()  # back to the original map for the next round
        e.put_all(dict(expected))


def test_short_reads_of_a_long_range_do_not_copy_it():
    """``range`` + ``take`` (the timers' firing loop) costs the chunk, not the range."""
    e = MemoryEngine("m")
    e.put_all({b"k%07d" % i: b"v" for i in range(200_000)})
    it = e.range(b"k", None)
    assert it.take(3) == [(b"k0000000", b"v"), (b"k0000001", b"v"), (b"k0000002", b"v")]
    scan = next(iter(e._scans))
    assert scan.lo == b"k%07d" % 255  # one first chunk of 256 copied, not 200,000
    it.close()
    assert not e._scans
