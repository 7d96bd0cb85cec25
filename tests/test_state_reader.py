"""StateReader: the committed state of a task, read beside the running job.

Real engines, real file changelog, a real writer process committing while the
reader reads; a SIGKILL between the changelog flush and the checkpoint write
(fault point) leaves exactly the on-disk state of "a commit in progress".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localstate import (
    Config,
    ConfigError,
    CorruptionError,
    InvalidValueError,
    LocalStateError,
    ReadOnlyStoreError,
    SerializationError,
    StateReader,
    StoreClosedError,
    TaskStorage,
    read_committed,
)

KEYS = 100


def _config(tmp_path: Path, factory: str = "memory", partitions: int = 1, **extra: str) -> Config:
    values = {
        "job.name": "reader",
        "job.partitions": partitions,
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.s.factory": factory,
        "stores.s.changelog": "file.reader-s",
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "json",
        "stores.local.factory": "memory",
        "stores.local.changelog": "none",
    }
    values.update(extra)
    return Config.from_dict(values)


def _tree_digest(*roots: Path) -> dict[str, str]:
    """Path → sha256 of every file (and every directory name) under ``roots``."""
    out: dict[str, str] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                out[os.path.join(dirpath, d)] = "dir"
            for f in filenames:
                p = os.path.join(dirpath, f)
                out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("factory", ["memory", "rocksdb", "leveldb"])
def test_reader_sees_exactly_the_last_commit_beside_an_open_writer(tmp_path: Path, factory: str) -> None:
    config = _config(tmp_path, factory)
    with TaskStorage(config, 0) as storage:
        s = storage.store("s", str, object)
        s.update({"a": 1, "b": {"n": 2}, "c": [3]})
        storage.commit()
        s["a"] = 100  # after the commit: not committed
        del s["c"]
        s["d"] = 4
        storage.store("s").flush()  # even flushed into the engine and the changelog
        with StateReader(config, 0) as reader:  # the writer holds its lock: the reader takes none
            # one key, found by a pass over the committed changelog (no store built)
            assert reader.get("s", "a") == 1 and reader.get("s", "d") is None and reader.get("s", "c") == [3]
            with pytest.raises(SerializationError, match="store 's'"):
                reader.get("s", 5)
            with pytest.raises(InvalidValueError):
                reader.get("s", None)
            view = reader.store("s", str, object)
            assert dict(view) == {"a": 1, "b": {"n": 2}, "c": [3]}
            assert view.get("d", "absent") == "absent"
            assert len(view) == 3
            with view.keys() as keys:
                assert list(keys) == ["a", "b", "c"]
            assert reader.loaded_versions == {"s": 1}
            assert reader.stores == ["s"]
            with pytest.raises(ReadOnlyStoreError, match="'s' is read-only"):
                view["x"] = 1
            with pytest.raises(ReadOnlyStoreError):
                view.update({"x": 1})
            with pytest.raises(ReadOnlyStoreError):
                view.pop("a")
        storage.commit()
    with StateReader(config, 0) as reader:
        assert dict(reader.store("s")) == {"a": 100, "b": {"n": 2}, "d": 4}


def test_reading_changes_nothing_on_disk(tmp_path: Path) -> None:
    config = _config(tmp_path, "rocksdb")
    with TaskStorage(config, 0) as storage:
        storage.store("s").update({f"k{i}": i for i in range(50)})
        storage.commit()
        storage.store("s")["late"] = 1
        storage.store("s").flush()
        storage.changelog("s").flush()  # an uncommitted tail on disk
    before = _tree_digest(tmp_path / "state", tmp_path / "changelog")
    with StateReader(config, 0) as reader:
        assert len(reader.store("s")) == 50
        with pytest.raises(LocalStateError):
            reader.store("nope")
    assert list(read_committed(config, "s"))[:2] == [(0, "k0", 0), (0, "k1", 1)]
    with StateReader(config, 0, in_memory=False) as reader:  # RocksDB in a scratch dir
        on_disk = reader.store("s")
        assert dict(on_disk) == {f"k{i}": i for i in range(50)}
        assert type(reader._engines[0]).__name__ == "RocksDBEngine"
        scratch = reader._scratch
        assert scratch is not None and any(scratch.rglob("*.sst")) | any(scratch.rglob("*.log"))
    assert not scratch.exists()
    assert _tree_digest(tmp_path / "state", tmp_path / "changelog") == before


def test_bad_requests_are_clear_errors(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with StateReader(config, 0) as reader:
        with pytest.raises(LocalStateError, match="no committed state"):
            reader.store("s")
    with TaskStorage(config, 0) as storage:
        storage.store("s")["a"] = 1
        storage.commit()
    with StateReader(config, 0) as reader:
        with pytest.raises(LocalStateError, match="no store named 'ss'.*Did you mean 's'"):
            reader.store("ss")
        with pytest.raises(ConfigError, match="no changelog"):
            reader.store("local")
        with pytest.raises(ConfigError, match="key.serde = 'string' gives str"):
            reader.store("s", int, object)
    reader.close()
    with pytest.raises(StoreClosedError):
        reader.store("s")
    with pytest.raises(LocalStateError, match="out of range"):
        StateReader(config, 3)
    with pytest.raises(Exception, match="partition must be an int"):
        StateReader(config, 0.0)  # type: ignore[arg-type]
    added = config.with_overrides({"stores.new.factory": "memory", "stores.new.changelog": "file.reader-new"})
    with StateReader(added, 0) as reader:
        with pytest.raises(LocalStateError, match="added after the last commit"):
            reader.store("new")


def test_a_commit_cut_short_is_not_seen(tmp_path: Path) -> None:
    """SIGKILL after the changelog flush, before the checkpoint: the on-disk state of a
    commit in progress. The reader sees the commit before it."""
    config = _config(tmp_path)
    with TaskStorage(config, 0) as storage:
        storage.store("s").update({"a": 1})
        storage.commit()
    script = (
        "import json, sys\nfrom localstate import Config, TaskStorage\n"
        "c = Config.from_dict(json.loads(sys.argv[1]))\n"
        "with TaskStorage(c, 0) as st:\n"
        "    st.store('s').update({'a': 2, 'b': 2})\n"
        "    st.commit()\n"
    )
    env = dict(os.environ, LOCALSTATE_FAULTS="commit.after_changelog_flush=kill")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(config.to_dict())], env=env, timeout=60)
    assert proc.returncode == -9
    with StateReader(config, 0) as reader:
        assert dict(reader.store("s")) == {"a": 1}
        assert reader.loaded_versions == {"s": 1}


_WRITER = """
import json, sys, time
from localstate import Config, TaskStorage
config = Config.from_dict(json.loads(sys.argv[1]))
keys = int(sys.argv[2])
with TaskStorage(config, 0) as storage:
    s = storage.store("s")
    i = 0
    while True:
        s.put_all([(f"k{j:03d}", i) for j in range(keys)])
        s["version"] = i
        storage.commit()
        if i % 7 == 0:
            storage.compact()
        if i == 0:
            print("committed", flush=True)
        i += 1
        time.sleep(0.005)  # a job commits every few ms at most; without a pause, on a loaded
        # machine a read could see two commits pass in each of its attempts (then it fails)
