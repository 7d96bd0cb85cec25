"""Issue 14 ("Trust"), the commit/restore protocol: every situation ends in exactly the
last commit, or in a clear error that changes nothing on disk and names an explicit
recovery (``localstate.storage.Recovery``, ``localstate restore --...``).

Each test here failed on the code before the fix (the case numbers are the issue's).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.errors import ConfigError, CorruptionError, InvalidValueError, LocalStateError
from localstate.storage import Recovery

ENGINES = ["memory", "leveldb", "rocksdb"]


def values(tmp: Path, engine: str = "memory", *, stores: tuple[str, ...] = ("counts",), **extra: Any) -> dict[str, Any]:
    v: dict[str, Any] = {
        "job.name": "trust",
        "job.state.dir": str(tmp / "state"),
        "systems.file.path": str(tmp / "changelog"),
        "systems.file.segment.bytes": 4096,
    }
    for s in stores:
        v.update({f"stores.{s}.factory": engine, f"stores.{s}.key.serde": "string",
                  f"stores.{s}.msg.serde": "json", f"stores.{s}.object.cache.size": 50,
                  f"stores.{s}.write.batch.size": 20})
    v.update(extra)
    return v


def log_bytes(tmp: Path) -> dict[Path, bytes]:
    """Every changelog segment's bytes (to prove an error changed nothing)."""
    return {p: p.read_bytes() for p in sorted((tmp / "changelog").rglob("*.log"))}


def ckpt_files(tmp: Path) -> tuple[Path, Path]:
    d = tmp / "changelog" / "_checkpoints" / "trust"
    return d / "partition-0.ckpt", d / "partition-0.ckpt.prev"


def run_counters(config: Config, commits: range, keys: int = 60) -> list[dict[str, int]]:
    """Read-modify-write counters: commit ``c`` adds ``c`` to every key; returns the state
    after each commit (index = input position)."""
    states = []
    with TaskStorage(config) as s:
        counts = s.store("counts")
        pos = s.checkpoint.input_position if s.checkpoint else 0
        assert pos == commits.start - 1
        for c in commits:
            for k in range(keys):
                counts[f"k{k:03d}"] = (counts.get(f"k{k:03d}") or 0) + c
            s.commit(input_position=c)
            states.append(dict(read_all(s)))
    return states


def read_all(s: TaskStorage, store: str = "counts") -> dict[str, Any]:
    with s.store(store).all() as it:
        return dict(it)


def expected_counters(pos: int, keys: int = 60) -> dict[str, int]:
    return {f"k{k:03d}": sum(range(1, pos + 1)) for k in range(keys)} if pos else {}


# -- case 1: going back to the previous checkpoint after compaction ----------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_previous_checkpoint_after_compaction_is_exactly_the_previous_commit(tmp_path, engine):
    config = Config.from_dict(values(tmp_path, engine))
    run_counters(config, range(1, 7))
    with TaskStorage(config) as s:
        s.compact()
    current, prev = ckpt_files(tmp_path)
    current.unlink()
    before = log_bytes(tmp_path)
    with pytest.raises(CorruptionError, match="--use-previous-checkpoint") as e:
        TaskStorage(config)
    assert str(current) in str(e.value)
    assert log_bytes(tmp_path) == before
    # the local copies of rocksdb/leveldb are at commit 6: lose them too, so the
    # previous commit is rebuilt from the compacted changelog alone
    import shutil

    shutil.rmtree(tmp_path / "state" / "trust" / "counts")
    with TaskStorage(config, recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert s.checkpoint.input_position == 5
        assert read_all(s) == expected_counters(5)
    # replaying input 6 from there gives what a run without damage gives
    run_counters(config, range(6, 7))
    with TaskStorage(config) as s:
        assert read_all(s) == expected_counters(6) and read_all(s)["k000"] == 21


def test_compaction_keeps_the_previous_checkpoint_reconstructible(tmp_path):
    """Rewriting keys in the last commit must not drop their older records below the
    previous checkpoint's offset (a later rollback would invent a state)."""
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 7))
    with TaskStorage(config) as s:
        prev_offset = s._checkpoints.previous("trust", 0).offsets["counts"]
        log = s.changelog("counts")
        s.compact()
        replayed: dict[bytes, bytes | None] = {}
        for k, v in log.read(0, prev_offset):
            replayed[k] = v
    assert {k.decode(): int(v) for k, v in replayed.items()} == expected_counters(5)


