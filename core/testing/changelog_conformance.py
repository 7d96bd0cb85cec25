"""The changelog-system conformance suite (shipped, so a plug-in changelog can run it).

Every changelog system — the embedded file log, Kafka, the object store, or a user's
own — must give a task the same guarantees: records read back exactly as flushed,
partitions independent, the uncommitted tail cut back on takeover, a restore on an
empty machine equal to the last commit, and a zombie instance fenced. This suite
checks them through the partition API and through :class:`TaskStorage`.

Usage in a plug-in's tests::

    import pytest
    from localstate.testing.changelog_conformance import ChangelogSystemConformance

    class TestMyChangelog(ChangelogSystemConformance):
        fenced_match = "fenced"  # what the zombie's commit error says

        @pytest.fixture
        def make_system(self, tmp_path):
            return lambda: MyChangelogSystem("mine", {"path": str(tmp_path)}, "job")

        @pytest.fixture
        def job_values(self, tmp_path):
            return {"systems.mine.type": "mine", "systems.mine.path": str(tmp_path),
                    "job.changelog.system": "mine", "job.checkpoint.system": "mine"}

        def lose_stream(self, values, stream):  # delete one changelog stream
            shutil.rmtree(Path(values["systems.mine.path"]) / stream)

        def lose_everything(self, values):  # delete every stream and checkpoint
            shutil.rmtree(values["systems.mine.path"])

``make_system()`` returns a new system instance each call (like a restarted task) on
one shared location; ``job_values`` are the config keys that put a job's changelog
and checkpoints on that system (the suite adds the job name, state directory and a
``kv`` store).

The damage and zombie cases need a system-specific form, given by methods the subclass
overrides: :meth:`~ChangelogSystemConformance.lose_newest_checkpoint` (required: how the
newest checkpoint of a task is deleted or lost on this system),
:meth:`~ChangelogSystemConformance.zombie_late_writes` (what a fenced instance can still
land after the newer one committed; default nothing),
:meth:`~ChangelogSystemConformance.storage_snapshot` (everything the system stores, to
show a reader wrote nothing; default: not compared), and
:meth:`~ChangelogSystemConformance.lose_stream` / :meth:`~ChangelogSystemConformance.lose_everything`
(required: one changelog stream, or every stream and checkpoint, lost as by an operator
or a storage failure; a lost stream or system must be an error where the task's state
dir shows a commit).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from localstate.changelog.base import ChangelogPartition, ChangelogSystem
from localstate.config import Config
from localstate.errors import ChangelogError, CorruptionError, FencedError, StoreLockedError
from localstate.reader import StateReader, read_committed
from localstate.records import apply_records
from localstate.storage import Recovery, TaskStorage

from .changelog_conformance_tasks import KeptOpenCases, TaskNeighbourCases
from .changelog_kit import (
    KV_ENGINES,
    damage_files,
    dump,
    local_files,
    on_another_machine,
    records,
    task_values,
    unique,
)
from .objectstore_conformance import ObjectStoreConformanceHooks

__all__ = ["ChangelogSystemConformance", "ObjectStoreConformanceHooks", "records", "unique", "on_another_machine",
           "dump", "apply_records", "KV_ENGINES", "task_values", "damage_files"]

_INTERVAL = "stores.kv.rocksdb.snapshot.interval.records"
_SHIP_INTERVAL = 300
_SHIP_BATCH = 200


class ChangelogSystemConformance(TaskNeighbourCases, KeptOpenCases):
    """Subclass in a pytest module and provide the ``make_system`` and ``job_values``
    fixtures (see the module docstring); set ``fenced_match`` to a regex the zombie's
    :class:`FencedError` must match. A system that admits only one writer at a time
    (the file log's lock) sets ``fenced_match = None``: a second instance is then refused
    at open and the first goes on."""

    fenced_match: str | None = ""

    # -- fixtures the subclass provides ------------------------------------------------------
    @pytest.fixture
    def make_system(self) -> Callable[[], ChangelogSystem]:
        raise NotImplementedError("provide a make_system fixture returning a system factory")

    @pytest.fixture
    def job_values(self) -> dict[str, Any]:
        raise NotImplementedError("provide a job_values fixture with the system's config keys")

    # -- the suite's own fixtures -------------------------------------------------------------
    @pytest.fixture
    def open_partition(self, make_system: Callable[[], ChangelogSystem]) -> Iterator[Callable[..., ChangelogPartition]]:
        """``open_partition(partition=0, partitions=1)`` on one fresh stream; each call
        opens it through a new system instance."""
        stream = unique("conf")
        systems: list[ChangelogSystem] = []
        opened: list[ChangelogPartition] = []

        def open_(partition: int = 0, partitions: int = 1) -> ChangelogPartition:
            system = make_system()
            systems.append(system)
            p = system.open_partition(stream, partition, partitions)
            opened.append(p)
            return p

        yield open_
        for p in opened:
            p.close()
        for s in systems:
            s.close()

    def task_values(self, job_values: dict[str, Any], tmp_path: Path, factory: str = "memory") -> dict[str, Any]:
        return task_values(job_values, tmp_path, factory)

    # -- the partition contract ---------------------------------------------------------------
    def test_append_flush_read_ranges(self, open_partition):
        p = open_partition()
        assert p.end_offset() == 0
        assert list(p.read(0, 10)) == []
        p.append(records(0, 10))
        p.append(records(10, 15))
        e1 = p.flush()
        assert e1 == p.end_offset() >= 15
        assert list(p.read(0, e1)) == records(0, 15)
        assert list(p.read(3, 12)) == records(3, 12)  # one flush: dense offsets
        assert list(p.read(14, e1)) == records(14, 15)
        assert list(p.read(7, 7)) == []
        p.append([(b"gone", None), (b"k1", b"again")])
        e2 = p.flush()
        assert e2 > e1
        assert list(p.read(e1, e2)) == [(b"gone", None), (b"k1", b"again")]
        assert list(p.read(0, e2)) == records(0, 15) + [(b"gone", None), (b"k1", b"again")]

    def test_append_columns_is_append_of_the_pairs(self, open_partition):
        """The change logger's form: the same records and offsets as ``append`` of the
        pairs, tombstones included; different lengths append nothing."""
        p = open_partition()
        pairs = records(0, 7) + [(b"k3", None), (b"k9", b"")]
        p.append_columns([k for k, _ in pairs], [v for _, v in pairs])
        p.append_columns([], [])
        with pytest.raises(ChangelogError, match="3 keys but 2 values"):
            p.append_columns([b"a", b"b", b"c"], [b"1", b"2"])
        e1 = p.flush()
        assert list(p.read(0, e1)) == pairs
        p.append(records(20, 23))
        p.append_columns([b"k20"], [None])
        e2 = p.flush()
        assert list(p.read(e1, e2)) == records(20, 23) + [(b"k20", None)]
        p.close()
        assert list(open_partition().read(0, e2)) == pairs + records(20, 23) + [(b"k20", None)]

    def test_reopen_sees_every_flushed_record(self, open_partition):
        p = open_partition()
        p.append(records(0, 2000))
        e1 = p.flush()
        p.append(records(0, 500, b"x"))
        e2 = p.flush()
        p.close()
        q = open_partition()
        assert q.end_offset() >= e2
        assert list(q.read(0, e2)) == records(0, 2000) + records(0, 500, b"x")
        assert list(q.read(e1, q.end_offset())) == records(0, 500, b"x")
        batches = list(q.read_batches(0, e2))
        assert sum(len(r) for r, _ in batches) == 2500
        assert all(n > 0 for _, n in batches)

    def test_partitions_are_independent(self, open_partition):
        p0 = open_partition(0, 2)
        p1 = open_partition(1, 2)
        p0.append(records(0, 5))
        p1.append(records(100, 103))
        e0, e1 = p0.flush(), p1.flush()
        assert list(p0.read(0, e0)) == records(0, 5)
        assert list(p1.read(0, e1)) == records(100, 103)

    def test_discard_tail_leaves_the_committed_state(self, open_partition):
        p = open_partition()
        p.append(records(0, 20))
        p.append([(b"k3", None)])
        committed = p.flush()
        model = apply_records(p.read(0, committed))
        p.append([(b"k1", b"uncommitted"), (b"new", b"uncommitted"), (b"k3", b"back"), (b"k5", None)])
        p.flush()
        p.close()  # crash before the checkpoint

        q = open_partition()
        asked: list[bytes] = []

        def current(keys):
            asked.extend(keys)
            return [(k, model.get(k)) for k in keys]

        q.discard_tail(committed, current)
        end = q.end_offset()
        # a full read to the end (what compaction keeps) and a read to the commit agree
        assert apply_records(q.read(0, end)) == model == apply_records(q.read(0, committed))
        if asked:  # a log that cannot truncate (Kafka) re-writes the tail keys' committed values
            assert sorted(asked) == sorted([b"k1", b"new", b"k3", b"k5"])
        q.append([(b"after", b"1")])
        e = q.flush()
        assert apply_records(q.read(0, e)) == {**model, b"after": b"1"}

    def test_discard_tail_past_the_end_is_corruption(self, open_partition):
        p = open_partition()
        p.append(records(0, 3))
        p.flush()
        with pytest.raises(CorruptionError, match=r"10000|10,000"):  # names the committed offset
            p.discard_tail(10_000, lambda keys: [])
        assert list(p.read(0, p.end_offset())) == records(0, 3)  # and changes nothing

    def test_discard_tail_at_the_end_is_a_no_op(self, open_partition):
        p = open_partition()
        p.append(records(0, 3))
        e = p.flush()
        p.discard_tail(e, lambda keys: pytest.fail("no tail, nothing to trim"))
        assert list(p.read(0, p.end_offset())) == records(0, 3)

    # -- the task contract --------------------------------------------------------------------
    @pytest.mark.parametrize("factory", KV_ENGINES)
    def test_exact_restore_to_the_last_commit_uncommitted_tail_invisible(self, job_values, tmp_path, factory):
        values = self.task_values(job_values, tmp_path, factory)
        rng = random.Random(7)
        model: dict[str, int] = {}
        with TaskStorage(Config.from_dict(values)) as s:
            kv = s.store("kv")
            for batch in range(1, 4):
                for _ in range(200):
                    k = f"k{rng.randrange(100)}"
                    if rng.random() < 0.2:
                        kv.delete(k)
                        model.pop(k, None)
                    else:
                        kv.put(k, batch * 1000 + rng.randrange(1000))
                        model[k] = kv.get(k)
                s.commit(input_position=batch)
            for i in range(50):  # never committed, but flushed to the store and the log
                kv.put(f"k{i}", -1)
                kv.delete(f"k{i + 50}")
            kv.flush()
            s.changelog("kv").flush()
        with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
            assert s.checkpoint.input_position == 3
            assert s.last_restore["kv"].records > 0
            assert dump(s) == model
        with TaskStorage(Config.from_dict(values)) as s:  # the first machine, local state kept
            assert dump(s) == model

    def test_a_zombie_instance_is_fenced(self, job_values, tmp_path):
        values = self.task_values(job_values, tmp_path)
        a = TaskStorage(Config.from_dict(values))
        a.store("kv").put("x", 1)
        a.commit(input_position=1)
        a.store("kv").put("x", 2)
        if self.fenced_match is None:  # one writer at a time: the newcomer is refused
            with pytest.raises(StoreLockedError):
                TaskStorage(on_another_machine(values, tmp_path, "machine-b"))
            a.commit(input_position=2)
            a.close()
            with TaskStorage(on_another_machine(values, tmp_path, "machine-c")) as c:
                assert c.store("kv").get("x") == 2 and c.checkpoint.input_position == 2
            return
        b = TaskStorage(on_another_machine(values, tmp_path, "machine-b"))  # takes over the task
        with pytest.raises(FencedError, match=self.fenced_match):
            a.commit(input_position=2)
        a.close()
        assert b.store("kv").get("x") == 1
        b.store("kv").put("x", 3)
        b.commit(input_position=2)
        b.close()
        with TaskStorage(on_another_machine(values, tmp_path, "machine-c")) as c:
            assert c.store("kv").get("x") == 3 and c.checkpoint.input_position == 2

    # -- damage and zombies: hooks the subclass fills --------------------------------------------
    def lose_newest_checkpoint(self, values: dict[str, Any]) -> None:
        """Delete or lose the newest checkpoint of task 0 of the job ``values`` configure,
        as an operator, a lost disk or a lost bucket version would (the file log: the
        ``.ckpt`` file; objectstore: the newest object under the task's checkpoint prefix;
        Kafka: the checkpoint topic). Every system must say how."""
        raise NotImplementedError("override lose_newest_checkpoint: how the newest checkpoint is lost on this system")

    def zombie_late_writes(self, zombie: TaskStorage, values: dict[str, Any]) -> None:
        """Land what a fenced instance ``zombie`` can still write after the newer owner
        committed (its uploads, a roll-up of everything it wrote that a check could not
        stop, its deletes). Default: nothing (the system refuses every write of a fenced
        instance, as Kafka's broker does)."""

    def storage_snapshot(self, values: dict[str, Any]) -> Any:
        """Everything the system stores for the job ``values`` configure (names, sizes,
        contents or end offsets), compared before and after reads that must write
        nothing. Default None: not compared (the concurrent part of the case still runs)."""
        return None

    # -- damage and zombies: the cases -------------------------------------------------------------
    def test_newest_checkpoint_lost_is_an_error_not_a_rollback(self, job_values, tmp_path):
        """A lost newest checkpoint is damage: every open (the old machine, a new one) is an
        error naming a recovery command, ``verify`` reports it, and nothing committed is
        deleted: keeping the log's records (``accept_log_end``) still finds the lost commit."""
        from localstate.storage import Recovery
        from localstate.verify import verify_job

        values = self.task_values(job_values, tmp_path)
        with TaskStorage(Config.from_dict(values)) as s:
            for i in range(1, 8):
                s.store("kv").put("x", i)
                s.store("kv").put(f"k{i}", i)
                s.commit(input_position=i)
        self.lose_newest_checkpoint(values)
        for machine in ("state", "machine-b"):  # the old machine's state dir, and an empty one
            with pytest.raises(CorruptionError, match=r"localstate restore"):
                TaskStorage(on_another_machine(values, tmp_path, machine))
        problems = [p for c in verify_job(Config.from_dict(values), [0]) for p in c.problems]
        assert problems, "verify found nothing wrong after the newest checkpoint was lost"
        with TaskStorage(on_another_machine(values, tmp_path, "machine-c"),
                         recovery=Recovery(accept_log_end={"kv"})) as s:
            state = dump(s)
            assert state == {"x": 7, **{f"k{i}": i for i in range(1, 8)}}, f"the lost commit's records were deleted: {state}"

    def test_a_fenced_writers_late_upload_and_roll_up_change_nothing(self, job_values, tmp_path):
        """A takes 15 commits (an objectstore writer's 16th upload is a roll-up at the
        default ``rollup.objects`` and at 4); B takes over; A, now a zombie, writes and
        commits (fenced) and lands whatever else it still can; B commits. A new instance
        sees exactly B's commit, and ``verify`` finds nothing wrong."""
        from localstate.verify import verify_job

        values = self.task_values(job_values, tmp_path)
        a = TaskStorage(Config.from_dict(values))
        model: dict[str, Any] = {}
        for i in range(1, 16):
            a.store("kv").put("x", f"a{i}")
            a.store("kv").put(f"k{i}", i)
            model.update({"x": f"a{i}", f"k{i}": i})
            a.commit(input_position=i)
        if self.fenced_match is None:  # one writer at a time: there is no zombie
            with pytest.raises(StoreLockedError):
                TaskStorage(on_another_machine(values, tmp_path, "machine-b"))
            a.close()
            b = TaskStorage(on_another_machine(values, tmp_path, "machine-b"))
        else:
            b = TaskStorage(on_another_machine(values, tmp_path, "machine-b"))
            a.store("kv").put("x", "zombie")
            a.store("kv").put("z", "zombie")
            with pytest.raises(FencedError, match=self.fenced_match):
                a.commit(input_position=99)
        try:
            assert dump(b) == model
            b.store("kv").put("x", "b")
            b.store("kv").delete("k1")
            model["x"] = "b"
            del model["k1"]
            b.commit(input_position=100)
            if self.fenced_match is not None:
                self.zombie_late_writes(a, values)
        finally:
            a.close()
            b.close()
        with TaskStorage(on_another_machine(values, tmp_path, "machine-c")) as c:
            assert c.checkpoint.input_position == 100
            state = dump(c)
            assert state == model, f"the new owner's commit is not what a new instance sees: {state} != {model}"
        problems = [p for check in verify_job(Config.from_dict(values), [0]) for p in check.problems]
        assert problems == [], problems

    def test_a_reader_beside_a_committing_writer_writes_nothing(self, job_values, tmp_path):
        """State queries (``StateReader.get``/``store``, ``read_committed``: what ``localstate
        get`` and ``dump`` run) in a loop beside a task that keeps committing: the task never
        fails, every read is one whole commit, and reads alone change nothing stored."""
        values = self.task_values(job_values, tmp_path)
        config = Config.from_dict(values)
        commits = 12
        first, done = threading.Event(), threading.Event()
        failures: list[BaseException] = []

        def write() -> None:
            try:
                with TaskStorage(config) as s:
                    for i in range(1, commits + 1):
                        s.store("kv").put("x", i)
                        s.store("kv").put(f"k{i % 4}", i)
                        s.commit(input_position=i)
                        first.set()
                        time.sleep(0.05)
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)
            finally:
                first.set()
                done.set()

        def committed(version: int) -> dict[str, int]:
            state = {"x": version}
            for i in range(1, version + 1):
                state[f"k{i % 4}"] = i
            return state

        writer = threading.Thread(target=write, name="conformance-writer")
        writer.start()
        reads = 0
        try:
            assert first.wait(120)
            while not done.is_set() or reads < 3:
                with StateReader(config, 0) as reader:
                    x = reader.get("kv", "x")
                    assert x == reader.loaded_versions["kv"], f"x = {x} read as of version {reader.loaded_versions}"
                    whole = dict(reader.store("kv"))
                    version = reader.loaded_versions["kv"]
                    assert whole == committed(version), f"{whole} was never committed (version {version})"
                reads += 1
                if done.is_set() and failures:
                    break
        finally:
            writer.join(120)
        assert not failures, f"the writer failed beside the reader: {failures[0]!r}"
        assert reads >= 3
        before = self.storage_snapshot(values)
        with StateReader(config, 0) as reader:
            assert reader.get("kv", "x") == commits
        assert dict((k, v) for _, k, v in read_committed(config, "kv")) == committed(commits)
        assert self.storage_snapshot(values) == before, "a reader changed what the system stores"
        with TaskStorage(config) as s:  # the task goes on where it stopped
            assert s.checkpoint.input_position == commits


    # -- the stream or the whole changelog system lost -----------------------------------------
    def lose_stream(self, values: dict[str, Any], stream: str) -> None:
        """Hook: delete the changelog stream ``stream`` of the job configured by ``values``
        (its checkpoints stay), as an operator or a broker that lost its data would: a
        Kafka topic, the file log's stream directory, the objects under the stream's prefix."""
        raise NotImplementedError(f"{type(self).__name__} must implement lose_stream(values, stream)")

    def lose_everything(self, values: dict[str, Any]) -> None:
        """Hook: delete every changelog stream and checkpoint of the job configured by
        ``values``: every topic of a wiped cluster (or ``bootstrap.servers`` pointing at an
        empty one), the file log's directory, the bucket prefix."""
        raise NotImplementedError(f"{type(self).__name__} must implement lose_everything(values)")

    @pytest.mark.parametrize("factory", [f for f in ("memory", "rocksdb") if f in KV_ENGINES])
    @pytest.mark.parametrize("lost", ["stream", "everything"])
    def test_a_lost_stream_or_system_is_an_error_where_evidence_of_a_commit_exists(
        self, job_values, tmp_path, lost, factory
    ):
        """A committed task whose changelog stream, or whose every stream and checkpoint,
        is gone, reopened where its state dir is: a CorruptionError naming the recovery,
        twice (nothing was changed, no local file deleted), never a silently empty task.
        The recovery it names starts the task over, empty."""
        values = self.task_values(job_values, tmp_path, factory)
        with TaskStorage(Config.from_dict(values)) as s:
            for i in range(30):
                s.store("kv").put(f"k{i}", i)
            s.commit(input_position=1)
        if lost == "stream":
            self.lose_stream(values, values["stores.kv.changelog"].split(".", 1)[1])
        else:
            self.lose_everything(values)
        state = Path(values["job.state.dir"])
        local = local_files(state)
        for _ in range(2):
            with pytest.raises(CorruptionError, match=r"committed.*--reset (STORE|kv)") as info:
                TaskStorage(Config.from_dict(values))
            if lost == "everything":  # refused before any store is opened: not a byte changed
                assert local_files(state) == local
                assert str(state) in str(info.value)  # names what it found
            else:  # refused by the store's open (an engine may rewrite its own files), nothing deleted
                now, copy = local_files(state), f"{values['job.name']}/kv/"
                assert {p for p in local if not p.startswith(copy)} <= set(now)
                assert any(p.startswith(copy) for p in now) == any(p.startswith(copy) for p in local)
        with TaskStorage(Config.from_dict(values), recovery=Recovery(reset={"kv"})) as s:
            assert dump(s) == {}
            s.store("kv").put("after", 1)
            s.commit(input_position=2)
        with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
            assert dump(s) == {"after": 1} and s.checkpoint.input_position == 2

    # -- engine snapshots shipped with the changelog ---------------------------------------------
    def ship_snapshots(self, values: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
        """Hook: the config keys that make the system ship engine snapshots (the file and
        objectstore changelogs do by default: none). Kafka names a store here
        (``snapshots.path``)."""
        return {}

    def damage_shipped_snapshots(self, values: dict[str, Any]) -> int:
        """Hook: overwrite every shipped snapshot *file* (not the manifests) of the job
        with garbage of the same size, as bit rot or a bad copy would; return how many."""
        raise NotImplementedError(f"{type(self).__name__} must implement damage_shipped_snapshots(values)")

    def _moved_task(self, job_values: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], dict[str, int], int]:
        """A rocksdb task with small snapshot intervals, committed 8 times (overwrites and
        deletes): its values, the committed model and how many records it logged."""
        if "rocksdb" not in KV_ENGINES:
            pytest.skip("rocksdb is not installed")
        values = self.task_values(job_values, tmp_path, "rocksdb")
        values.update(self.ship_snapshots(values, tmp_path))
        values[_INTERVAL] = _SHIP_INTERVAL
        rng = random.Random(11)
        model: dict[str, int] = {}
        with TaskStorage(Config.from_dict(values)) as s:
            kv = s.store("kv")
            for batch in range(8):
                for _ in range(_SHIP_BATCH):
                    k = f"k{rng.randrange(400)}"
                    if rng.random() < 0.1:
                        kv.delete(k)
                        model.pop(k, None)
                    else:
                        kv.put(k, batch)
                        model[k] = batch
                s.commit(input_position=batch)
            logged = s.committed_offset("kv")
        assert logged is not None
        return values, model, logged

    def test_a_moved_task_replays_only_past_the_newest_shipped_snapshot(self, job_values, tmp_path):
        """A task's first open on a machine without its state (a move, a lost executor)
        fetches the newest shipped snapshot and replays at most one snapshot interval and
        one commit of the changelog, not its history; the state is the last commit."""
        values, model, logged = self._moved_task(job_values, tmp_path)
        with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
            replayed = s.last_restore["kv"].records
            assert dump(s) == model
        assert replayed <= _SHIP_INTERVAL + _SHIP_BATCH < logged, (replayed, logged)

    def test_damaged_shipped_snapshots_fall_back_to_an_exact_restore(self, job_values, tmp_path):
        """Every shipped snapshot file damaged: the moved task's open skips them (size and
        CRC32 checked) and replays the whole changelog; the state is still the last commit,
        and the task commits on from there."""
        values, model, _ = self._moved_task(job_values, tmp_path)
        assert self.damage_shipped_snapshots(values) > 0
        with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
            assert s.last_restore["kv"].start_offset == 0  # the whole changelog replayed
            assert dump(s) == model
            s.store("kv").put("after", 1)
            s.commit(input_position=99)
        with TaskStorage(on_another_machine(values, tmp_path, "machine-c")) as s:
            assert dump(s) == {**model, "after": 1}