"""


@pytest.mark.parametrize("factory", ["memory", "rocksdb"])
def test_reads_beside_a_writer_that_keeps_committing(tmp_path: Path, factory: str) -> None:
    """Every read is one whole commit: all keys hold the same iteration number, which
    is the commit version - 1 the reader reports."""
    config = _config(tmp_path, factory, **{"systems.file.segment.bytes": "4096"})
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, json.dumps(config.to_dict()), str(KEYS)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "committed"
        versions = set()
        deadline = time.monotonic() + 4
        reads = 0
        while time.monotonic() < deadline:
            with StateReader(config, 0) as reader:
                state = dict(reader.store("s"))
                version = reader.loaded_versions["s"]
            reads += 1
            assert len(state) == KEYS + 1
            assert set(state.values()) == {state["version"]}, f"a read mixed commits: {set(state.values())}"
            assert version == state["version"] + 1
            versions.add(version)
        assert writer.poll() is None, "the writer died"
        assert reads >= 5 and len(versions) >= 3, (reads, versions)
    finally:
        writer.kill()
        writer.wait()


def _write_toml(tmp_path: Path, partitions: int = 2) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f"""
[job]
name = "reader"
partitions = {partitions}
"state.dir" = "{tmp_path / 'state'}"

[systems.file]
path = "{tmp_path / 'changelog'}"