# -- case 2: a missing checkpoint never deletes the changelog ---------------------------------------
@pytest.mark.parametrize("damage", ["both files", "the directory"])
def test_missing_checkpoint_is_an_error_and_the_changelog_survives(tmp_path, damage):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 4))
    current, prev = ckpt_files(tmp_path)
    if damage == "both files":
        current.unlink()
        prev.unlink()
    else:
        import shutil

        shutil.rmtree(current.parent.parent)
    before = log_bytes(tmp_path)
    assert sum(map(len, before.values())) > 1000
    for _ in range(2):  # refusing twice changes nothing either
        with pytest.raises(CorruptionError, match=r"no checkpoint names the store") as e:
            TaskStorage(config)
        assert log_bytes(tmp_path) == before
    msg = str(e.value)
    assert "--accept-log-end counts" in msg and "--reset counts" in msg and "changelog" in msg
    # explicit recovery 1: the log's records are the committed state
    with TaskStorage(config, recovery=Recovery(accept_log_end={"counts"})) as s:
        assert read_all(s) == expected_counters(3)
        assert s.checkpoint is None  # no commit (input position) survived: the operator resumes the input
    with TaskStorage(config) as s:  # and it is committed from then on
        assert read_all(s) == expected_counters(3)


def test_reset_is_explicit_and_starts_the_store_empty(tmp_path):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 4))
    with TaskStorage(config, recovery=Recovery(reset={"counts"})) as s:
        assert read_all(s) == {}
        s.store("counts")["fresh"] = 1
        s.commit(input_position=0)
    with TaskStorage(config) as s:
        assert read_all(s) == {"fresh": 1}
    import shutil

    shutil.rmtree(tmp_path / "state")
    with TaskStorage(config) as s:  # a full rebuild from the changelog agrees
        assert read_all(s) == {"fresh": 1}


def test_crash_before_the_first_commit_is_not_damage(tmp_path):
    """The genesis checkpoint, written before any change record, tells an uncommitted
    first attempt (its records are discarded) from a lost checkpoint (refused)."""
    config = Config.from_dict(values(tmp_path))
    s = TaskStorage(config)
    s.store("counts").put_all({f"k{i}": i for i in range(100)})
    s.store("counts").flush()
    assert s.changelog("counts").end_offset() == 100
    s.close()  # no commit
    with TaskStorage(config) as s:
        assert s.checkpoint is None and read_all(s) == {}
        assert s.changelog("counts").end_offset() == 0


# -- case 3: a store dropped from the config for one deploy, then added back ---------------------------
@pytest.mark.parametrize("engine", ["memory", "rocksdb"])
def test_store_dropped_for_one_deploy_keeps_its_state(tmp_path, engine):
    both = Config.from_dict(values(tmp_path, engine, stores=("counts", "other")))
    with TaskStorage(both) as s:
        s.store("other").put_all({f"o{i}": i for i in range(100)})
        s.commit(input_position=1)
    only = Config.from_dict(values(tmp_path, engine, stores=("counts",)))
    for pos in (2, 3):
        with TaskStorage(only) as s:
            s.store("counts")["c"] = pos
            s.commit(input_position=pos)
    import shutil

    shutil.rmtree(tmp_path / "state" / "trust" / "other")  # even without its local copy
    with TaskStorage(both) as s:
        assert s.checkpoint.input_position == 3
        assert read_all(s, "other") == {f"o{i}": i for i in range(100)}
        assert read_all(s) == {"c": 3}


def test_a_new_store_is_registered_before_it_writes(tmp_path):
    one = Config.from_dict(values(tmp_path, stores=("counts",)))
    run_counters(one, range(1, 3))
    two = Config.from_dict(values(tmp_path, stores=("counts", "added")))
    s = TaskStorage(two)
    s.store("added")["x"] = 1
    s.store("added").flush()
    s.close()  # the new store's first writes were never committed
    with TaskStorage(two) as s:
        assert read_all(s, "added") == {} and read_all(s) == expected_counters(2)
        s.store("added")["y"] = 2
        s.commit(input_position=3)
    with TaskStorage(two) as s:
        assert read_all(s, "added") == {"y": 2}


