"""The objectstore changelog against a real S3 API (moto_server on 127.0.0.1) and ``file://``.

* the shipped changelog conformance suite over ``s3`` and ``file``: the partition
  contract, exact restore to the last commit with the uncommitted tail never visible
  (every KV engine), a zombie task instance fenced;
* object-store specifics: zombie uploads never enter the chain, epochs follow the
  checkpoint claims; roll-up and compaction keep fallback checkpoints;
* a missing / corrupt / half-uploaded object is an error naming bucket and key, and
  nothing is changed; SIGKILL between the changelog flush and the checkpoint;
* the endpoint stopped mid-commit, 500 / 503 SlowDown answers and slowness (through
  :class:`~localstate.testing.s3.FaultProxy`, a test double: moto cannot be made to
  answer those on demand).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.changelog.objectstore import ObjectName, ObjectStoreChangelogSystem
from localstate.checkpoint import Checkpoint
from localstate.errors import ChangelogError, ConfigError, CorruptionError, FencedError
from localstate.registry import ENGINES
from localstate.testing import torture as T
from localstate.testing.changelog_conformance import (
    ChangelogSystemConformance,
    ObjectStoreConformanceHooks,
    dump,
    records,
    task_values,
    unique,
)
from localstate.testing.changelog_conformance import on_another_machine as moved
from localstate.testing.s3 import QUICK_RETRIES, FaultProxy, objectstore_options

pytestmark = pytest.mark.s3

FAST = QUICK_RETRIES


def system_options(opts: dict[str, Any], name: str = "s3") -> dict[str, Any]:
    pre = f"systems.{name}."
    return {k[len(pre):]: v for k, v in opts.items() if k.startswith(pre) and k != f"{pre}type"}


@pytest.fixture
def where(objectstore_where: dict[str, Any]) -> dict[str, Any]:
    """``systems.s3.*`` keys of a fresh objectstore location: a moto bucket, then a file:// dir."""
    return objectstore_where


def make_system(opts: dict[str, Any], job: str = "job") -> ObjectStoreChangelogSystem:
    return ObjectStoreChangelogSystem("s3", system_options(opts), job)


def store_values(tmp_path: Path, opts: dict[str, Any], factory: str = "memory", **extra: Any) -> dict[str, Any]:
    return task_values(job_values(opts), tmp_path, factory, **extra)


def job_values(opts: dict[str, Any]) -> dict[str, Any]:
    return {"job.changelog.system": "s3", "job.checkpoint.system": "s3", **opts}


class TestObjectStoreChangelogConformance(ObjectStoreConformanceHooks, ChangelogSystemConformance):
    fenced_match = r"_checkpoints/.*was already written by a newer instance"

    @pytest.fixture
    def make_system(self, where) -> Callable[[], ObjectStoreChangelogSystem]:
        job = unique("job")
        return lambda: make_system(where, job)

    @pytest.fixture
    def job_values(self, where) -> dict[str, Any]:
        return job_values(where)


# -- partition conformance -----------------------------------------------------------------
def test_append_flush_read_reopen(where):
    p = make_system(where).open_partition("st", 0, 1)
    p.append(records(0, 5))
    p.append(records(5, 8))
    assert p.flush() == 8
    p.append(records(8, 10))
    assert p.end_offset() == 10
    assert list(p.read(3, 9)) == records(3, 9)  # reads the unflushed buffer too
    p.close()
    q = make_system(where).open_partition("st", 0, 1)  # a new instance: only what was uploaded
    assert q.end_offset() == 8
    assert list(q.read(0, 8)) == records(0, 8)
    assert list(q.read(6, 100)) == records(6, 8)
    q.close()


