"""``localstate.rescale``: re-partitioning a stopped job's committed state, without
Spark — every splittable engine, every refusal (which must change nothing on disk),
the uncommitted tail, and real crashes (SIGKILL at the rescale's fault points) in the
middle. The end-to-end proof on Spark is in tests/test_rescale_spark.py."""

from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner
from localstate import (
    ChangelogError,
    Config,
    ConfigError,
    InvalidValueError,
    LocalStateError,
    StoreLockedError,
    TaskStorage,
    register_engine,
)
from localstate.cli import cli
from localstate.engines.memory import MemoryEngineFactory
from localstate.partitioning import task_for
from localstate.rescale import rescale, update_config_file
from localstate.testing.rescale_jobs import (
    USERS,
    expected,
    job_values,
    rescale_in_child,
    run_tasks,
    seeded_job,
    state_of,
    tree_digest,
)


@pytest.mark.parametrize("factory", ["memory", "rocksdb", "leveldb"])
@pytest.mark.parametrize("to", [6, 3, 1])
def test_rescale_moves_every_key_to_the_task_its_rows_go_to(tmp_path, factory, to):
    config = seeded_job(tmp_path, factory)
    # An uncommitted tail in every old task (a crashed attempt): never part of the rescaled state.
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("counts")["user-0"] = {"n": -1}
            storage.store("counts")["ghost"] = {"n": -1}
            storage.store("counts").flush()
            storage.changelog("counts").flush()
    result = rescale(config, to)
    assert (result.from_partitions, result.to_partitions, result.version) == (4, to, 1)
    assert result.records == {"counts": 150}
    new = result.config
    assert new.partitions == to
    assert state_of(new) == expected(to)
    for q in range(to):
        with TaskStorage(new, q) as storage:
            assert storage.checkpoint.version == 1 and storage.checkpoint.input_position == "same"
    # The job runs on at the new count; the old count is refused by the changelog.
    run_tasks(new, {"user-1": {"n": 1000}}, version=2)
    assert state_of(new)[task_for("user-1", to)]["user-1"] == {"n": 1000}
    with pytest.raises(ChangelogError, match=f"has {to} partitions but the job has job.partitions = 4"):
        TaskStorage(config, 0)
    assert not (tmp_path / "changelog" / "_rescale").exists()


def test_rescale_equals_a_job_run_at_the_new_count_from_the_start(tmp_path):
    rescaled = seeded_job(tmp_path / "a")
    direct = seeded_job(tmp_path / "b", partitions=6)
    new = rescale(rescaled, 6).config
    more = {u: {"n": 7} for u in USERS[100:180]}
    run_tasks(new, more, version=2)
    run_tasks(direct, more, version=2)
    assert state_of(new) == state_of(direct)


def test_tuple_keys_route_by_the_named_element(tmp_path):
    values = job_values(tmp_path, **{"stores.counts.key.serde": "tuple", "stores.counts.rescale.key": "key[1]"})
    config = Config.from_dict(values)
    for p in range(4):
        with TaskStorage(config, p) as storage:
            for hour in (0, 3600):
                for u in USERS:
                    if task_for(u, 4) == p:
                        storage.store("counts")[(hour, u)] = {"n": hour}
            storage.commit("pos")
    new = rescale(config, 5).config
    for q, items in state_of(new).items():
        assert items and all(task_for(u, 5) == q for (_, u) in items)
    assert sum(len(v) for v in state_of(new).values()) == 2 * len(USERS)


