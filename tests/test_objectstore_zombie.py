"""The objectstore changelog on the cluster paths: a fenced zombie changes nothing the new
owner sees, a lost newest checkpoint is an error (never a step back), and state queries
write nothing. On the moto S3 server and on file:// URLs. The system-independent forms of
these cases are in the conformance kit (localstate.testing.changelog_conformance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import Config, TaskStorage
from localstate.changelog.objectstore import ObjectName, ObjectStoreChangelogSystem
from localstate.changelog.objectstore.chain import chain_of
from localstate.checkpoint import Checkpoint
from localstate.cli import cli
from localstate.errors import CorruptionError, FencedError
from localstate.reader import StateReader
from localstate.registry import ENGINES
from localstate.storage import Recovery
from localstate.testing.changelog_conformance import dump, records, task_values
from localstate.testing.changelog_conformance import on_another_machine as moved
from localstate.verify import verify_job

pytestmark = pytest.mark.s3



@pytest.fixture
def where(objectstore_where: dict[str, Any]) -> dict[str, Any]:
    """A fresh objectstore location: a moto bucket, then a file:// directory."""
    return objectstore_where


def system_of(values: dict[str, Any], job: str = "job") -> ObjectStoreChangelogSystem:
    options = {k[len("systems.s3."):]: v for k, v in values.items()
               if k.startswith("systems.s3.") and k != "systems.s3.type"}
    return ObjectStoreChangelogSystem("s3", options, job)


def job_of(where: dict[str, Any], tmp_path: Path, factory: str = "memory", **extra: Any) -> dict[str, Any]:
    return task_values({"job.changelog.system": "s3", "job.checkpoint.system": "s3", **where}, tmp_path,
                       factory, **extra)


def log_objects(values: dict[str, Any]) -> list[ObjectName]:
    system = system_of(values, values["job.name"])
    return sorted(o for o in (ObjectName.parse(n) for n, _ in system.store.list(f"{values['job.name']}-kv/0/log"))
                  if o is not None)


def cli_args(values: dict[str, Any]) -> list[str]:
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


# -- a fenced zombie ----------------------------------------------------------------------------
@pytest.mark.parametrize("rollup", [16, 4])
def test_a_fenced_zombie_rolls_up_and_deletes_nothing(where, tmp_path, rollup):
    """A commits 15 times; B takes over; A writes and commits (fenced): the upload before
    its failed checkpoint is the 16th of its level, yet nothing is rolled up or deleted.
    B commits; a new instance has B's input position with B's values, and ``verify`` and
    ``localstate verify`` are clean."""
    values = job_of(where, tmp_path, **{"systems.s3.rollup.objects": rollup})
    a = TaskStorage(Config.from_dict(values))
    for i in range(1, 16):
        a.store("kv").put("x", f"a{i}")
        a.commit(input_position=i)
    committed_by_a = max(o.end for o in log_objects(values))
    b = TaskStorage(moved(values, tmp_path, "machine-b"))
    before = log_objects(values)
    a.store("kv").put("x", "zombie")
    a.store("kv").put("only-a", "zombie")
    with pytest.raises(FencedError):
        a.commit(input_position=99)
    zombie = [o for o in log_objects(values) if o not in before]
    assert len(zombie) == 1 and zombie[0].start == committed_by_a, zombie  # its upload; no roll-up
    assert set(before) <= set(log_objects(values)), "the zombie deleted objects"
    a.close()
    b.store("kv").put("x", "b")
    b.commit(input_position=16)
    b.close()
    with TaskStorage(moved(values, tmp_path, "machine-c")) as c:
        assert c.checkpoint.input_position == 16
        assert dump(c) == {"x": "b"}
    assert [p for check in verify_job(Config.from_dict(values)) for p in check.problems] == []
    assert CliRunner().invoke(cli, ["verify", *cli_args(values)]).exit_code == 0