def test_discard_tail_and_a_zombie_upload_never_enter_the_chain(where):
    a = make_system(where).open_partition("st", 0, 1)
    a.append(records(0, 4))
    a.flush()
    a.append(records(4, 9, b"tail"))
    a.flush()  # uncommitted: the checkpoint will say 4
    b = make_system(where).open_partition("st", 0, 1)  # the newer instance
    assert b.epoch > a.epoch and b.end_offset() == 9
    b.discard_tail(4, lambda keys: [])
    assert b.end_offset() == 4
    a.append(records(9, 12, b"zombie"))
    a.flush()  # the zombie goes on uploading past the cut
    b.append(records(4, 6, b"new"))
    assert b.flush() == 6
    c = make_system(where).open_partition("st", 0, 1, readonly=True)
    assert list(c.read(0, 6)) == records(0, 4) + records(4, 6, b"new")
    a.close()
    b.close()


def test_writer_epochs_follow_the_checkpoint_claims_not_the_open_order(where):
    """Two instances of one task racing: A claims first, B second (B fences A), but A
    opens its partition last. B's objects must still win the chain, and A cannot commit."""
    a_sys, b_sys = make_system(where), make_system(where)
    a_sys.checkpoints().read("job", 0)
    b_sys.checkpoints().read("job", 0)
    pb = b_sys.open_partition("st", 0, 1)
    pa = a_sys.open_partition("st", 0, 1)
    assert pb.epoch > pa.epoch
    pb.append(records(0, 3, b"b"))
    pb.flush()
    pa.append(records(0, 5, b"a"))
    pa.flush()  # the zombie's upload of the same offsets, after B's
    with pytest.raises(FencedError, match="newer instance"):
        a_sys.checkpoints().write("job", 0, Checkpoint(version=1, input_position=None, offsets={"st": 5}))
    b_sys.checkpoints().write("job", 0, Checkpoint(version=1, input_position=None, offsets={"st": 3}))
    reader = make_system(where).open_partition("st", 0, 1, readonly=True)
    assert list(reader.read(0, 3)) == records(0, 3, b"b")
    pa.close()
    with pytest.raises(FencedError, match="a newer instance took over"):
        a_sys.open_partition("st", 0, 1)  # the zombie opening again, after B wrote


def test_a_second_job_on_the_same_stream_is_refused(where, tmp_path):
    one = store_values(tmp_path, where)
    with TaskStorage(Config.from_dict(one)) as s:
        for i in range(3):  # job one's claims run ahead of job two's
            s.store("kv").put("a", i)
            s.commit(input_position=i)
    two = {**one, "job.name": unique("other-job")}  # same stores.kv.changelog stream
    with pytest.raises(CorruptionError, match="no checkpoint names the store"):
        TaskStorage(moved(two, tmp_path, "machine-b"))
    with TaskStorage(moved(one, tmp_path, "machine-c")) as s:  # job one is untouched
        assert dump(s) == {"a": 2}


def test_a_roll_up_by_the_previous_instance_after_the_listing_is_read_through(where):
    """The previous instance rolls up (and deletes) objects a new reader has just listed:
    the reader lists again and reads the merged object, never a false "missing" error."""
    opts = {**where, "systems.s3.rollup.objects": 4}
    old = make_system(opts).open_partition("st", 0, 1)
    for i in range(0, 6, 2):
        old.append(records(i, i + 2))
        old.flush()
    reader = make_system(opts).open_partition("st", 0, 1, readonly=True)
    old.append(records(6, 8))
    old.after_commit(old.flush())  # the 4th object, committed: the four are merged into one and deleted
    assert len(old.store.list(old.log_prefix)) == 1
    assert list(reader.read(0, 6)) == records(0, 6)
    # the merged object deleted too (damage): listing again finds nothing to read
    (merged, _), = old.store.list(old.log_prefix)
    old.store.delete([f"{old.log_prefix}/{merged}"])
    with pytest.raises(CorruptionError, match=r"no object under .*/log/ holds offset 0"):
        list(reader.read(0, 6))