def test_hyperloglog_sketches_move_with_their_key(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.counts.factory": "hyperloglog"})
    pages = [f"page-{i}" for i in range(40)]
    for p in range(4):
        with TaskStorage(config, p) as storage:
            hll = storage.store("counts")
            for i, page in enumerate(pages):
                if task_for(page, 4) == p:
                    hll.add_all(page, [f"viewer-{j}" for j in range(i * 5)])
            storage.commit("pos")
    before = {}
    for p in range(4):
        with TaskStorage(config, p) as storage:
            before.update({k: storage.store("counts").registers(k).tolist() for k in storage.store("counts").keys()})
    new = rescale(config, 7).config
    after = {}
    for q in range(7):
        with TaskStorage(new, q) as storage:
            hll = storage.store("counts")
            for k in hll.keys():
                assert task_for(k, 7) == q
                after[k] = hll.registers(k).tolist()
    assert after == before and len(after) == 39  # page-0 saw no viewer


def test_a_single_bloom_filter_per_task_merges_by_or_on_scale_down_to_a_divisor(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.counts.factory": "bloom",
                               "stores.counts.bloom.capacity": 10_000})
    items = [f"url-{i}" for i in range(2_000)]
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("counts").add_all([x for x in items if task_for(x, 4) == p])
            storage.commit("pos")
    with pytest.raises(ConfigError, match="only when N divides the old count"):
        rescale(config, 3)
    new = rescale(config, 2).config
    for q in range(2):
        with TaskStorage(new, q) as storage:
            mine = [x for x in items if task_for(x, 2) == q]
            assert storage.store("counts").might_contain_all(mine).all()


