"""TaskStorage: commit protocol, exact restore, tail truncation, checkpoints, locks, layers."""

from __future__ import annotations

import pytest
from localstate import (
    LocalStateError,
    SerializationError,
    StoreClosedError,
    StoreLockedError,
    TaskStorage,
)
from localstate.errors import CorruptionError, InvalidValueError
from localstate.storage import Recovery

COUNTS = {"factory": "memory", "key.serde": "string", "msg.serde": "json",
          "object.cache.size": 100, "write.batch.size": 10}


def test_commit_then_reopen_restores_exactly_the_commit(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        counts = s.store("counts")
        for i in range(250):
            counts[f"k{i % 40}"] = i
        ckpt = s.commit(input_position={"offset": 250})
        counts["k1"] = "uncommitted"
        counts["new"] = 1
        del counts["k2"]
        counts.flush()  # pushed to engine + changelog, but never committed
    assert ckpt.version == 1
    with TaskStorage(config) as s:
        counts = s.store("counts")
        assert s.checkpoint.input_position == {"offset": 250}
        assert counts["k1"] == 241 and counts.get("new") is None and counts["k2"] == 242
        with counts.all() as it:
            assert len(list(it)) == 40
        # 40 keys round-robin with write.batch.size 10: no key repeats inside one batch
        assert s.last_restore["counts"].records == 250
        assert s.changelog("counts").end_offset() == ckpt.offsets["counts"]  # tail truncated


def test_dedup_between_commits_writes_only_the_latest(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        counts = s.store("counts")
        for v in (1, 2, 3):
            counts["x"] = v
        ckpt = s.commit()
        assert ckpt.offsets["counts"] == 1
        assert list(s.changelog("counts").read(0, 1)) == [(b"x", b"3")]


def test_versions_and_offsets_advance(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        c = s.store("counts")
        c["a"] = 1
        assert s.commit(1).version == 1
        c["b"] = 2
        ck = s.commit(2, version=41)
        assert ck.version == 41 and ck.offsets["counts"] == 2
    with TaskStorage(config) as s:
        assert s.checkpoint.version == 41 and s.checkpoint.input_position == 2


def test_no_commit_means_empty_state(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        s.store("counts")["a"] = 1
        s.store("counts").flush()
    with TaskStorage(config) as s:
        assert s.checkpoint is None
        assert s.store("counts").get("a") is None


def test_unlogged_store_is_not_restored(make_config):
    config = make_config(scratch={"factory": "memory", "changelog": "none"})
    with TaskStorage(config) as s:
        s.store("scratch")[b"a"] = b"1"
        ck = s.commit()
        assert "scratch" not in ck.offsets
    with TaskStorage(config) as s:
        assert s.store("scratch").get(b"a") is None


def test_restore_listener_gets_progress(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        s.store("counts").put_all([(f"k{i}", i) for i in range(500)])
        s.commit()
    events = []
    with TaskStorage(config, restore_listener=events.append):
        pass
    assert events[-1].done and events[-1].records == 500 and events[-1].bytes > 0
    assert events[-1].stop_offset == 500


def test_partitions_are_independent(make_config):
    config = make_config(extra={"job.partitions": 3}, counts=COUNTS)
    for p in range(3):
        with TaskStorage(config, p) as s:
            s.store("counts")["who"] = p
            s.commit(input_position=p)
    for p in range(3):
        with TaskStorage(config, p) as s:
            assert s.store("counts")["who"] == p and s.checkpoint.input_position == p
    with pytest.raises(LocalStateError, match="out of range"):
        TaskStorage(config, 3)


def test_same_task_twice_is_refused(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config):
        with pytest.raises(StoreLockedError, match="locked by pid"):
            TaskStorage(config)
    TaskStorage(config).close()


def test_closed_storage_and_store_raise(make_config):
    config = make_config(counts=COUNTS)
    s = TaskStorage(config)
    counts = s.store("counts")
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        counts.get("a")
    with pytest.raises(StoreClosedError):
        counts.put("a", 1)
    with pytest.raises(StoreClosedError):
        s.commit()
    with pytest.raises(StoreClosedError):
        s.store("counts")


def test_bad_values_and_keys(make_config):
    config = make_config(counts=COUNTS, raw={"factory": "memory", "object.cache.size": 0})
    with TaskStorage(config) as s:
        with pytest.raises(InvalidValueError, match="delete"):
            s.store("counts").put("a", None)
        with pytest.raises(SerializationError, match="stores.counts.key.serde"):
            s.store("counts").put(123, 1)
        with pytest.raises(SerializationError, match="stores.raw"):
            s.store("raw").put("text", b"x")
        with pytest.raises(LocalStateError, match="Did you mean 'counts'"):
            s.store("count")


def test_corrupt_checkpoint_is_an_error_and_previous_is_used_only_when_asked(make_config, tmp_path):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        s.store("counts")["a"] = 1
        s.commit(input_position=1)
        s.store("counts")["a"] = 2
        s.commit(input_position=2)
    ckpt = tmp_path / "changelog" / "_checkpoints" / "test" / "partition-0.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:-3] + b"xx}")
    before = {p: p.read_bytes() for p in (tmp_path / "changelog").rglob("*.log")}
    with pytest.raises(CorruptionError, match="--use-previous-checkpoint"):
        TaskStorage(config)
    assert {p: p.read_bytes() for p in (tmp_path / "changelog").rglob("*.log")} == before
    with TaskStorage(config, recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert s.checkpoint.input_position == 1
        assert s.store("counts")["a"] == 1
    with TaskStorage(config) as s:  # the recovered checkpoint is the latest now
        assert s.checkpoint.input_position == 1


def test_all_checkpoints_corrupt_is_an_error_not_empty(make_config, tmp_path):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        s.store("counts")["a"] = 1
        s.commit()
        s.commit()
    d = tmp_path / "changelog" / "_checkpoints" / "test"
    for f in d.iterdir():
        f.write_bytes(b"garbage")
    with pytest.raises(CorruptionError, match="is corrupt"):
        TaskStorage(config)
    with pytest.raises(CorruptionError, match="is corrupt"):
        TaskStorage(config, recovery=Recovery(use_previous_checkpoint=True))


def test_read_your_writes_in_scans_through_the_cache(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        c = s.store("counts")
        c.put_all([("a", 1), ("b", 2), ("c", 3)])
        s.commit()
        del c["b"]
        c["d"] = 4
        with c.range("a", "z") as it:
            assert list(it) == [("a", 1), ("c", 3), ("d", 4)]
        with c.prefix("b") as it:
            assert list(it) == []


def test_metrics_count_operations(make_config):
    config = make_config(counts=COUNTS)
    with TaskStorage(config) as s:
        c = s.store("counts")
        c["a"] = 1
        c.get("a")
        c.get("zz")
        s.commit()
        m = s.metrics("counts")
        assert (m.puts, m.gets, m.hits, m.misses, m.commits) == (1, 2, 1, 1, 1)


def test_store_compaction_via_storage(make_config):
    config = make_config(extra={"systems.file.segment.bytes": 4096}, counts=COUNTS)
    with TaskStorage(config) as s:
        c = s.store("counts")
        for i in range(3000):
            c[f"k{i % 10}"] = i
            if i % 10 == 9:
                s.commit()
        stats = s.compact()["counts"]
        assert stats["records_after"] < stats["records_before"]
    with TaskStorage(config) as s:
        assert s.store("counts")["k9"] == 2999