def test_discard_tail_past_the_end_is_corruption_naming_the_location(where):
    p = make_system(where).open_partition("st", 0, 1)
    p.append(records(0, 3))
    p.flush()
    with pytest.raises(CorruptionError, match=r"ends at offset 3.*00000000000000000003-\*\.lsb.*Nothing was changed"):
        p.discard_tail(5, lambda keys: [])
    assert list(p.read(0, 3)) == records(0, 3)


def test_partition_count_is_fixed_per_stream(where):
    make_system(where).open_partition("st", 0, 2).close()
    with pytest.raises(ChangelogError, match="has 2 partitions but the job has job.partitions = 3"):
        make_system(where).open_partition("st", 0, 3)


def test_roll_up_merges_objects_and_keeps_every_offset(where):
    opts = {**where, "systems.s3.rollup.objects": 4}
    p = make_system(opts).open_partition("st", 0, 1)
    for i in range(0, 40, 2):  # 20 flushes
        p.append(records(i, i + 2))
        p.after_commit(p.flush())  # roll-ups run once the task committed
    names = p.store.list(p.log_prefix)
    # 20 objects -> 5 of level 1 -> 1 of level 2 + 1 of level 1
    assert len(names) == 2, names
    assert list(p.read(0, 40)) == records(0, 40)
    for stop in (1, 7, 16, 33, 40):  # every offset a checkpoint may name is reconstructible
        assert list(p.read(0, stop)) == records(0, stop)
    p.close()
    q = make_system(opts).open_partition("st", 0, 1)
    assert list(q.read(0, 40)) == records(0, 40)
    assert q.verify()["problems"] == []
    q.close()