# -- config changes between deploys -------------------------------------------------------------------
def test_serde_change_between_deploys_is_detected(tmp_path):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 3))
    changed = Config.from_dict(values(tmp_path, **{"stores.counts.msg.serde": "msgpack"}))
    before = log_bytes(tmp_path)
    with pytest.raises(ConfigError, match=r"msg.serde = 'json'.*'msgpack'.*--accept-config-change counts"):
        TaskStorage(changed)
    assert log_bytes(tmp_path) == before
    with TaskStorage(config) as s:  # setting it back works
        assert read_all(s) == expected_counters(2)


def test_engine_change_between_deploys_needs_an_explicit_yes_and_then_rebuilds(tmp_path):
    config = Config.from_dict(values(tmp_path, "rocksdb"))
    run_counters(config, range(1, 3))
    moved = Config.from_dict(values(tmp_path, "leveldb"))
    with pytest.raises(ConfigError, match=r"factory = 'rocksdb'"):
        TaskStorage(moved)
    with TaskStorage(moved, recovery=Recovery(accept_config_change={"counts"})) as s:
        assert read_all(s) == expected_counters(2)
    with TaskStorage(moved) as s:  # accepted once, remembered
        assert read_all(s) == expected_counters(2)


# -- case 10: commit arguments are validated before step 1 -------------------------------------------
@pytest.mark.parametrize(
    ("position", "match"),
    [
        ({0: 1500}, "checkpoint keys are strings"),
        ((1, 2), "use a list"),
        ({"p": (1, 2)}, "use a list"),
        (math.nan, "NaN"),
        ({"x": math.inf}, "NaN and infinities"),
        (object(), "cannot be stored exactly"),
        ({"b": b"bytes"}, "cannot be stored exactly"),
    ],
)
def test_input_position_that_would_not_round_trip_is_refused_before_anything_is_written(tmp_path, position, match):
    config = Config.from_dict(values(tmp_path))
    with TaskStorage(config) as s:
        s.store("counts")["a"] = 1
        s.commit(input_position={"0": 1})
        s.store("counts")["a"] = 2
        end = s.changelog("counts").end_offset()
        ckpt = ckpt_files(tmp_path)[0].read_bytes()
        with pytest.raises(InvalidValueError, match=match):
            s.commit(input_position=position)
        assert s.changelog("counts").end_offset() == end
        assert ckpt_files(tmp_path)[0].read_bytes() == ckpt
        s.commit(input_position={"0": 2})  # the task goes on
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == {"0": 2} and read_all(s) == {"a": 2}


@pytest.mark.parametrize(("version", "match"), [(1.5, "must be an int"), (True, "must be an int"),
                                                ("3", "must be an int"), (-1, ">= 0"), (4, "does not follow"),
                                                (5, "does not follow")])
def test_commit_versions_are_ints_that_go_up(tmp_path, version, match):
    config = Config.from_dict(values(tmp_path))
    with TaskStorage(config) as s:
        s.commit(version=5)
        with pytest.raises(InvalidValueError, match=match):
            s.commit(version=version)
        assert s.commit(version=6).version == 6
        assert s.commit().version == 7


def test_numpy_integers_are_fine_for_versions_and_partitions(tmp_path):
    np = pytest.importorskip("numpy")
    config = Config.from_dict(values(tmp_path, **{"job.partitions": 2}))
    with TaskStorage(config, np.int64(1)) as s:
        assert s.partition == 1 and type(s.partition) is int
        assert s.commit(version=np.int32(3)).version == 3


# -- case 11: partitions are ints ------------------------------------------------------------------------
@pytest.mark.parametrize("partition", [0.0, False, "0", None, 1.0])
def test_partition_that_is_not_an_int_is_refused(tmp_path, partition):
    config = Config.from_dict(values(tmp_path, **{"job.partitions": 2}))
    with pytest.raises(InvalidValueError, match="partition must be an int"):
        TaskStorage(config, partition)
    assert not (tmp_path / "state" / "trust" / "counts").exists()


# -- close never masks the user's own exception ------------------------------------------------------------
def test_close_failure_inside_with_does_not_replace_the_users_exception(tmp_path, monkeypatch):
    config = Config.from_dict(values(tmp_path))

    class UserError(Exception):
        pass

    with pytest.raises(UserError) as info:
        with TaskStorage(config) as s:
            # A test double for a fault we cannot otherwise cause here: the engine's close fails.
            engine = s.engine("counts")

            def broken_close() -> None:
                raise OSError("disk gone")

            monkeypatch.setattr(engine, "close", broken_close)
            raise UserError("mine")
    assert "disk gone" in " ".join(getattr(info.value, "__notes__", []))


