"""The engine-half conformance kit (issue 14 case 15) over every built-in and contrib
engine, and proof that it catches an engine that trusts a stale stored offset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localstate import KeyValueEngine, StorageEngineFactory
from localstate.records import apply_records
from localstate.testing import StorageEngineConformance


class TestMemory(StorageEngineConformance):
    engine = "memory"


class TestRocksDB(StorageEngineConformance):
    engine = "rocksdb"


class TestLevelDB(StorageEngineConformance):
    engine = "leveldb"


class TestSQLite(StorageEngineConformance):
    engine = "localstate.contrib.sqlite_engine:SQLiteEngineFactory"


class TestTopN(StorageEngineConformance):
    engine = "topn"
    crash_trials = 1


class TestSearch(StorageEngineConformance):
    engine = "search"
    crash_trials = 1


# -- a broken engine: persists its dict with the offset of its last checkpoint, and
# trusts that offset on open even when it wrote after the checkpoint --------------------------
class TrustingEngine(KeyValueEngine):
    """The bug under test (not a mock of anything): a JSON-file engine whose stored
    offset is never invalidated by a write after ``checkpoint``."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "data.json"
        self.data: dict[bytes, bytes] = {}
        self.offset = 0
        if self.path.exists():
            raw = json.loads(self.path.read_text())
            self.data = {bytes.fromhex(k): bytes.fromhex(v) for k, v in raw["data"].items()}
            self.offset = raw["offset"]
        self.closed = False

    def _save(self) -> None:
        self.path.write_text(json.dumps({"offset": self.offset,
                                         "data": {k.hex(): v.hex() for k, v in self.data.items()}}))

    def get(self, key):
        return self.data.get(key)

    def put(self, key, value):
        self.data[key] = value

    def delete(self, key):
        self.data.pop(key, None)

    def range(self, start, stop):
        from localstate import KeyValueIterator

        keys = sorted(k for k in self.data if (start is None or k >= start) and (stop is None or k < stop))
        return KeyValueIterator(iter([(k, self.data[k]) for k in keys]))

    def prefix(self, prefix):
        return self.range(prefix, None if not prefix else prefix[:-1] + bytes([prefix[-1] + 1]))

    def all(self):
        return self.range(None, None)

    def restore(self, records, *, into_empty=False):
        apply_records(records, self.data)

    def prepare_restore(self, committed_offset, min_valid_offset):
        if min_valid_offset <= self.offset <= committed_offset:
            return self.offset  # BUG: trusted although writes followed the checkpoint
        self.data, self.offset = {}, 0
        return 0

    def checkpoint(self, offset):
        self.offset = offset
        self._save()

    def flush(self):
        pass

    def close(self):
        if not self.closed:
            self.closed = True
            self._save()  # an uncommitted close persists the cached writes, old offset kept


class TrustingFactory(StorageEngineFactory):
    def create(self, spec, context):
        return TrustingEngine(context.directory)


class _Broken(StorageEngineConformance):
    engine = f"{__name__}:TrustingFactory"
    crash_trials = 0


def test_the_kit_catches_an_engine_that_trusts_a_stale_offset(tmp_path):
    kit = _Broken()
    kit.test_reopen_with_its_local_copy_is_the_last_commit(tmp_path / "a")  # the happy path passes
    with pytest.raises(AssertionError):
        kit.test_an_uncommitted_close_is_never_visible(tmp_path / "b")