# -- the commit protocol -------------------------------------------------------------------
def test_compaction_and_roll_up_keep_the_previous_checkpoint_reconstructible(where, tmp_path):
    values = store_values(tmp_path, where, **{"systems.s3.rollup.objects": 3})
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        for batch in range(1, 9):
            for i in range(10):
                kv.put(f"k{i}", batch)
            kv.delete("k0")
            s.commit(input_position=batch)
        stats = s.compact()["kv"]
        assert stats["records_after"] < stats["records_before"]
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {f"k{i}": 8 for i in range(1, 10)}
    from localstate.storage import Recovery

    with TaskStorage(moved(values, tmp_path, "machine-c"), recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert s.checkpoint.input_position == 7
        assert dump(s) == {f"k{i}": 7 for i in range(1, 10)}


def test_checkpoint_objects_are_cleaned_to_the_last_two(where, tmp_path):
    values = store_values(tmp_path, where)
    with TaskStorage(Config.from_dict(values)) as s:
        for batch in range(1, 7):
            s.store("kv").put("a", batch)
            s.commit(input_position=batch)
        system = s._systems["s3"]
        prefix = f"_checkpoints/{values['job.name']}/partition-0"
        assert len(system.store.list(prefix)) == 2
        assert system.checkpoints().previous(values["job.name"], 0).input_position == 5


# -- damage: missing, corrupt, half-uploaded objects --------------------------------------
def _committed_job(tmp_path: Path, where: dict[str, Any], commits: int = 3) -> dict[str, Any]:
    values = store_values(tmp_path, where, **{"systems.s3.rollup.objects": 100})
    with TaskStorage(Config.from_dict(values)) as s:
        for batch in range(1, commits + 1):
            s.store("kv").put(f"k{batch}", batch)
            s.commit(input_position=batch)
    return values


def _log_keys(values: dict[str, Any]) -> tuple[ObjectStoreChangelogSystem, str, list[str]]:
    system = make_system(values, values["job.name"])
    prefix = f"{values['job.name']}-kv/0/log"
    return system, prefix, sorted(n for n, _ in system.store.list(prefix))


@pytest.mark.parametrize("damage", ["missing", "corrupt", "truncated"])
def test_damaged_committed_object_is_an_error_naming_bucket_and_key(where, tmp_path, damage):
    values = _committed_job(tmp_path, where)
    system, prefix, names = _log_keys(values)
    victim = f"{prefix}/{names[1]}"
    data = system.store.get(victim)
    if damage == "missing":
        system.store.delete([victim])
        expect = r"ends at offset \d+ \(no object .*log/\d{20}-\*\.lsb\); objects exist from offset"
    elif damage == "corrupt":
        bad = bytearray(data)
        bad[-3] ^= 0xFF
        system.store.put(victim, bytes(bad))
        expect = r"CRC mismatch"
    else:
        system.store.put(victim, data[: len(data) // 2])  # a half-uploaded object
        expect = r"torn or truncated"
    before = {n: system.store.get(f"{prefix}/{n}") for n, _ in system.store.list(prefix)}
    ckpts = sorted(system.store.list(f"_checkpoints/{values['job.name']}/partition-0"))
    with pytest.raises(CorruptionError, match=expect) as info:
        TaskStorage(moved(values, tmp_path, "machine-b"))
    url = values["systems.s3.path"]
    assert url.split("://")[1].split("/")[0] in str(info.value)  # the bucket (or directory)
    if damage != "missing":
        assert names[1] in str(info.value)  # the key
    # nothing changed: the log objects are as they were (the failed open only read)
    assert {n: system.store.get(f"{prefix}/{n}") for n, _ in system.store.list(prefix)} == before
    assert sorted(system.store.list(f"_checkpoints/{values['job.name']}/partition-0"))[:len(ckpts)] == ckpts


def test_corrupt_latest_checkpoint_is_an_error_not_a_fall_back(where, tmp_path):
    values = _committed_job(tmp_path, where)
    system = make_system(values, values["job.name"])
    prefix = f"_checkpoints/{values['job.name']}/partition-0"
    latest = sorted(n for n, _ in system.store.list(prefix))[-1]
    system.store.put(f"{prefix}/{latest}", b"LSCKPT1\n" + b"0" * 32 + b"\nnot a checkpoint")
    with pytest.raises(CorruptionError, match=rf"{latest} is corrupt.*--use-previous-checkpoint"):
        TaskStorage(moved(values, tmp_path, "machine-b"))


def test_checkpoints_deleted_is_an_error_then_the_operator_decides(where, tmp_path):
    """Trust rules: a changelog no checkpoint explains is refused (never an empty store);
    --accept-log-end takes what the log holds, --reset empties it (offsets go on)."""
    from localstate.storage import Recovery

    values = _committed_job(tmp_path, where)
    system = make_system(values, values["job.name"])
    prefix = f"_checkpoints/{values['job.name']}/partition-0"
    system.store.delete([f"{prefix}/{n}" for n, _ in system.store.list(prefix)])
    with pytest.raises(CorruptionError, match="no checkpoint names the store"):
        TaskStorage(moved(values, tmp_path, "machine-b"))
    with TaskStorage(moved(values, tmp_path, "machine-c"), recovery=Recovery(accept_log_end={"kv"})) as s:
        assert dump(s) == {"k1": 1, "k2": 2, "k3": 3}
        end = s.checkpoint.offsets["kv"] if s.checkpoint else None
    with TaskStorage(moved(values, tmp_path, "machine-d"), recovery=Recovery(reset={"kv"})) as s:
        assert dump(s) == {}
        s.store("kv").put("new", 1)
        s.commit(input_position=10)
    with TaskStorage(moved(values, tmp_path, "machine-e")) as s:
        assert dump(s) == {"new": 1}
        assert end is None or s.checkpoint.offsets["kv"] > end  # offsets never go back


def test_a_half_uploaded_tail_object_is_never_read(where, tmp_path):
    """An uncommitted object cut short (a writer that died mid-upload on a store without
    atomic PUT) lies past the committed offset: it is discarded, never decoded."""
    values = _committed_job(tmp_path, where)
    system, prefix, names = _log_keys(values)
    last = ObjectName.parse(names[-1])
    tail = ObjectName(last.end, last.end + 50, last.epoch)
    system.store.put(f"{prefix}/{tail.name}", b"LS\x01\x00garbage")
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {"k1": 1, "k2": 2, "k3": 3}
        s.store("kv").put("k4", 4)
        s.commit(input_position=4)
    assert tail.name not in [n for n, _ in system.store.list(prefix)]


# -- faults of the endpoint (S3 only) ------------------------------------------------------
def test_endpoint_stopped_mid_commit_fails_the_commit(fresh_s3_server, tmp_path):
    opts = objectstore_options(fresh_s3_server.endpoint, fresh_s3_server.create_bucket(), **FAST)
    values = store_values(tmp_path, opts)
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("a", 1)
    s.commit(input_position=1)
    s.store("kv").put("a", 2)
    fresh_s3_server.stop()
    t0 = time.monotonic()
    with pytest.raises(ChangelogError, match=rf"{opts['systems.s3.path']}/.*after 3 attempt") as info:
        s.commit(input_position=2)
    assert time.monotonic() - t0 < 30, "retries must be bounded"
    assert "nothing from this operation counts as done" in str(info.value)
    assert s.checkpoint.input_position == 1
    with pytest.raises(Exception, match="previous commit .* failed"):
        s.commit(input_position=2)
    s.close()


@pytest.fixture
def proxied(s3_server) -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    with FaultProxy(s3_server.endpoint) as proxy:
        yield proxy, objectstore_options(proxy.endpoint, s3_server.create_bucket(), **FAST)


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_retried_with_backoff_then_succeed(proxied, tmp_path, status):
    proxy, opts = proxied
    values = store_values(tmp_path, opts)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        proxy.fail(2, status, method="PUT")  # the changelog object's PUT fails twice
        s.commit(input_position=1)
    assert sum(1 for _, _, st in proxy.seen if st == status) == 2
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {"a": 1}


def test_server_errors_past_the_retries_fail_the_commit_and_nothing_counts(proxied, tmp_path):
    proxy, opts = proxied
    values = store_values(tmp_path, opts)
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("a", 1)
    s.commit(input_position=1)
    s.store("kv").put("a", 2)
    proxy.fail(10, 503, method="PUT")
    with pytest.raises(ChangelogError, match=r"could not write s3://.*after 3 attempt.*SlowDown|503"):
        s.commit(input_position=2)
    s.close()
    proxy.clear()
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert s.checkpoint.input_position == 1 and dump(s) == {"a": 1}


def test_checkpoint_put_failing_after_the_changelog_upload_commits_nothing(proxied, tmp_path):
    """The changelog object reached the store, the checkpoint did not: the commit fails,
    and the next instance restores the last commit and discards the uploaded tail."""
    proxy, opts = proxied
    values = store_values(tmp_path, opts)
    s = TaskStorage(Config.from_dict(values))
    s.store("kv").put("a", 1)
    s.commit(input_position=1)
    s.store("kv").put("a", 2)
    proxy.fail(10, 500, method="PUT", path_contains="_checkpoints")
    with pytest.raises(ChangelogError, match=r"could not write s3://.*/_checkpoints/"):
        s.commit(input_position=2)
    s.close()
    proxy.clear()
    log_puts = [p for m, p, st in proxy.seen if m == "PUT" and "/log/" in p and st == 200]
    assert len(log_puts) == 2, "the second changelog object was uploaded"
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert s.checkpoint.input_position == 1 and dump(s) == {"a": 1}
        s.store("kv").put("b", 3)
        s.commit(input_position=2)
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert dump(s) == {"a": 1, "b": 3}


def test_a_slow_endpoint_times_out_and_a_retried_checkpoint_create_is_not_mistaken_for_fencing(proxied, tmp_path):
    proxy, opts = proxied
    values = store_values(tmp_path, opts, **{"systems.s3.timeout.ms": 300})
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        s.commit(input_position=1)
        s.store("kv").put("a", 2)
        proxy.delay_s = 0.5  # every answer arrives after the client gave up
        t0 = time.monotonic()
        with pytest.raises(ChangelogError, match="after 3 attempt"):
            s.commit(input_position=2)
        assert time.monotonic() - t0 < 10, "timeouts and retries must be bounded"
    proxy.delay_s = 0.0
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        # the slow PUTs may have reached the store; a commit reached it only if the
        # checkpoint did, and the state is always exactly one commit's
        assert dump(s) == {"a": s.checkpoint.input_position}


def test_a_connection_dropped_mid_upload_fails_or_retries_never_a_partial_object(proxied, tmp_path):
    proxy, opts = proxied
    values = store_values(tmp_path, opts)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        proxy.cut_upload(1)  # half the body reaches moto, then the connection drops
        s.commit(input_position=1)  # retried in full
    assert any(st == 0 for m, _, st in proxy.seen if m == "PUT"), "the upload was not cut"
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {"a": 1}


# -- SIGKILL inside the commit -------------------------------------------------------------
@pytest.mark.parametrize("point", ["commit.after_changelog_flush", "checkpoint.before_rename",
                                   "objectstore.rollup.after_put"])
def test_sigkill_inside_the_commit_restores_the_last_commit(request, tmp_path, point):
    """The crash-trial harness's child and reference (localstate.testing.torture) on the
    objectstore changelog, with roll-ups every 2 objects so a roll-up is killed too."""
    server = request.getfixturevalue("s3_server")
    endpoint = server.endpoint
    try:
        server.create_bucket(T.TORTURE_BUCKET)
    except Exception as e:  # created by an earlier parametrisation on the same server
        if "BucketAlready" not in str(e):
            raise
    plan = T.kill_plan("memory", (f"{point}=kill@3",), changelog="objectstore", batches=5)
    reference = T.reference_run(plan, tmp_path / "ref").states
    values = {**plan.values(tmp_path / "crash", endpoint, "", namespace=unique("ns")),
              "systems.objectstore.rollup.objects": 2}
    rc, _, err = T.run_child(plan, values, plan.faults[0])
    assert rc == -9, err
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        pos = s.checkpoint.input_position
        # roll-ups run after a commit's checkpoint: the 3rd is the second of commit 4's
        assert pos == (4 if point == "objectstore.rollup.after_put" else 2)
        assert dump(s, T.STORE) == reference[pos]
    rc, _, err = T.run_child(plan, values, None)
    assert rc == 0, err
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert s.checkpoint.input_position == 5
        assert dump(s, T.STORE) == reference[5]


# -- configuration -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"systems.s3.path": "bucket/prefix"}, r"systems\.s3\.path = 'bucket/prefix': .* needs a URL"),
        ({"systems.s3.path": "file://relative/dir"}, "needs an absolute path"),
        ({"systems.s3.path": "s3://b/p", "systems.s3.retries": "-1"}, r"systems\.s3\.retries = -1"),
        ({"systems.s3.path": "s3://b/p", "systems.s3.rollup.objects": 1.5}, r"systems\.s3\.rollup\.objects"),
        ({"systems.s3.path": "s3://b/p", "systems.s3.client.allow_http": "maybe"}, r"allow_http"),
        ({"systems.s3.path": "s3://b/p", "systems.s3.rollup.object": 3}, "(?i)did you mean"),
    ],
)
def test_bad_config_names_the_key(tmp_path, keys, match):
    values = {"job.name": "j", "job.state.dir": str(tmp_path), "job.changelog.system": "s3",
              "job.checkpoint.system": "s3", "stores.kv.factory": "memory", "systems.s3.type": "objectstore",
              **keys}
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(values)


@pytest.mark.parametrize(("key", "match"), [("config.endpont", "'endpont' is not valid"),
                                          ("client.allow_htp", "allow_htp")])
def test_an_unknown_store_or_client_setting_is_a_config_error_at_open(tmp_path, key, match):
    values = store_values(tmp_path, {"systems.s3.type": "objectstore", "systems.s3.path": "s3://b/p",
                                     f"systems.s3.{key}": "x"})
    with pytest.raises(ConfigError, match=rf"systems\.s3\.path = 's3://b/p': cannot open the object store: .*{match}"):
        TaskStorage(Config.from_dict(values))


def test_a_missing_bucket_is_an_error_naming_it(s3_server, tmp_path):
    opts = objectstore_options(s3_server.endpoint, "no-such-bucket-here", **{**FAST, "retries": 0})
    with pytest.raises(ChangelogError, match="no-such-bucket-here"):
        TaskStorage(Config.from_dict(store_values(tmp_path, opts)))


def test_an_unexpected_object_in_the_log_is_an_error_naming_it_and_nothing_changes(where, tmp_path):
    values = _committed_job(tmp_path, where)
    system, prefix, names = _log_keys(values)
    system.store.put(f"{prefix}/notes.txt", b"an operator's note")
    with pytest.raises(CorruptionError, match=r"unexpected object .*log/notes\.txt"):
        TaskStorage(moved(values, tmp_path, "machine-b"))
    assert sorted(n for n, _ in system.store.list(prefix)) == sorted([*names, "notes.txt"])


def test_checkpoint_round_trip_through_the_store_api(where):
    system = make_system(where)
    ckpts = system.checkpoints()
    assert ckpts.read("j", 0) is None
    ckpts.write("j", 0, Checkpoint(version=1, input_position={"a": 1}, offsets={"kv": 3}))
    got = make_system(where).checkpoints().read("j", 0, fence=False)
    assert got.input_position == {"a": 1} and got.offsets == {"kv": 3}



# -- RocksDB snapshots kept in the object store --------------------------------------------
needs_rocksdb = pytest.mark.skipif(not ENGINES.installed("rocksdb")[0], reason="rocksdb not installed")


def _rocksdb_job(tmp_path: Path, where: dict[str, Any], commits: int, every: int) -> dict[str, Any]:
    values = store_values(tmp_path, where, "rocksdb", **{"systems.s3.snapshot.every": every})
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        for batch in range(1, commits + 1):
            for i in range(20):
                kv.put(f"k{(batch * 7 + i) % 50}", batch)
            kv.delete(f"k{batch % 50}")
            s.commit(input_position=batch)
    return values


def _model(commits: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for batch in range(1, commits + 1):
        for i in range(20):
            state[f"k{(batch * 7 + i) % 50}"] = batch
        state.pop(f"k{batch % 50}", None)
    return state


@needs_rocksdb
def test_snapshot_files_are_uploaded_once_and_shared(where, tmp_path):
    values = _rocksdb_job(tmp_path, where, commits=3, every=1)  # 3 snapshots, the newest 2 kept
    system, prefix, _ = _log_keys(values)
    snap_prefix = prefix.rsplit("/", 1)[0]
    manifests = sorted(n for n, _ in system.store.list(f"{snap_prefix}/snapshots"))
    assert len(manifests) == 2
    older = json.loads(system.store.get(f"{snap_prefix}/snapshots/{manifests[0]}"))["files"]
    newer = json.loads(system.store.get(f"{snap_prefix}/snapshots/{manifests[1]}"))["files"]
    assert set(older) & set(newer), "an SST file of both snapshots"
    for name in set(older) & set(newer):
        assert older[name]["key"] == newer[name]["key"]
    # exactly the files the kept snapshots use are stored (the first snapshot's own are gone)
    ssts = {f"{snap_prefix}/sst/{n}" for n, _ in system.store.list(f"{snap_prefix}/sst")}
    assert ssts == {m["key"] for m in (*older.values(), *newer.values())}


@needs_rocksdb
def test_a_moved_task_downloads_the_newest_snapshot_and_replays_only_the_tail(where, tmp_path):
    # shipped at commit 1 (the engine's first snapshot), then every 2 commits: 3 and 5
    values = _rocksdb_job(tmp_path, where, commits=6, every=2)
    system, prefix, _ = _log_keys(values)
    snap_prefix = prefix.rsplit("/", 1)[0]
    newest = sorted(n for n, _ in system.store.list(f"{snap_prefix}/snapshots"))[-1]
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        progress = s.last_restore["kv"]
        assert progress.start_offset == int(newest[:20]) > 0  # replayed from the snapshot on
        assert 0 < progress.records <= 20 + 1  # only the last commit's records
        assert dump(s) == _model(6)


@needs_rocksdb
def test_a_damaged_remote_snapshot_falls_back_to_an_older_one_or_the_changelog(where, tmp_path):
    values = _rocksdb_job(tmp_path, where, commits=7, every=3)
    system, prefix, _ = _log_keys(values)
    snap_prefix = prefix.rsplit("/", 1)[0]
    newest = sorted(n for n, _ in system.store.list(f"{snap_prefix}/snapshots"))[-1]
    files = json.loads(system.store.get(f"{snap_prefix}/snapshots/{newest}"))["files"]
    system.store.put(sorted(m["key"] for m in files.values())[-1], b"not an sst file")
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert s.last_restore["kv"].start_offset < int(newest[:20])  # the damaged one was not used
        assert dump(s) == _model(7)


@needs_rocksdb
def test_snapshots_past_the_committed_offset_are_deleted_with_the_tail(where, tmp_path):
    values = _rocksdb_job(tmp_path, where, commits=6, every=3)
    from localstate.storage import Recovery

    # going back one commit makes the snapshot at commit 6 describe records that are
    # no longer committed: it must go with the tail, never be used later
    with TaskStorage(moved(values, tmp_path, "machine-b"), recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert s.checkpoint.input_position == 5
        committed = s.checkpoint.offsets["kv"]
    system, prefix, _ = _log_keys(values)
    snap_prefix = prefix.rsplit("/", 1)[0]
    offsets = [int(n[:20]) for n, _ in system.store.list(f"{snap_prefix}/snapshots")]
    assert offsets and max(offsets) <= committed
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert dump(s) == _model(5)


# -- crash trials (short CI form of `localstate torture --changelog objectstore`) ---------
@pytest.mark.parametrize("engine", [n for n in ("memory", "rocksdb") if ENGINES.installed(n)[0]])
def test_crash_trials_on_s3(engine, tmp_path, s3_server):
    from localstate.testing import torture as T

    try:
        s3_server.create_bucket(T.TORTURE_BUCKET)
    except Exception as e:  # created by the other engine's run
        assert "BucketAlready" in str(e)
    report = T.run_trials(engine, "objectstore", 2, seed=3003, workdir=tmp_path, batches=6, ops=20,
                          bootstrap=s3_server.endpoint, jobs=2)
    s = report.summary()
    assert s["trials"] == 2 and s["divergences"] == 0, json.dumps(s["first_divergence"], indent=2, default=str)


@needs_rocksdb
def test_every_objectstore_fault_point_crashes_and_recovers(tmp_path):
    """Each objectstore fault point really kills the child (file://), and the trial recovers."""
    from localstate.testing import torture as T

    for i, point in enumerate(T.OBJECTSTORE_POINTS):
        plan = T.TrialPlan(seed=70 + i, engine="rocksdb", changelog="objectstore", batches=8, ops=30, keys=20,
                           compact_every=0, retention_ms=0, faults=(f"{point}=kill@{1 if 'discard' in point else 2}",))
        res = T.run_trial(plan, tmp_path / point)
        assert res.ok, res.divergence
        assert res.crashes == 1, f"{point} was never reached"