def test_recovery_naming_an_unknown_store_is_refused(tmp_path):
    config = Config.from_dict(values(tmp_path))
    with pytest.raises(ConfigError, match="unknown store"):
        TaskStorage(config, recovery=Recovery(reset={"nope"}))


# -- Kafka: a lost checkpoint topic, a lost changelog topic ---------------------------------------------------
def kafka_values(tmp: Path, bootstrap: str, checkpoint_topic: str, stream: str) -> dict[str, Any]:
    return {
        "job.name": "trust",
        "job.state.dir": str(tmp / "state"),
        "systems.kafka.bootstrap.servers": bootstrap,
        "systems.kafka.timeout.ms": 3000,
        "systems.kafka.checkpoint.topic": checkpoint_topic,
        "stores.counts.factory": "memory",
        "stores.counts.key.serde": "string",
        "stores.counts.msg.serde": "json",
        "stores.counts.changelog": f"kafka.{stream}",
    }


@pytest.mark.kafka
def test_kafka_checkpoint_topic_gone_is_an_error_not_an_empty_store(tmp_path, kafka_broker):
    stream = f"trust-{uuid.uuid4().hex[:8]}"
    config = Config.from_dict(kafka_values(tmp_path, kafka_broker, f"ck-{uuid.uuid4().hex[:8]}", stream))
    with TaskStorage(config) as s:
        s.store("counts").put_all({f"k{i}": i for i in range(50)})
        s.commit(input_position=1)
    lost = Config.from_dict(kafka_values(tmp_path, kafka_broker, f"ck-{uuid.uuid4().hex[:8]}", stream))
    with pytest.raises(CorruptionError, match="no checkpoint names the store"):
        TaskStorage(lost)
    with TaskStorage(lost, recovery=Recovery(accept_log_end={"counts"})) as s:
        assert read_all(s) == {f"k{i}": i for i in range(50)}


@pytest.mark.kafka
def test_kafka_changelog_topic_emptied_while_the_checkpoint_names_offsets_is_an_error(tmp_path, kafka_broker):
    from confluent_kafka.admin import AdminClient

    ck, stream = f"ck-{uuid.uuid4().hex[:8]}", f"trust-{uuid.uuid4().hex[:8]}"
    config = Config.from_dict(kafka_values(tmp_path, kafka_broker, ck, stream))
    with TaskStorage(config) as s:
        s.store("counts").put_all({f"k{i}": i for i in range(50)})
        s.commit(input_position=1)
    # The changelog topic is deleted (as by an operator, or a broker that lost its data);
    # opening recreates it empty while the checkpoint names offset 50.
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    admin.delete_topics([stream], operation_timeout=10)[stream].result(10)
    with pytest.raises(CorruptionError, match=r"committed records are missing \(topic deleted or recreated"):
        TaskStorage(config)
    with pytest.raises(CorruptionError, match="committed records are missing"):
        TaskStorage(config)  # still refused: nothing was changed
    with TaskStorage(config, recovery=Recovery(reset={"counts"})) as s:
        assert read_all(s) == {}


# -- case 5: localstate verify; the recovery commands ----------------------------------------------------
def write_props(tmp: Path, engine: str = "rocksdb") -> Path:
    p = tmp / "job.properties"
    p.write_text("".join(f"{k} = {v}\n" for k, v in values(tmp, engine).items()))
    return p


def cli(*args: str) -> Any:
    from click.testing import CliRunner
    from localstate.cli import cli as command

    return CliRunner().invoke(command, list(args))


