"""``localstate.rescale``: re-partitioning a stopped job's committed state, without
Spark — every splittable engine, every refusal (which must change nothing on disk),
the uncommitted tail, and real crashes (SIGKILL at the rescale's fault points) in the
middle. The end-to-end proof on Spark is in tests/test_rescale_spark.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from localstate import (
    ChangelogError,
    Config,
    ConfigError,
    CorruptionError,
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
from localstate.storage import Recovery

USERS = [f"user-{i}" for i in range(200)]


def job_values(root: Path, factory: str = "memory", partitions: int = 4, **extra: Any) -> dict[str, Any]:
    values = {
        "job.name": "clicks",
        "job.state.dir": str(root / "state"),
        "job.partitions": partitions,
        "systems.file.path": str(root / "changelog"),
        "stores.counts.factory": factory,
        "stores.counts.key.serde": "string",
        "stores.counts.msg.serde": "json",
    }
    values.update(extra)
    return values


def run_tasks(config: Config, updates: dict[str, Any], *, version: int | None = None,
              position: Any = "same", deletes: tuple[str, ...] = ()) -> None:
    """Apply ``updates`` (key -> value) and ``deletes`` in the tasks the keys route to, and commit every task."""
    n = config.partitions
    for p in range(n):
        with TaskStorage(config, p) as storage:
            counts = storage.store("counts")
            for k, v in updates.items():
                if task_for(k, n) == p:
                    counts[k] = v
            for k in deletes:
                if task_for(k, n) == p and k in counts:
                    del counts[k]
            storage.commit(position, version=version)


def state_of(config: Config, store: str = "counts") -> dict[int, dict[str, Any]]:
    out = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage:
            with storage.store(store).all() as items:
                out[p] = dict(items)
    return out


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (lock files aside) and its content hash: 'nothing changed'."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != ".lock" and not f.name.endswith(".lock")}


def seeded_job(tmp_path: Path, factory: str = "memory", **extra: Any) -> Config:
    config = Config.from_dict(job_values(tmp_path, factory, **extra))
    run_tasks(config, {u: {"n": i} for i, u in enumerate(USERS)}, version=0)
    run_tasks(config, {u: {"n": i * 10} for i, u in enumerate(USERS[:50])}, version=1, deletes=tuple(USERS[150:]))
    return config


def expected(n: int) -> dict[int, dict[str, Any]]:
    want: dict[int, dict[str, Any]] = {q: {} for q in range(n)}
    for i, u in enumerate(USERS[:150]):
        want[task_for(u, n)][u] = {"n": i * 10 if i < 50 else i}
    return want


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
def _rescale_in_child(root: Path, to: int, fault: str, values: dict[str, Any] | None = None) -> int:
    code = textwrap.dedent(f"""
        import json, sys
        from localstate import Config
        from localstate.rescale import rescale
        rescale(Config.from_dict(json.loads(sys.argv[1])), {to})
    """)
    env = {**os.environ, "LOCALSTATE_FAULTS": fault}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(values or job_values(root))], env=env,
                          capture_output=True, timeout=120)
    return proc.returncode


@pytest.mark.parametrize("fault", ["rescale.staging=kill", "rescale.before_manifest=kill"])
def test_a_crash_before_the_manifest_leaves_the_old_job_intact(tmp_path, fault):
    config = seeded_job(tmp_path)
    before = state_of(config)
    assert _rescale_in_child(tmp_path, 6, fault) == -9
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
    assert _rescale_in_child(tmp_path, 6, fault) == -9
    assert (tmp_path / "changelog" / "_rescale" / "clicks" / "manifest.json").exists()
    result = rescale(config, 6)
    assert state_of(result.config) == expected(6)
    assert not (tmp_path / "changelog" / "_rescale").exists()
    with pytest.raises(ChangelogError, match="has 6 partitions but the job has job.partitions = 4: rescale from"):
        rescale(config, 5)


def test_the_old_job_committing_after_the_manifest_is_restaged_not_lost(tmp_path):
    config = seeded_job(tmp_path)
    assert _rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
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
    out = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "6"])
    assert out.exit_code == 1 and "already has 6 partitions" in out.output


def test_config_file_update_for_properties_and_an_unusual_layout(tmp_path):
    props = tmp_path / "job.properties"
    props.write_text("job.name = x\nstores.a.factory = memory\n")
    update_config_file(props, 3)
    assert Config.load(props).partitions == 3
    odd = tmp_path / "odd.toml"
    odd.write_text('[job]\nname = "x"\n[stores.a]\nfactory = "memory"\n')
    with pytest.raises(ConfigError, match="edit the file by hand to job.partitions = 5"):
        update_config_file(odd, 5)
    assert odd.read_text() == '[job]\nname = "x"\n[stores.a]\nfactory = "memory"\n'


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
    assert _rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
    with pytest.raises(LocalStateError, match="an earlier rescale from 4 to 6 partitions was committed but not "
                                              "finished .*finish it first with --to 6"):
        rescale(config, 3)
    assert state_of(rescale(config, 6).config) == expected(6)


def test_an_unreadable_manifest_is_an_error_naming_it(tmp_path):
    config = seeded_job(tmp_path)
    assert _rescale_in_child(tmp_path, 6, "rescale.after_manifest=kill") == -9
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
    for round_ in range(2):  # open, commit, reopen: empty partitions behind a horizon past their end
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


# -- kafka and objectstore: the rescaled job is written as the next generation -------------------------
FAST_KAFKA = {"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 100}
FAST_S3 = {"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 20}


@pytest.fixture(params=["kafka", "objectstore"])
def remote(request) -> Any:
    """``remote(root, job)``: config values of a job whose state is in a kafka topic or an
    S3 bucket (moto), at 4 partitions. Each call: its own job, streams and checkpoint topic."""
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker")

        def system(job: str) -> dict[str, Any]:
            return {"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": bootstrap,
                    "systems.kafka.checkpoint.topic": f"{job}-checkpoints", "stores.counts.changelog": f"kafka.{job}-counts",
                    **{f"systems.kafka.{k}": v for k, v in FAST_KAFKA.items()}}
    else:
        from localstate.testing.s3 import objectstore_options

        server = request.getfixturevalue("s3_server")
        bucket = server.create_bucket()

        def system(job: str) -> dict[str, Any]:
            return {"job.changelog.system": "s3", **objectstore_options(server.endpoint, bucket, job, **FAST_S3),
                    "stores.counts.changelog": f"s3.{job}-counts"}

    def make(root: Path, partitions: int = 4, factory: str = "memory") -> dict[str, Any]:
        job = f"clicks-{os.urandom(4).hex()}"
        return {**job_values(root, factory, partitions), "job.name": job, **system(job)}

    make.kind = request.param  # type: ignore[attr-defined]
    return make


def seeded_values(values: dict[str, Any]) -> Config:
    config = Config.from_dict(values)
    run_tasks(config, {u: {"n": i} for i, u in enumerate(USERS)}, version=0)
    run_tasks(config, {u: {"n": i * 10} for i, u in enumerate(USERS[:50])}, version=1, deletes=tuple(USERS[150:]))
    return config


@pytest.mark.parametrize("to", [6, 3])
def test_kafka_and_objectstore_rescale_equals_a_job_run_at_the_new_count(tmp_path, remote, to):
    """The 4 -> 6 and 4 -> 3 proof of the file changelog on kafka and objectstore: rescaled
    (with an uncommitted tail in every old task), run on, and compared with a job run at
    the new count from the start; the old count is refused afterwards."""
    config = seeded_values(remote(tmp_path / "a"))
    for p in range(4):  # a crashed attempt's uncommitted tail: never part of the rescaled state
        with TaskStorage(config, p) as storage:
            storage.store("counts")["user-0"] = {"n": -1}
            storage.store("counts")["ghost"] = {"n": -1}
            storage.store("counts").flush()
            storage.changelog("counts").flush()
    direct = seeded_values(remote(tmp_path / "b", partitions=to))
    result = rescale(config, to)
    assert (result.from_partitions, result.to_partitions, result.version, result.records) == (4, to, 1, {"counts": 150})
    new = result.config
    assert state_of(new) == expected(to)
    more = {u: {"n": 7} for u in USERS[100:180]}
    run_tasks(new, more, version=2)
    run_tasks(direct, more, version=2)
    assert state_of(new) == state_of(direct)
    with TaskStorage(new, 0) as storage:
        assert storage.checkpoint.version == 2 and storage.changelog("counts").stream.endswith("-counts.gen1")
    with pytest.raises(ChangelogError, match=f"has {to} partition"):
        TaskStorage(config, 0)
    again = rescale(config, to)  # a re-run finds it done
    assert again.already_done and state_of(new) == state_of(direct)


def test_kafka_and_objectstore_rescale_back_and_a_stale_local_copy(tmp_path, remote):
    """Two rescales in a row (generation 2), with a local RocksDB copy of an old task put
    back after each (another machine's disk): never loaded for the new task."""
    config = seeded_values(remote(tmp_path, factory="rocksdb"))
    local = tmp_path / "state" / config.job_name / "counts" / "0"
    shutil.copytree(local, tmp_path / "elsewhere")
    six = rescale(config, 6).config
    shutil.copytree(tmp_path / "elsewhere", local)
    assert state_of(six) == expected(6)
    shutil.rmtree(tmp_path / "elsewhere")
    shutil.copytree(local, tmp_path / "elsewhere")
    two = rescale(six, 2).config
    shutil.copytree(tmp_path / "elsewhere", local, dirs_exist_ok=True)
    assert state_of(two) == expected(2)
    with TaskStorage(two, 1) as storage:
        assert storage.changelog("counts").stream.endswith("-counts.gen2")


@pytest.mark.parametrize("fault", ["rescale.staging=kill@3", "rescale.before_manifest=kill"])
def test_kafka_and_objectstore_kill_mid_rescale_leaves_the_old_job_intact(tmp_path, remote, fault):
    values = remote(tmp_path)
    config = seeded_values(values)
    before = state_of(config)
    assert _rescale_in_child(tmp_path, 6, fault, values) == -9
    assert state_of(config) == before  # the old job runs on, untouched
    run_tasks(config, {"user-3": {"n": 33}}, version=2)
    result = rescale(config, 6)  # the re-run skips the half-written generation
    want = expected(6)
    want[task_for("user-3", 6)]["user-3"] = {"n": 33}
    assert state_of(result.config) == want
    with TaskStorage(result.config, 0) as storage:
        assert storage.checkpoint.version == 2 and storage.changelog("counts").stream.endswith("-counts.gen2")


def test_kafka_and_objectstore_kill_after_the_switch_is_finished_by_a_re_run(tmp_path, remote):
    values = remote(tmp_path)
    config = seeded_values(values)
    assert _rescale_in_child(tmp_path, 3, "rescale.after_manifest=kill", values) == -9
    result = rescale(config, 3)
    assert result.already_done
    assert state_of(result.config) == expected(3)
    with pytest.raises(ChangelogError, match="rescaled to 3 partitions .* rescale from the count the state is at"):
        rescale(config, 5)


def test_kafka_and_objectstore_refusals_change_nothing(tmp_path, remote):
    config = seeded_values(remote(tmp_path))
    mine = next(u for u in USERS[:50] if task_for(u, 4) == 1)
    with TaskStorage(config, 1) as storage:  # task 1 one commit ahead
        storage.store("counts")[mine] = {"n": 5}
        storage.commit("same", version=2)
    with pytest.raises(LocalStateError, match="not at one commit"):
        rescale(config, 6)
    with pytest.raises(InvalidValueError, match="an int >= 1"):
        rescale(config, 2.0)
    with TaskStorage(config, 3):
        with pytest.raises(StoreLockedError, match=f"while it runs: task {config.job_name}/partition 3"):
            rescale(config, 6)
    with TaskStorage(config, 0) as storage:  # the old job is where it was
        assert storage.changelog("counts").stream == f"{config.job_name}-counts"
    run_tasks(config, {}, version=3)
    assert state_of(rescale(config, 6).config) == {
        q: {**want, **({mine: {"n": 5}} if task_for(mine, 6) == q else {})} for q, want in expected(6).items()}


# -- `localstate restore --reset STORE` with a local copy of the old state left elsewhere --------------
def test_reset_never_resurrects_a_local_copy_left_on_another_machine(tmp_path):
    """Machine B holds a RocksDB copy of the store at its last commit; the operator resets
    the store on machine A. When the task moves back to B, the copy must be discarded
    (before the fix the file and objectstore logs accepted a snapshot at the reset log's
    end, and replaying the empty log over it brought the whole state back)."""
    _reset_on_a_then_open_on_b(tmp_path, job_values(tmp_path, "rocksdb", 1))


def test_kafka_and_objectstore_reset_never_resurrects_a_local_copy(tmp_path, remote):
    _reset_on_a_then_open_on_b(tmp_path, remote(tmp_path, 1, "rocksdb"))


def _reset_on_a_then_open_on_b(tmp_path: Path, values: dict[str, Any]) -> None:
    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-a")})
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-b")})
    with TaskStorage(machine_b, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS})
        storage.commit("p1")
    with TaskStorage(machine_b, 0) as storage:  # a second commit with nothing new: snapshot at the end
        storage.commit("p2")
    with TaskStorage(machine_a, 0, recovery=Recovery(reset={"counts"})) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {}
        storage.commit("p3")
    with TaskStorage(machine_b, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {}, "the reset state came back from machine B's local copy"
        storage.store("counts")["new"] = {"n": 2}
        storage.commit("p4")
    with TaskStorage(machine_a, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {"new": {"n": 2}}


def test_a_snapshot_of_a_discarded_tail_left_on_another_machine_is_never_loaded(tmp_path):
    """Machine B persists a RocksDB snapshot of its uncommitted writes and dies before its
    checkpoint; the task restores on machine A, which cuts that tail, writes on past its
    offsets and commits; the task moves back to B. B's snapshot must be rebuilt, not
    loaded (before the fix B showed the uncommitted values and missed A's commits: the
    file and objectstore logs write the cut offsets again)."""
    _tail_on_b_then_commits_on_a(tmp_path, job_values(tmp_path, "rocksdb", 1))


def test_kafka_and_objectstore_snapshot_of_a_discarded_tail_is_never_loaded(tmp_path, remote):
    _tail_on_b_then_commits_on_a(tmp_path, remote(tmp_path, 1, "rocksdb"))


def _tail_on_b_then_commits_on_a(tmp_path: Path, values: dict[str, Any]) -> None:
    from localstate.faults import InjectedFault, configure

    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-a")})
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "machine-b")})
    with TaskStorage(machine_b, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS[:10]})
        storage.commit("p1")
    storage = TaskStorage(machine_b, 0)
    storage.store("counts").put_all({u: {"n": -1} for u in USERS[:10]})
    configure("commit.after_engine_checkpoint=raise")  # B dies between its snapshot and its checkpoint
    try:
        with pytest.raises(InjectedFault):
            storage.commit("p2")
    finally:
        configure("")
        storage.close()
    with TaskStorage(machine_a, 0) as storage:
        assert storage.store("counts")[USERS[0]] == {"n": 1}
        storage.store("counts").put_all({u: {"n": 2} for u in USERS[100:130]})
        storage.commit("p3")
    with TaskStorage(machine_b, 0) as storage:
        with storage.store("counts").all() as items:
            assert dict(items) == {**{u: {"n": 1} for u in USERS[:10]}, **{u: {"n": 2} for u in USERS[100:130]}}