def test_topn_is_refused_with_the_reason(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.top.factory": "topn", "stores.top.key.serde": "string"})
    run_tasks(config, {"a": 1})
    digest = tree_digest(tmp_path)
    with pytest.raises(ConfigError, match="store 'top' .topn. cannot be rescaled: a topn store keeps one heap"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest


# -- refusals: each changes nothing on disk ------------------------------------------------------------
@pytest.mark.parametrize("to,match", [
    (0, "must be an int >= 1, got 0"), (-2, "must be an int >= 1, got -2"), (2.5, "got 2.5 .float."),
    (True, "got True .bool."), ("6", "got '6' .str."), (4, "already has 4 partitions"),
])
def test_invalid_targets_are_refused(tmp_path, to, match):
    config = seeded_job(tmp_path)
    digest = tree_digest(tmp_path)
    with pytest.raises(InvalidValueError, match=match):
        rescale(config, to)
    assert tree_digest(tmp_path) == digest


def test_a_running_task_is_refused(tmp_path):
    config = seeded_job(tmp_path)
    digest = tree_digest(tmp_path)
    with TaskStorage(config, 2):
        with pytest.raises(StoreLockedError, match="cannot rescale job 'clicks' while it runs: task clicks/partition 2"):
            rescale(config, 6)
    assert tree_digest(tmp_path) == digest
    assert rescale(config, 6).to_partitions == 6  # the locks were all released


def test_tasks_at_different_commits_are_refused(tmp_path):
    config = seeded_job(tmp_path)
    with TaskStorage(config, 1) as storage:
        storage.commit("same", version=2)
    digest = tree_digest(tmp_path)
    with pytest.raises(LocalStateError, match=r"not at one commit .committed versions per partition: \{0: 1, 1: 2"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest


def test_a_task_that_never_committed_is_refused(tmp_path):
    config = Config.from_dict(job_values(tmp_path))
    for p in (0, 1, 3):
        with TaskStorage(config, p) as storage:
            storage.commit("same", version=0)
    with pytest.raises(LocalStateError, match=r"\{0: 0, 1: 0, 2: None, 3: 0\}"):
        rescale(config, 6)


def test_nothing_committed_is_refused(tmp_path):
    config = Config.from_dict(job_values(tmp_path))
    with pytest.raises(LocalStateError, match="has no committed state"):
        rescale(config, 6)


def test_different_input_positions_need_an_explicit_one(tmp_path):
    config = Config.from_dict(job_values(tmp_path))
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.commit({"offset": p}, version=0)
    digest = tree_digest(tmp_path)
    with pytest.raises(LocalStateError, match=r"input positions differ \(0: \{\"offset\": 0\}"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest
    with pytest.raises(InvalidValueError, match="checkpoint keys are strings"):
        rescale(config, 6, input_position={1: "x"})
    assert tree_digest(tmp_path) == digest
    new = rescale(config, 6, input_position=lambda version, old: {"offset": max(v["offset"] for v in old.values())})
    with TaskStorage(new.config, 5) as storage:
        assert storage.checkpoint.input_position == {"offset": 3}


def test_a_task_level_store_is_refused(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.clock.factory": "memory",
                               "stores.clock.key.serde": "string", "stores.clock.msg.serde": "long"})
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("clock")["watermark"] = 100 + p
            storage.commit("same", version=0)
    digest = tree_digest(tmp_path)
    with pytest.raises(ConfigError, match="store 'clock': key 'watermark' is held by old task .* not partitioned by"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest


def test_one_old_task_needs_the_key_mapping_said(tmp_path):
    config = seeded_job(tmp_path, partitions=1)
    with pytest.raises(ConfigError, match="with one old task nothing shows"):
        rescale(config, 3)
    config = config.with_overrides({"stores.counts.rescale.key": "key"})
    assert state_of(rescale(config, np.int64(3)).config) == expected(3)  # numpy ints are ints


@pytest.mark.parametrize("bad", ["key[x]", "value", "key[1]"])
def test_a_bad_rescale_key_is_refused(tmp_path, bad):
    config = seeded_job(tmp_path, **{"stores.counts.rescale.key": bad})
    with pytest.raises(ConfigError, match="stores.counts.rescale.key"):
        rescale(config, 6)


def test_keys_of_the_wrong_type_are_refused(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.counts.key.serde": "json"})
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("counts")[[p, "list"]] = 1
            storage.commit("same", version=0)
    with pytest.raises(InvalidValueError, match="store 'counts' partition 0: key .*cannot route key"):
        rescale(config, 6)


def test_an_unlogged_store_is_refused(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.local.factory": "memory",
                               "stores.local.changelog": "none"})
    with pytest.raises(ConfigError, match=r"store\(s\) \['local'\] have no changelog"):
        rescale(config, 6)


def test_a_store_dropped_from_the_config_is_refused(tmp_path):
    config = seeded_job(tmp_path)
    smaller = Config.from_dict({k: v for k, v in config.to_dict().items() if not k.startswith("stores.")}
                               | {"stores.other.factory": "memory"})
    with pytest.raises(ConfigError, match=r"store\(s\) \['counts'\] that the config no longer has"):
        rescale(smaller, 6)


def test_a_changed_serde_is_refused(tmp_path):
    config = seeded_job(tmp_path)
    with pytest.raises(ConfigError, match="was committed with .*msgpack"):
        rescale(config.with_overrides({"stores.counts.msg.serde": "msgpack"}), 6)


def test_a_lost_committed_record_is_refused(tmp_path):
    config = seeded_job(tmp_path)
    for seg in (tmp_path / "changelog" / "clicks-counts" / "1").glob("*.log"):
        seg.write_bytes(b"")
    with pytest.raises(LocalStateError, match="committed records are missing"):
        rescale(config, 6)
    assert not (tmp_path / "changelog" / "_rescale").exists() or not (
        tmp_path / "changelog" / "_rescale" / "clicks" / "manifest.json").exists()


# -- crashes in the middle (real SIGKILL at the rescale's fault points) --------------------------------
@pytest.mark.parametrize("fault", ["rescale.staging=kill", "rescale.before_manifest=kill"])
def test_a_crash_before_the_manifest_leaves_the_old_job_intact(tmp_path, fault):
    config = seeded_job(tmp_path)
    before = state_of(config)
    assert rescale_in_child(tmp_path, 6, fault) == -9
    assert (tmp_path / "changelog" / "_rescale" / "clicks" / "new").exists()
    assert state_of(config) == before
    # The old job may even run on; the re-run discards the half-written staging area.
    run_tasks(config, {"user-3": {"n": 33}}, version=2)
    new = rescale(config, 6).config
    want = expected(6)
    want[task_for("user-3", 6)]["user-3"] = {"n": 33}
    assert state_of(new) == want


@pytest.mark.parametrize("fault", ["rescale.after_manifest=kill", "rescale.swap=kill", "rescale.swap=kill@2",
                                   "rescale.after_swap=kill"])
def test_a_crash_after_the_manifest_is_finished_by_a_re_run(tmp_path, fault):
    config = seeded_job(tmp_path)
    assert rescale_in_child(tmp_path, 6, fault) == -9
    assert (tmp_path / "changelog" / "_rescale" / "clicks" / "manifest.json").exists()
    result = rescale(config, 6)
    assert state_of(result.config) == expected(6)
    assert not (tmp_path / "changelog" / "_rescale").exists()
    with pytest.raises(ChangelogError, match="has 6 partitions but the job has job.partitions = 4: rescale from"):
        rescale(config, 5)


def test_the_old_job_committing_after_the_manifest_is_restaged_not_lost(tmp_path):
    config = seeded_job(tmp_path)
    assert rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
    run_tasks(config, {"user-4": {"n": 44}}, version=2)  # the swap had not begun: the old job still runs
    new = rescale(config, 6).config
    want = expected(6)
    want[task_for("user-4", 6)]["user-4"] = {"n": 44}
    assert state_of(new) == want


# -- the command line ------------------------------------------------------------------------------------
def test_cli_rescales_and_updates_the_config_file(tmp_path):
    config = seeded_job(tmp_path)
    toml = tmp_path / "job.toml"
    toml.write_text(textwrap.dedent(f"""
        [job]
        name = "clicks"
        "state.dir" = "{tmp_path / 'state'}"
        partitions = 4   # tasks

        [systems.file]
        path = "{tmp_path / 'changelog'}"

        [stores.counts]
        factory = "memory"
        "key.serde" = "string"
        "msg.serde" = "json"
    """))
    assert Config.load(toml).to_dict() == {k: v for k, v in config.to_dict().items()}
    runner = CliRunner()
    out = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "2.5"])
    assert out.exit_code == 2 and "'2.5' is not a valid integer" in out.output
    out = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "6"])
    assert out.exit_code == 0, out.output
    assert "rescaled from 4 to 6 partitions at version 1" in out.output
    assert Config.load(toml).partitions == 6 and "partitions = 6   # tasks" in toml.read_text()
    assert state_of(Config.load(toml)) == expected(6)
    out = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "6"])  # a re-run says it is done
    assert out.exit_code == 0 and "already at 6 partitions" in out.output