def test_a_zombies_late_roll_up_landing_before_the_new_owner_writes_is_cut(where, tmp_path):
    """On S3 a zombie cannot check its fencing and write atomically: its roll-up of
    everything it uploaded, reaching past its last commit, lands after B opened and before
    B writes, and its small objects are deleted. B's commit and every later open still
    read only A's committed records and B's."""
    values = job_of(where, tmp_path)
    a = TaskStorage(Config.from_dict(values))
    for i in range(1, 4):
        a.store("kv").put(f"k{i}", i)
        a.commit(input_position=i)
    b = TaskStorage(moved(values, tmp_path, "machine-b"))
    part = a.changelog("kv")
    part.append(records(0, 5, b"zombie"))
    part.flush()  # an upload of the zombie past its last commit
    mine = [o for o in log_objects(values) if o.epoch == part.epoch]
    data = b"".join(part.store.get(f"{part.log_prefix}/{o.name}") for o in mine)
    part.store.put(f"{part.log_prefix}/{ObjectName(0, mine[-1].end, part.epoch).name}", data)
    part.store.delete([f"{part.log_prefix}/{o.name}" for o in mine])
    a.close()
    with StateReader(Config.from_dict(values)) as r:  # beside B, before B writes: A's commit
        assert dict(r.store("kv")) == {"k1": 1, "k2": 2, "k3": 3}
    b.store("kv").put("k1", "b")
    b.commit(input_position=4)
    b.close()
    for machine in ("machine-b", "machine-c"):
        with TaskStorage(moved(values, tmp_path, machine)) as c:
            assert c.checkpoint.input_position == 4
            assert dump(c) == {"k1": "b", "k2": 2, "k3": 3}
    assert [p for check in verify_job(Config.from_dict(values)) for p in check.problems] == []


def test_a_fenced_partition_refuses_to_delete_or_roll_up(where):
    """At the partition level: after a newer instance claimed, the old one's roll-up is
    skipped and its tail discard and compaction raise FencedError, deleting nothing."""
    opts = {**where, "systems.s3.rollup.objects": 4}
    a = system_of(opts).open_partition("st", 0, 1)
    for i in range(0, 8, 2):
        a.append(records(i, i + 2))
        a.flush()
    names = sorted(a.store.list(a.log_prefix))
    newer = system_of(opts)
    newer.checkpoints().read("job", 0)  # the newer instance's claim
    a.after_commit(8)  # the 4th object of its level, committed: but A is fenced now
    assert sorted(a.store.list(a.log_prefix)) == names
    with pytest.raises(FencedError, match="newer instance"):
        a.discard_tail(4, lambda keys: [])
    with pytest.raises(FencedError, match="newer instance"):
        a.compact(8)
    assert [n for n, _ in sorted(a.store.list(a.log_prefix))
            if ObjectName.parse(n) is not None and ObjectName.parse(n).end <= 8] == [n for n, _ in names]
    a.close()


def test_the_chain_cuts_an_older_writers_object_where_a_newer_writer_starts():
    """Pure: an object of epoch 1 reaching past offset 10, where epoch 2 starts, is used
    only up to 10; an older uncommitted tail never shadows a newer writer's objects."""
    rolled = ObjectName(0, 16, 1)  # a zombie's roll-up past its last commit (10)
    smalls = [ObjectName(0, 5, 1), ObjectName(5, 10, 1)]
    newer = [ObjectName(10, 12, 2), ObjectName(12, 20, 2)]
    chain, others = chain_of([rolled, *newer])
    assert [(o.start, o.end, o.epoch) for o in chain] == [(0, 10, 1), (10, 12, 2), (12, 20, 2)]
    assert chain[0].name == rolled.name and chain[0].whole == rolled and others == []
    chain, others = chain_of([*smalls, rolled, *newer])
    assert [(o.start, o.end) for o in chain] == [(0, 10), (10, 12), (12, 20)] and sorted(others) == smalls
    tail = ObjectName(10, 14, 1)  # the older writer's object at the newer one's start
    chain, others = chain_of([*smalls, tail, *newer])
    assert tail in others and [o.epoch for o in chain] == [1, 1, 2, 2]
    # without a newer writer, nothing is cut
    assert chain_of([rolled])[0] == [rolled]