def test_verify_finds_latent_damage_in_a_closed_segment_that_a_local_copy_hides(tmp_path):
    props = write_props(tmp_path, "rocksdb")
    config = Config.from_properties(props)
    run_counters(config, range(1, 7))
    ok = cli("verify", "-c", str(props))
    assert ok.exit_code == 0, ok.output
    assert "1 store partition(s) checked, 0 with problems" in ok.output
    segments = sorted((tmp_path / "changelog").rglob("*.log"))
    assert len(segments) >= 2
    data = bytearray(segments[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    segments[0].write_bytes(bytes(data))
    with TaskStorage(config) as s:  # the rocksdb copy is valid: opening does not read the log
        assert read_all(s) == expected_counters(6)
    bad = cli("verify", "-c", str(props))
    assert bad.exit_code == 1 and "PROBLEM" in bad.output and str(segments[0]) in bad.output
    quick = cli("verify", "-c", str(props), "--quick")  # ends only: does not read every batch
    assert quick.exit_code == 0, quick.output
    js = cli("verify", "-c", str(props), "--json")
    assert json.loads(js.output)[0]["ok"] is False


def test_verify_reports_a_changelog_no_checkpoint_explains_and_restore_fixes_it_explicitly(tmp_path):
    props = write_props(tmp_path, "memory")
    config = Config.from_properties(props)
    run_counters(config, range(1, 3))
    for f in ckpt_files(tmp_path):
        f.unlink()
    bad = cli("verify", "-c", str(props))
    assert bad.exit_code == 1 and "no checkpoint names the store" in bad.output
    refused = cli("restore", "-c", str(props))
    assert refused.exit_code != 0 and "--accept-log-end counts" in refused.output
    fixed = cli("restore", "-c", str(props), "--accept-log-end", "counts")
    assert fixed.exit_code == 0, fixed.output
    assert cli("verify", "-c", str(props)).exit_code == 0
    with TaskStorage(config) as s:
        assert read_all(s) == expected_counters(2)
    reset = cli("restore", "-c", str(props), "--reset", "counts")
    assert reset.exit_code == 0, reset.output
    with TaskStorage(config) as s:
        assert read_all(s) == {}


def test_restore_use_previous_checkpoint_from_the_command_line(tmp_path):
    props = write_props(tmp_path, "memory")
    config = Config.from_properties(props)
    run_counters(config, range(1, 4))
    ckpt_files(tmp_path)[0].unlink()
    assert cli("restore", "-c", str(props)).exit_code != 0
    r = cli("restore", "-c", str(props), "--use-previous-checkpoint")
    assert r.exit_code == 0, r.output
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == 2 and read_all(s) == expected_counters(2)


def test_unreadable_checkpoints_with_a_decision_for_every_store(tmp_path):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 3))
    for f in ckpt_files(tmp_path):
        f.write_bytes(b"garbage")
    with pytest.raises(CorruptionError, match="--accept-log-end"):
        TaskStorage(config)
    with TaskStorage(config, recovery=Recovery(accept_log_end={"counts"})) as s:
        assert read_all(s) == expected_counters(2)
    with TaskStorage(config) as s:
        assert read_all(s) == expected_counters(2)


def test_changelog_stream_changed_between_deploys_is_detected(tmp_path):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 3))
    moved = Config.from_dict(values(tmp_path, **{"stores.counts.changelog": "file.elsewhere"}))
    with pytest.raises(ConfigError, match=r"changelog = 'file\.trust-counts'.*'file\.elsewhere'"):
        TaskStorage(moved)


def test_lost_previous_checkpoint_or_leftover_temp_file_do_not_disturb_an_open(tmp_path):
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 3))
    current, prev = ckpt_files(tmp_path)
    prev.write_bytes(b"garbage")
    current.with_name(current.name + ".tmp").write_bytes(b"half a checkpoint")
    with TaskStorage(config) as s:
        assert read_all(s) == expected_counters(2)
    props = write_props(tmp_path, "memory")
    report = cli("verify", "-c", str(props))
    assert report.exit_code == 1 and "previous checkpoint" in report.output
    run_counters(config, range(3, 4))  # the next commit replaces the bad .prev
    assert cli("verify", "-c", str(props)).exit_code == 0