def test_config_file_update_for_properties_and_an_unusual_layout(tmp_path):
    props = tmp_path / "job.properties"
    props.write_text("job.name = x\nstores.a.factory = memory\n")
    update_config_file(props, 3)
    assert Config.load(props).partitions == 3
    table = tmp_path / "table.toml"  # a [job] table without partitions: the line goes under it
    table.write_text('[job]\nname = "x"\n[stores.a]\nfactory = "memory"\n')
    update_config_file(table, 5)
    assert table.read_text() == '[job]\npartitions = 5\nname = "x"\n[stores.a]\nfactory = "memory"\n'
    odd = tmp_path / "odd.toml"
    odd.write_text('job = { name = "x" }\n[stores.a]\nfactory = "memory"\n')
    with pytest.raises(ConfigError, match=r"write partitions = 5 in its \[job\] table .* by hand"):
        update_config_file(odd, 5)
    assert odd.read_text() == 'job = { name = "x" }\n[stores.a]\nfactory = "memory"\n'


def test_search_documents_move_with_their_id(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.counts.factory": "search",
                               "stores.counts.search.fields": "name:text:stored, city:string:stored"})
    for p in range(4):
        with TaskStorage(config, p) as storage:
            index = storage.store("counts")
            index.index_all([(u, {"name": f"name {u}", "city": "oslo"}) for u in USERS if task_for(u, 4) == p])
            index.delete("user-7") if task_for("user-7", 4) == p else None
            storage.commit("pos")
    new = rescale(config, 6).config
    found = {}
    for q in range(6):
        with TaskStorage(new, q) as storage:
            docs = storage.store("counts").documents()
            assert all(task_for(u, 6) == q for u in docs)
            found.update(docs)
    assert found == {u: {"name": f"name {u}", "city": "oslo"} for u in USERS if u != "user-7"}