[stores.s]
factory = "rocksdb"
changelog = "file.reader-s"
"key.serde" = "string"
"msg.serde" = "json"

[stores.n]
factory = "memory"
changelog = "file.reader-n"
"key.serde" = "long"
"msg.serde" = "bytes"
"""
    )
    return path


def test_cli_get_and_dump(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from localstate.cli import cli

    toml = _write_toml(tmp_path)
    config = Config.load(toml)
    for p in range(2):
        with TaskStorage(config, p) as storage:
            storage.store("s").update({f"p{p}-a": {"n": p}, f"p{p}-b": [p]})
            storage.store("n")[p * 10] = b"\x00raw"
            storage.commit()
            storage.store("s")["uncommitted"] = 1
            storage.store("s").flush()
    run = CliRunner().invoke
    ok = run(cli, ["get", "-c", str(toml), "s", "p1-a"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip() == '{"n": 1}'
    as_json = run(cli, ["get", "-c", str(toml), "--json", "n", "10"])
    assert json.loads(as_json.output) == {"partition": 1, "key": 10, "value": {"base64": "AHJhdw=="}}
    missing = run(cli, ["get", "-c", str(toml), "s", "uncommitted"])
    assert missing.exit_code == 1 and "not in the committed state" in missing.output
    bad_key = run(cli, ["get", "-c", str(toml), "n", "ten"])
    assert bad_key.exit_code == 2 and "key.serde 'long'" in bad_key.output
    unknown = run(cli, ["get", "-c", str(toml), "sx", "a"])
    assert unknown.exit_code == 1 and "Did you mean 's'" in unknown.output

    dumped = run(cli, ["dump", "-c", str(toml), "s"])
    assert dumped.exit_code == 0, dumped.output
    assert dumped.output.splitlines() == [
        '0\tp0-a\t{"n": 0}', "0\tp0-b\t[0]", '1\tp1-a\t{"n": 1}', "1\tp1-b\t[1]",
    ]
    assert run(cli, ["dump", "-c", str(toml), "s", "--on-disk"]).output == dumped.output
    lines = run(cli, ["dump", "-c", str(toml), "s", "--partition", "1", "--json", "--limit", "1"]).output
    assert [json.loads(x) for x in lines.splitlines()] == [{"partition": 1, "key": "p1-a", "value": {"n": 1}}]
    out_of_range = run(cli, ["dump", "-c", str(toml), "s", "--partition", "5"])
    assert out_of_range.exit_code == 2 and "out of range" in out_of_range.output
    assert run(cli, ["dump", "-c", str(toml), "s", "--limit", "-1"]).exit_code == 2


def test_stateapi_bench_suite_quick_rows_are_well_formed() -> None:
    from localstate.benchmarks.runner import normalize_row
    from localstate.benchmarks.state_api import run

    rows = [normalize_row(r, "stateapi") for r in run(quick=True, repeats=1)]
    assert not [r for r in rows if r["error"]], rows
    names = {(r["workload"], r["engine"]) for r in rows}
    assert ("state query (StateReader)", "memory") in names and ("get (cache hits) with metrics", "memory") in names
    assert all(r["median"] > 0 for r in rows)
    assert all(r["ratio"] > 0 for r in rows if r["baseline"])


def test_non_kv_engines_are_rebuilt_in_a_scratch_dir_removed_on_close(tmp_path: Path) -> None:
    config = Config.from_dict({
        "job.name": "sketch",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.top.factory": "topn",
        "stores.top.topn.size": 2,
        "stores.top.key.serde": "string",
        "stores.top.changelog": "file.sketch-top",
    })
    with TaskStorage(config, 0) as storage:
        top = storage.store("top")
        for member, score in (("a", 1.0), ("b", 5.0), ("c", 3.0)):
            top.offer(member, score)
        storage.commit()
        top.offer("d", 9.0)  # not committed
        expected = [e.member for e in top.top()]
        before = _tree_digest(tmp_path / "state", tmp_path / "changelog")
        with StateReader(config, 0) as reader:
            rebuilt = reader.store("top")
            assert [e.member for e in rebuilt.top()] == ["b", "c"]
            with pytest.raises(TypeError, match="not a key-value store"):
                reader.store("top", str, float)
            scratch = reader._scratch
            assert scratch is not None and scratch.exists()
        assert not scratch.exists()
        with pytest.raises(ConfigError, match="not a key-value engine"):
            list(read_committed(config, "top"))
        with StateReader(config, 0) as reader, pytest.raises(ConfigError, match="not a key-value engine"):
            reader.get("top", "a")
        assert _tree_digest(tmp_path / "state", tmp_path / "changelog") == before
        assert expected == ["d", "b"]


def test_typed_accessor_rejects_non_types(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with TaskStorage(config, 0) as storage:
        with pytest.raises(TypeError, match="must be a class"):
            storage.store("s", "str", int)  # type: ignore[call-overload]
        with pytest.raises(ConfigError, match="asked for keys of type bytes"):
            storage.store("s", bytes, object)
        assert storage.store("s", object, dict) is storage.store("s")  # json holds many types


@pytest.mark.kafka
def test_reader_over_a_kafka_changelog(tmp_path: Path, kafka_broker: str) -> None:
    import uuid

    job = f"rk-{uuid.uuid4().hex[:8]}"
    config = Config.from_dict({
        "job.name": job,
        "job.state.dir": str(tmp_path / "state"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": f"kafka.{job}-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "systems.kafka.bootstrap.servers": kafka_broker,
    })
    assert config.checkpoint_system == "kafka"
    with TaskStorage(config, 0) as storage:
        kv = storage.store("kv")
        kv.update({"a": 1, "b": 2})
        storage.commit()
        kv.update({"a": 10, "c": 3})
        del kv["b"]
        storage.commit()
        kv["z"] = 26  # logged below, never committed
        kv.flush()
        storage.changelog("kv").flush()
        with StateReader(config, 0) as reader:
            assert dict(reader.store("kv")) == {"a": 10, "c": 3}
            assert reader.loaded_versions == {"kv": 2}


def test_damaged_committed_changelog_is_an_error_not_a_smaller_state(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with TaskStorage(config, 0) as storage:
        storage.store("s").update({f"k{i}": i for i in range(20)})
        storage.commit()
    [segment] = list((tmp_path / "changelog" / "reader-s" / "0").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a committed record's byte
    segment.write_bytes(bytes(data))
    before = _tree_digest(tmp_path / "state", tmp_path / "changelog")
    with StateReader(config, 0) as reader, pytest.raises(CorruptionError, match="reader-s"):
        reader.store("s")
    with StateReader(config, 0) as reader, pytest.raises(CorruptionError):
        reader.get("s", "k1")
    assert _tree_digest(tmp_path / "state", tmp_path / "changelog") == before


def test_ttl_stores_read_as_committed_with_expired_entries_hidden(tmp_path: Path) -> None:
    """Values of a TTL store carry their expiry; the reader decodes them and hides what
    expired as of the commit's event time (or the wall clock for processing time)."""
    from click.testing import CliRunner
    from localstate.cli import cli

    config = _config(tmp_path, "rocksdb", **{"stores.s.ttl.ms": "1000", "stores.s.ttl.time": "event"})
    with TaskStorage(config, 0) as storage:
        s = storage.store("s")
        storage.advance_event_time(0)
        s["old"] = {"n": 1}
        storage.advance_event_time(600)
        s["new"] = {"n": 2}
        storage.advance_event_time(1000)  # "old" expires, not swept yet
        storage.commit()
    with StateReader(config, 0) as reader:
        assert reader.get("s", "old") is None and reader.get("s", "new") == {"n": 2}
        assert dict(reader.store("s")) == {"new": {"n": 2}}
    from localstate.reader import sample_committed

    assert sample_committed(config, "s") == [("new", {"n": 2})]
    overrides = [arg for k, v in config.to_dict().items() for arg in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(cli, ["dump", *overrides, "s"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.splitlines() == ['0\tnew\t{"n": 2}']
    processing = _config(tmp_path / "p", "memory", **{"stores.s.ttl.ms": "1h"})
    with TaskStorage(processing, 0) as storage:
        storage.store("s")["k"] = [1]
        storage.commit()
    with StateReader(processing, 0) as reader:
        assert dict(reader.store("s")) == {"k": [1]} and reader.get("s", "k") == [1]


def _cli_get_and_dump(config: Config, store: str, key: str) -> tuple[str | None, list[str]]:
    """``localstate get`` (None when absent: exit 1) and ``localstate dump`` of ``store``."""
    from click.testing import CliRunner
    from localstate.cli import cli

    overrides = [arg for k, v in config.to_dict().items() for arg in ("--set", f"{k}={v}")]
    got = CliRunner().invoke(cli, ["get", *overrides, store, key])
    assert got.exit_code in (0, 1), got.output
    dumped = CliRunner().invoke(cli, ["dump", *overrides, store])
    assert dumped.exit_code == 0, dumped.output
    return (got.stdout.strip() if got.exit_code == 0 else None), dumped.stdout.splitlines()


def test_processing_time_ttl_readers_hide_what_the_running_task_hides(tmp_path: Path) -> None:
    """Processing-time TTL: an entry committed before it expired is hidden, once the wall
    clock passes its expiry, by the task's get and alike by StateReader.get/store and
    ``localstate get``/``dump`` (one clock, in the unit the expiry is stored in)."""
    ttl_s = 2.0
    config = _config(tmp_path, "rocksdb", **{"stores.s.ttl.ms": str(int(ttl_s * 1000)),
                                             "stores.s.ttl.cleanup.batch": "0"})  # the commit sweeps nothing
    with TaskStorage(config, 0) as storage:
        s = storage.store("s")
        s["gone"] = {"n": 1}
        storage.commit()
        time.sleep(ttl_s + 0.1)
        s["fresh"] = {"n": 2}
        written = time.monotonic()
        storage.commit()  # "gone" is still in the committed changelog (not swept), expired
        assert s.get("gone") is None and s.get("fresh") == {"n": 2}
        with StateReader(config, 0) as reader:
            assert reader.get("s", "gone") is None
            assert dict(reader.store("s")) == {"fresh": {"n": 2}}
        assert _cli_get_and_dump(config, "s", "gone") == (None, ['0\tfresh\t{"n": 2}'])
        assert time.monotonic() - written < ttl_s, "too slow to see 'fresh' before it expires: no verdict"


def test_event_time_ttl_readers_hide_what_the_task_hides_before_any_sweep(tmp_path: Path) -> None:
    """Event-time TTL: the reader's "now" is the committed event time, compared with the
    stored expiry in the same unit; an unswept expired entry is hidden everywhere."""
    config = _config(tmp_path, "rocksdb", **{"stores.s.ttl.ms": "1000", "stores.s.ttl.time": "event",
                                             "stores.s.ttl.cleanup.batch": "0"})
    with TaskStorage(config, 0) as storage:
        s = storage.store("s")
        storage.advance_event_time(0)
        s["old"] = {"n": 1}
        storage.advance_event_time(600)
        s["new"] = {"n": 2}
        storage.advance_event_time(1000)  # "old" expires at 0 + 1000; nothing reads it: not swept
        storage.commit()
        assert s.get("old") is None and s.get("new") == {"n": 2}
    with StateReader(config, 0) as reader:
        assert reader.get("s", "old") is None and reader.get("s", "new") == {"n": 2}
        assert dict(reader.store("s")) == {"new": {"n": 2}}
    assert _cli_get_and_dump(config, "s", "old") == (None, ['0\tnew\t{"n": 2}'])


def test_checkpoint_is_a_property_as_on_task_storage_and_the_call_form_warns(tmp_path: Path) -> None:
    import pickle

    from localstate.checkpoint import Checkpoint

    config = _config(tmp_path)
    with StateReader(config, 0) as reader, pytest.raises(LocalStateError, match="has no committed state"):
        _ = reader.checkpoint
    with TaskStorage(config, 0) as storage:
        storage.store("s")["k"] = 1
        storage.commit(input_position=7)
        with StateReader(config, 0) as reader:
            ckpt = reader.checkpoint
            assert isinstance(ckpt, Checkpoint) and isinstance(storage.checkpoint, Checkpoint)
            assert ckpt == storage.checkpoint and storage.checkpoint == ckpt
            assert (ckpt.version, ckpt.input_position, ckpt.offsets) == (1, 7, storage.checkpoint.offsets)
            assert repr(ckpt).startswith("Checkpoint(version=1, ")
            assert pickle.loads(pickle.dumps(ckpt)) == ckpt
            with pytest.warns(DeprecationWarning, match="StateReader.checkpoint is a property"):
                assert reader.checkpoint() == ckpt
            storage.store("s")["k"] = 2
            storage.commit(input_position=8)
            assert reader.checkpoint.version == 2  # read again at each access