def test_a_corrupt_generation_record_is_an_error_naming_it(tmp_path, remote):
    """The record that says where a rescaled job's state is: damaged, every open refuses
    (naming it) instead of falling back to the old generation's stale state."""
    config = seeded_values(remote(tmp_path))
    new = rescale(config, 2).config
    if remote.kind == "kafka":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": config.systems["kafka"]["bootstrap.servers"]})
        producer.produce(f"{config.job_name}-checkpoints", b"{not json", f"{config.job_name}/generation".encode(), 0)
        producer.flush(10)
        where = f"{config.job_name}/generation in kafka topic"
    else:
        from localstate.storage import open_system

        system = open_system(new, "s3")
        key = f"_generations/{config.job_name}/{1:010d}"
        system.store.put(key, b"{not json")
        system.close()
        where = key
    with pytest.raises(CorruptionError, match=f"generation record .*{where}.* is corrupt"):
        TaskStorage(new, 0)
    with pytest.raises(CorruptionError, match="generation record"):
        rescale(new, 3)


def test_an_objectstore_generation_taken_by_another_rescale_is_skipped(tmp_path, s3_server):
    """Two rescales never write one generation's prefixes: a number another rescale
    reserved (``<n>.writing``, created with If-None-Match) is skipped."""
    from localstate.storage import open_system
    from localstate.testing.s3 import objectstore_options

    values = {**job_values(tmp_path), "job.changelog.system": "s3", "stores.counts.changelog": "s3.clicks-counts",
              **objectstore_options(s3_server.endpoint, s3_server.create_bucket(), "jobs", **FAST_S3)}
    config = seeded_values(values)
    system = open_system(config, "s3")
    try:
        assert system.claim_generation(1) and not system.claim_generation(1)
    finally:
        system.close()
    new = rescale(config, 6).config
    assert state_of(new) == expected(6)
    with TaskStorage(new, 0) as storage:
        assert storage.changelog("counts").stream == "clicks-counts.gen2"


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