@pytest.mark.parametrize("to", [6, 1])
def test_an_unreachable_local_copy_of_an_old_task_is_never_loaded(tmp_path, to):
    """A RocksDB local copy rescale cannot delete (another machine's disk, simulated by
    putting it back afterwards) holds old task 0's keys with snapshots tagged with old
    offsets: new task 0 must rebuild from the new changelog instead. (At ``to=1`` the
    new log is longer than the old one, so the old snapshots are at offsets below its
    end: only the compaction horizon rescale records keeps them out.)"""
    config = seeded_job(tmp_path, "rocksdb")
    local = tmp_path / "state" / "clicks" / "counts" / "0"
    aside = tmp_path / "elsewhere"
    shutil.copytree(local, aside)
    new = rescale(config, to).config
    assert not local.exists()
    shutil.copytree(aside, local)
    assert state_of(new) == expected(to)


def test_local_copies_in_every_executor_directory_are_deleted(tmp_path):
    config = seeded_job(tmp_path, **{"job.state.dir": str(tmp_path / "exec-{executor}")})
    for executor in ("1", "2"):
        copy = tmp_path / f"exec-{executor}" / "clicks" / "counts" / "0"
        copy.mkdir(parents=True)
        (copy / "data").write_text("old keys")
    rescale(config, 6)
    assert not list(tmp_path.glob("exec-*/clicks/counts/*"))


def test_state_in_two_changelog_systems_is_refused(tmp_path):
    config = Config.from_dict({**job_values(tmp_path), "stores.counts.changelog": "kafka.counts",
                               "job.checkpoint.system": "file", "systems.kafka.bootstrap.servers": "127.0.0.1:9"})
    with pytest.raises(ConfigError, match=r"several changelog systems \(\['file', 'kafka'\]\)"):
        rescale(config, 6)


def test_cli_input_positions(tmp_path):
    config = Config.from_dict(job_values(tmp_path))
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.commit({"offset": p}, version=3)
    props = tmp_path / "job.properties"
    props.write_text("".join(f"{k} = {v}\n" for k, v in job_values(tmp_path).items()))
    runner = CliRunner()
    out = runner.invoke(cli, ["rescale", "-c", str(props), "--to", "2", "--input-position", "{offset: 1"])
    assert out.exit_code == 2 and "is not JSON" in out.output
    out = runner.invoke(cli, ["rescale", "-c", str(props), "--to", "2", "--input-position", "1", "--spark-runner"])
    assert out.exit_code == 2 and "not both" in out.output
    out = runner.invoke(cli, ["rescale", "-c", str(props), "--to", "2"])
    assert out.exit_code == 1 and "input positions differ" in out.output
    assert Config.load(props).partitions == 4
    out = runner.invoke(cli, ["rescale", "-c", str(props), "--to", "2", "--spark-runner"])
    assert out.exit_code == 0, out.output
    new = Config.load(props)
    assert new.partitions == 2
    with TaskStorage(new, 1) as storage:
        assert storage.checkpoint.version == 3
        assert storage.checkpoint.input_position == {"batch_id": 3, "rows": 0, "rescaled_from": 4}


def test_a_plug_in_that_declares_its_layout_is_rescaled_and_one_that_does_not_is_refused(tmp_path):
    config = seeded_job(tmp_path / "a", "localstate.contrib.sqlite_engine:SQLiteEngineFactory")
    assert state_of(rescale(config, 6).config) == expected(6)

    class Undeclared(MemoryEngineFactory):
        """A plug-in that says nothing about how its records split."""

    register_engine("undeclared-rescale-test", Undeclared, clobber=True)
    config = seeded_job(tmp_path / "b", "undeclared-rescale-test")
    digest = tree_digest(tmp_path / "b")
    with pytest.raises(ConfigError, match="engine 'undeclared-rescale-test' does not say how its change records split"):
        rescale(config, 6)
    assert tree_digest(tmp_path / "b") == digest