# -- a lost newest checkpoint -------------------------------------------------------------------
def _seven_commits(where: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    values = job_of(where, tmp_path)
    with TaskStorage(Config.from_dict(values)) as s:
        for i in range(1, 8):
            s.store("kv").put("x", i)
            s.commit(input_position=i)
    return values


def _delete_newest_checkpoint(values: dict[str, Any]) -> str:
    system = system_of(values, values["job.name"])
    prefix = system.checkpoints().prefix(values["job.name"], 0)
    newest = max(n for n, _ in system.store.list(prefix))
    system.store.delete([f"{prefix}/{newest}"])
    return newest


@pytest.mark.parametrize("claimed_after", [False, True])
def test_a_deleted_newest_checkpoint_is_an_error_and_deletes_nothing(where, tmp_path, claimed_after):
    """After 7 commits the newest object under the task's checkpoint prefix is deleted
    (also when a later instance's claim is newer still): every open is an error naming the
    checkpoint prefix and the recovery commands, the log of commit 7 is kept, ``verify``
    and ``localstate verify`` report it; going back one commit is an explicit choice."""
    values = _seven_commits(where, tmp_path)
    system = system_of(values, values["job.name"])
    prefix = system.checkpoints().prefix(values["job.name"], 0)
    if claimed_after:
        lost = max(n for n, _ in system.store.list(prefix))
        TaskStorage(moved(values, tmp_path, "claims")).close()  # claims, commits nothing
        system.store.delete([f"{prefix}/{lost}"])
    else:
        lost = _delete_newest_checkpoint(values)
    logs = log_objects(values)
    for machine in ("state", "machine-b"):
        with pytest.raises(CorruptionError, match=r"newest checkpoint .* is missing.*version 6.*"
                                                  r"--use-previous-checkpoint.*--accept-log-end") as info:
            TaskStorage(moved(values, tmp_path, machine))
        assert system.store.where(prefix) in str(info.value)
    assert log_objects(values) == logs, "a log object of a commit was deleted"
    assert lost not in {n for n, _ in system.store.list(prefix)}
    problems = [p for check in verify_job(Config.from_dict(values)) for p in check.problems]
    assert problems and "newest checkpoint" in problems[0]
    result = CliRunner().invoke(cli, ["verify", *cli_args(values)])
    assert result.exit_code == 1 and "newest checkpoint" in result.output
    assert CliRunner().invoke(cli, ["get", *cli_args(values), "kv", "x"]).exit_code == 1  # no silent answer
    with TaskStorage(moved(values, tmp_path, "machine-c"), recovery=Recovery(accept_log_end={"kv"})) as s:
        assert s.store("kv").get("x") == 7  # commit 7's records are all still there
    with TaskStorage(moved(values, tmp_path, "machine-d"), recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert s.checkpoint.input_position == 6 and s.store("kv").get("x") == 6
        s.store("kv").put("x", 70)
        s.commit(input_position=7)
    with TaskStorage(moved(values, tmp_path, "machine-e")) as s:
        assert s.store("kv").get("x") == 70


def test_checkpoints_in_the_earlier_format_are_read(where):
    """Checkpoint objects written before they named their predecessor still read (no check)."""
    system = system_of(where)
    store = system.checkpoints()
    store.write("job", 0, Checkpoint(version=1, input_position=1, offsets={}))
    prefix = store.prefix("job", 0)
    old = Checkpoint(version=2, input_position=2, offsets={})
    system.store.put(f"{prefix}/{99:020d}", b"LSCKPT1\n" + b"0" * 32 + b"\n" + old.to_bytes(), create=True)
    assert system_of(where).checkpoints().read("job", 0, fence=False).version == 2


# -- state queries write nothing ----------------------------------------------------------------
def test_get_dump_and_verify_write_nothing(where, tmp_path):
    """``localstate get``, ``dump`` and ``verify`` on an S3 job: no claim, no object, and
    the task's next commit succeeds."""
    values = job_of(where, tmp_path)
    system = system_of(values, values["job.name"])

    def everything() -> list[tuple[str, bytes]]:
        prefixes = [f"{values['job.name']}-kv", f"_checkpoints/{values['job.name']}"]
        return sorted((f"{p}/{n}", system.store.get(f"{p}/{n}")) for p in prefixes for n, _ in system.store.list(p))

    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        s.commit(input_position=1)
        before = everything()
        run = CliRunner().invoke
        got = run(cli, ["get", *cli_args(values), "kv", "a"])
        assert got.exit_code == 0 and got.output.strip() == "1", got.output
        dumped = run(cli, ["dump", *cli_args(values), "kv"])
        assert dumped.exit_code == 0 and dumped.output.strip() == "0\ta\t1", dumped.output
        assert run(cli, ["verify", *cli_args(values)]).exit_code == 0
        assert everything() == before
        s.store("kv").put("a", 2)
        s.commit(input_position=2)  # not fenced


# -- a lost generation record (after a rescale) ---------------------------------------------------
def test_a_deleted_generation_record_after_a_rescale_is_an_error_not_an_empty_job(where, tmp_path):
    """After ``rescale`` the old generation's objects are deleted; deleting the newest
    ``_generations/<job>/<n>`` record then made every task fall back to the emptied old
    generation and open empty (no checkpoint, no records). Now an error naming the record."""
    from localstate.rescale import rescale

    values = {**job_of(where, tmp_path), "job.partitions": 2}
    config = Config.from_dict(values)
    for p in range(2):
        with TaskStorage(config, p) as s:
            s.store("kv").put(f"k{p}", p)
            s.commit(input_position=1)
    one = rescale(config, 1).config
    with TaskStorage(one, 0) as s:
        assert dump(s) == {"k0": 0, "k1": 1}
    system = system_of(values, values["job.name"])
    prefix = system.generation_prefix()
    record = max(n for n, _ in system.store.list(prefix) if n.isdigit())
    system.store.delete([f"{prefix}/{record}"])
    with pytest.raises(CorruptionError, match=rf"generation record .*{record} of job .* is missing.*would open empty"):
        TaskStorage(moved(one.to_dict(), tmp_path, "machine-b"), 0)
    problems = [p for check in verify_job(one) for p in check.problems]  # reported, as every damage is
    assert problems and all("generation record" in p for p in problems)
    result = CliRunner().invoke(cli, ["verify", *cli_args(one.to_dict())])
    assert result.exit_code == 1 and "generation record" in result.output, result.output


needs_rocksdb = pytest.mark.skipif(not ENGINES.installed("rocksdb")[0], reason="rocksdb not installed")


@needs_rocksdb
def test_a_zombies_local_snapshot_of_its_failed_commit_is_never_loaded(where, tmp_path):
    """A zombie's failed commit still took its local rocksdb snapshot (commit step 3 comes
    before the checkpoint), tagged with the offset its last upload ends at. Once the new
    owner's log has passed that offset, the zombie's machine reopening the task must not
    load it: the records under it were never committed. The zombie's upload left in the log
    makes every snapshot at or below its end untrusted, and the next open records that as a
    horizon before it deletes the upload."""
    values = job_of(where, tmp_path, "rocksdb", **{"stores.kv.rocksdb.snapshot.interval.records": 0})
    a = TaskStorage(Config.from_dict(values))
    for i in range(3):
        a.store("kv").put("x", f"a{i}")
        a.commit(input_position=i)
    b = TaskStorage(moved(values, tmp_path, "machine-b"))
    a.store("kv").put("x", "zombie")
    a.store("kv").put("z", "zombie")
    with pytest.raises(FencedError):
        a.commit(input_position=99)
    a.close()
    model = {"x": "a2"}
    for i in range(5):
        b.store("kv").put("x", f"b{i}")
        b.store("kv").put(f"y{i}", i)
        model.update({"x": f"b{i}", f"y{i}": i})
        b.commit(input_position=10 + i)
    b.close()
    with TaskStorage(Config.from_dict(values)) as s:  # the zombie's machine, its local copy kept
        assert s.checkpoint.input_position == 14
        assert dump(s) == model
    zombie_objects = [o for o in log_objects(values) if o.epoch == min(x.epoch for x in log_objects(values))
                      and o.start >= 3]
    assert zombie_objects == []  # deleted once the horizon was recorded
    with TaskStorage(Config.from_dict(values)) as s:  # and the horizon stays
        assert dump(s) == model


def test_a_predecessors_late_compaction_deletes_are_read_through(where, tmp_path, monkeypatch):
    """A's compaction passed its fencing check just before B took over (the race no check
    can close on S3: simulated by skipping A's checks, a test double for that timing); its
    merged object and its deletes land after B listed the log. B's own compaction finds
    objects gone, lists again and goes on; every later open is exact."""
    values = job_of(where, tmp_path, **{"systems.s3.rollup.objects": 100})
    a = TaskStorage(Config.from_dict(values))
    for i in range(1, 5):
        a.store("kv").put(f"k{i}", i)
        a.commit(input_position=i)
    b = TaskStorage(moved(values, tmp_path, "machine-b"))
    part = a.changelog("kv")
    monkeypatch.setattr(part, "_refuse_if_fenced", lambda what: None)
    part.compact(a.committed_offset("kv"))  # lands now: merged object put, A's objects deleted
    a.close()
    b.store("kv").put("k1", "b")
    b.commit(input_position=5)
    b.store("kv").put("k2", "b")
    b.commit(input_position=6)
    b.compact()
    b.close()
    with TaskStorage(moved(values, tmp_path, "machine-c")) as c:
        assert dump(c) == {"k1": "b", "k2": "b", "k3": 3, "k4": 4}
