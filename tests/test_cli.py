"""The core CLI: engines, inspect (read-only, safe on a live task), restore, compact."""

from __future__ import annotations

import json

from click.testing import CliRunner
from localstate import TaskStorage
from localstate.cli import cli


def _props(tmp_path):
    p = tmp_path / "job.properties"
    p.write_text(
        f"job.name = clijob\njob.state.dir = {tmp_path / 'state'}\nsystems.file.path = {tmp_path / 'changelog'}\n"
        "stores.counts.factory = memory\nstores.counts.key.serde = string\nstores.counts.msg.serde = json\n"
    )
    return p


def _fill(config_path):
    from localstate import Config

    config = Config.from_properties(config_path)
    with TaskStorage(config) as s:
        s.store("counts").put_all([(f"k{i}", i) for i in range(100)])
        s.commit(input_position=100)
    return config


def test_engines_lists_builtins_with_install_state():
    result = CliRunner().invoke(cli, ["engines", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["memory"]["installed"] is True
    assert {"rocksdb", "leveldb", "topn", "hyperloglog", "bloom", "search"} <= set(info)


def test_inspect_reports_checkpoints_partitions_and_stores(tmp_path):
    _fill(_props(tmp_path))
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["checkpoints"][0]["offsets"] == {"counts": 100}
    assert report["partitions"][0]["records"] == 100
    assert report["stores"][0]["store"] == "counts"
    assert CliRunner().invoke(cli, ["inspect", str(tmp_path)]).exit_code == 0


def test_inspect_on_a_live_task_does_not_disturb_it(tmp_path):
    config = _fill(_props(tmp_path))
    with TaskStorage(config) as s:
        s.store("counts")["k1"] = 999
        s.store("counts").flush()
        report = json.loads(CliRunner().invoke(cli, ["inspect", str(tmp_path), "--json"]).output)
        assert report["partitions"][0]["locked_by"]
        s.commit(input_position=101)
    with TaskStorage(config) as s:
        assert s.store("counts")["k1"] == 999


def test_restore_rebuilds_and_reports_speed(tmp_path):
    props = _props(tmp_path)
    _fill(props)
    result = CliRunner().invoke(cli, ["restore", "-c", str(props)])
    assert result.exit_code == 0, result.output
    assert "100 records" in result.output


def test_compact_and_bad_arguments(tmp_path):
    props = _props(tmp_path)
    _fill(props)
    assert CliRunner().invoke(cli, ["compact", "-c", str(props)]).exit_code == 0
    bad = CliRunner().invoke(cli, ["restore", "-c", str(props), "--store", "nope"])
    assert bad.exit_code != 0 and "unknown store" in bad.output
    bad = CliRunner().invoke(cli, ["restore", "-c", str(props), "--set", "novalue"])
    assert bad.exit_code != 0 and "KEY=VALUE" in bad.output


def test_restore_wipe_takes_the_task_lock_before_deleting(tmp_path):
    """A restore beside a running task must not delete the task's local copy: the task
    lock is taken first, so it fails with the holder named and nothing is deleted."""
    from localstate import Config, layout

    props = _props(tmp_path)
    props.write_text(props.read_text().replace("factory = memory", "factory = rocksdb"))
    config = _fill(props)
    local = layout.store_dir(config, "counts", 0)
    with TaskStorage(Config.from_properties(props)):
        before = sorted(p.name for p in local.rglob("*"))
        result = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"])
        assert result.exit_code != 0 and "locked by pid" in result.output, result.output
        assert sorted(p.name for p in local.rglob("*")) == before
    result = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"])
    assert result.exit_code == 0 and "100 records" in result.output, result.output