def test_a_pending_rescale_to_another_count_must_be_finished_first(tmp_path):
    config = seeded_job(tmp_path)
    assert rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
    with pytest.raises(LocalStateError, match="an earlier rescale from 4 to 6 partitions was committed but not "
                                              "finished .*finish it first with --to 6"):
        rescale(config, 3)
    assert state_of(rescale(config, 6).config) == expected(6)


def test_an_unreadable_manifest_is_an_error_naming_it(tmp_path):
    config = seeded_job(tmp_path)
    assert rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
    manifest = tmp_path / "changelog" / "_rescale" / "clicks" / "manifest.json"
    manifest.write_bytes(b"{not json")
    digest = tree_digest(tmp_path)
    with pytest.raises(LocalStateError, match=f"{manifest} is unreadable"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest


@pytest.mark.parametrize("factory", ["memory", "rocksdb"])
def test_an_empty_store_and_empty_new_tasks_open_and_commit(tmp_path, factory):
    config = Config.from_dict({**job_values(tmp_path, factory), "stores.empty.factory": factory})
    run_tasks(config, {"user-1": {"n": 1}}, version=0)
    new = rescale(config, 5).config
    for round_ in range(2):  # open, commit, reopen: empty new partitions
        for q in range(5):
            with TaskStorage(new, q) as storage:
                with storage.store("empty").all() as items:
                    assert list(items) == []
                with storage.store("counts").all() as items:
                    assert dict(items) == ({"user-1": {"n": 1}} if task_for("user-1", 5) == q else {})
                storage.commit("same", version=1 + round_)


def test_a_corrupt_old_checkpoint_or_stream_file_is_refused_naming_it(tmp_path):
    config = seeded_job(tmp_path)
    ckpt = tmp_path / "changelog" / "_checkpoints" / "clicks" / "partition-2.ckpt"
    good = ckpt.read_bytes()
    ckpt.write_bytes(good[:-3])
    digest = tree_digest(tmp_path)
    with pytest.raises(LocalStateError, match=f"checkpoint {ckpt} is corrupt"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest
    ckpt.write_bytes(good)
    meta = tmp_path / "changelog" / "clicks-counts" / "stream.json"
    meta.write_text("{partitions")
    digest = tree_digest(tmp_path)
    with pytest.raises(LocalStateError, match=f"{meta} is corrupt"):
        rescale(config, 6)
    assert tree_digest(tmp_path) == digest


@pytest.mark.parametrize("to", [6, 2])
def test_the_event_time_clock_carries_over_at_the_latest_old_task(tmp_path, to):
    """Event-time TTL and timers run on the task's committed clock: after a rescale each new
    task resumes at the latest clock of the old tasks (none restarts from nothing, none runs
    behind the task that held its keys), so an entry expired before the rescale stays expired."""
    values = job_values(tmp_path, **{"stores.counts.ttl.ms": 1000, "stores.counts.ttl.time": "event"})
    config = Config.from_dict(values)
    clocks = [5_000, 9_000, 7_000, 8_000]
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.advance_event_time(clocks[p] - 2_000)
            for i in range(20):
                storage.store("counts").put(f"user-{p}-{i}", i)  # expire at clocks[p] - 1_000
            storage.advance_event_time(clocks[p])
            storage.commit({"offset": p}, version=3)
    result = rescale(config, to, input_position={"offset": 0})
    for q in range(to):
        with TaskStorage(result.config, q) as storage:
            assert storage.event_time == max(clocks)
            with storage.store("counts").all() as it:
                assert list(it) == []  # expired before the rescale, still invisible