@pytest.mark.parametrize("engine", ["rocksdb", "leveldb"])
def test_lost_compaction_state_makes_stale_local_copies_untrusted(tmp_path, engine):
    """Without compaction.json the tombstone horizon is unknown: a local copy from before
    a compacted-away delete must not be used (it would resurrect the key)."""
    config = Config.from_dict(values(tmp_path, engine, **{"systems.file.delete.retention.ms": 0}))
    with TaskStorage(config) as s:
        s.store("counts").put_all({f"k{i:03d}": i for i in range(300)})
        s.commit(input_position=1)
    import shutil

    old_copy = tmp_path / "old-copy"
    shutil.copytree(tmp_path / "state" / "trust" / "counts", old_copy)
    with TaskStorage(config) as s:
        s.store("counts").delete_all([f"k{i:03d}" for i in range(0, 300, 2)])
        s.store("counts").put_all({f"n{i:03d}": i for i in range(300)})
        s.commit(input_position=2)
        s.commit(input_position=3)
        stats = s.compact()["counts"]
        assert stats["tombstones_dropped"] > 0
    meta = next((tmp_path / "changelog").rglob("compaction.json"))
    meta.unlink()
    shutil.rmtree(tmp_path / "state" / "trust" / "counts")
    shutil.copytree(old_copy, tmp_path / "state" / "trust" / "counts")
    with TaskStorage(config) as s:
        assert s.last_restore["counts"].start_offset == 0
        got = read_all(s)
    assert got == {f"k{i:03d}": i for i in range(1, 300, 2)} | {f"n{i:03d}": i for i in range(300)}


def test_partition_count_changed_between_deploys_is_refused(tmp_path):
    config = Config.from_dict(values(tmp_path, **{"job.partitions": 2}))
    with TaskStorage(config, 1) as s:
        s.store("counts")["a"] = 1
        s.commit(input_position=1)
    before = log_bytes(tmp_path)
    more = Config.from_dict(values(tmp_path, **{"job.partitions": 3}))
    with pytest.raises(LocalStateError, match="has 2 partitions but the job has job.partitions = 3"):
        TaskStorage(more, 1)
    assert log_bytes(tmp_path) == before


def test_rocksdb_live_database_left_half_deleted_by_a_crash_is_rebuilt(tmp_path):
    """Found by the crash trials: a kill while prepare_restore deleted the live ``db/``
    left CURRENT naming a MANIFEST already gone, and every later open failed."""
    config = Config.from_dict(values(tmp_path, "rocksdb"))
    run_counters(config, range(1, 4))
    live = tmp_path / "state" / "trust" / "counts" / "0" / "db"
    for manifest in live.glob("MANIFEST-*"):
        manifest.unlink()
    with TaskStorage(config) as s:
        assert read_all(s) == expected_counters(3)


@pytest.mark.kafka
def test_verify_on_kafka_reads_back_records_and_creates_nothing(tmp_path, kafka_broker):
    from confluent_kafka.admin import AdminClient
    from localstate.verify import verify_job

    ck, stream = f"ck-{uuid.uuid4().hex[:8]}", f"trust-{uuid.uuid4().hex[:8]}"
    config = Config.from_dict(kafka_values(tmp_path, kafka_broker, ck, stream))
    with TaskStorage(config) as s:
        s.store("counts").put_all({f"k{i}": i for i in range(50)})
        s.commit(input_position=1)
    (check,) = verify_job(config)
    assert check.ok and check.committed == 50 and check.end_offset >= 50 and check.bytes > 0
    other = Config.from_dict(kafka_values(tmp_path, kafka_broker, f"ck-{uuid.uuid4().hex[:8]}", stream))
    (check,) = verify_job(other)
    assert not check.ok and "holds records up to offset" in check.problems[0]  # as on every changelog system
    topics = AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=10).topics
    assert other.systems["kafka"]["checkpoint.topic"] not in topics


def test_checkpoint_system_changed_between_deploys_is_not_a_new_empty_task(tmp_path):
    """The case no checkpoint can explain by itself: checkpoints and changelog both moved
    to a new, empty place. The task's state dir remembers where they were."""
    config = Config.from_dict(values(tmp_path))
    run_counters(config, range(1, 3))
    moved = Config.from_dict(values(tmp_path, **{"systems.file.path": str(tmp_path / "elsewhere")}))
    with pytest.raises(CorruptionError, match=r"last kept the task's checkpoints in file changelog at .*changelog"):
        TaskStorage(moved)
    assert not (tmp_path / "elsewhere" / "_checkpoints").exists()  # nothing written there
    with TaskStorage(config) as s:  # set back: all there
        assert read_all(s) == expected_counters(2)
    with TaskStorage(moved, recovery=Recovery(reset={"counts"})) as s:  # or start over, explicitly
        assert read_all(s) == {}
        s.commit(input_position=0)
    with TaskStorage(moved) as s:
        assert s.checkpoint.input_position == 0
