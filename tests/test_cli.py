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


# -- first contact: what a new user sees ------------------------------------------------------
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
from localstate.registry import ENGINES  # noqa: E402

WIDE = {"COLUMNS": "1000"}  # one table row per line, so a message is never split by wrapping


def _rocks_props(tmp_path, segment_bytes=None):
    p = tmp_path / "job.properties"
    extra = f"systems.file.segment.bytes = {segment_bytes}\n" if segment_bytes else ""
    p.write_text(
        f"job.name = clijob\njob.state.dir = {tmp_path / 'state'}\nsystems.file.path = {tmp_path / 'changelog'}\n"
        + extra +
        "stores.counts.factory = memory\nstores.counts.key.serde = string\nstores.counts.msg.serde = json\n"
        "stores.rk.factory = rocksdb\nstores.rk.key.serde = string\nstores.rk.msg.serde = json\n"
    )
    return p


def _fill_rounds(props, rounds, keys=100):
    from localstate import Config

    config = Config.from_properties(props)
    with TaskStorage(config) as s:
        for r in range(rounds):
            for store in ("counts", "rk"):
                s.store(store).put_all([(f"k{i}", i + r) for i in range(keys)])
            s.commit(input_position=(r + 1) * keys)
    return config


def test_engines_install_hint_keeps_its_brackets():
    # An engine whose module is absent stands for an engine whose extra is not installed.
    ENGINES.register("needs-rocks-extra", "localstate_no_such_module:Factory", extra="rocksdb")
    try:
        result = CliRunner().invoke(cli, ["engines"], env=WIDE)
    finally:
        ENGINES.unregister("needs-rocks-extra")
    assert result.exit_code == 0, result.output
    assert "pip install 'localstate[rocksdb]'" in result.output


def test_restore_keeps_local_files_by_default_and_wipe_says_what_it_deletes(tmp_path):
    props = _rocks_props(tmp_path)
    _fill_rounds(props, 3)
    rk_dir = tmp_path / "state" / "clijob" / "rk" / "0"
    before = sorted(p.name for p in rk_dir.iterdir())
    kept = CliRunner().invoke(cli, ["restore", "-c", str(props)], env=WIDE)
    assert kept.exit_code == 0, kept.output
    assert "deleting" not in kept.output and "rk[0]: local copy kept, already at offset 300" in kept.output
    assert sorted(p.name for p in rk_dir.iterdir()) == before
    # with the snapshots shipped beside the log off, the wiped store replays its whole log
    props.write_text(props.read_text() + "systems.file.snapshots = false\n")
    wiped = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"], env=WIDE)
    assert wiped.exit_code == 0, wiped.output
    assert f"--wipe: deleting local files of rk[0] in {rk_dir}" in wiped.output
    assert "rk[0]: 300 records" in wiped.output
    help_text = " ".join(CliRunner().invoke(cli, ["restore", "--help"]).output.split())
    assert "Deletes nothing unless --wipe is given" in help_text and "DELETE the local store files" in help_text


def test_restore_wipe_refuses_while_a_task_has_the_partition_open(tmp_path):
    props = _rocks_props(tmp_path)
    config = _fill_rounds(props, 1)
    rk_dir = tmp_path / "state" / "clijob" / "rk" / "0"
    with TaskStorage(config):
        result = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"], env=WIDE)
    assert result.exit_code == 1
    assert f"is open in pid {os.getpid()}; stop it before --wipe" in result.output
    assert rk_dir.is_dir() and any(rk_dir.iterdir())


def test_restore_progress_counts_records_not_offsets_after_compaction(tmp_path):
    from localstate.changelog.file import FileChangelogSystem
    from localstate.changelog.file.inspect import count_records

    props = _rocks_props(tmp_path, segment_bytes=4096)
    config = _fill_rounds(props, 30)
    compacted = CliRunner().invoke(cli, ["compact", "-c", str(props)], env=WIDE)
    assert compacted.exit_code == 0, compacted.output
    system = FileChangelogSystem("file", config.systems["file"], "clijob")
    part = system.open_partition("clijob-rk", 0, 1, readonly=True)
    try:
        survivors = count_records(part, 0, 3000)
        assert survivors == sum(1 for _ in part.read_with_offsets(0, 3000))
        assert 100 <= survivors < 3000 / 4  # offsets span 3000; most records were compacted away
    finally:
        part.close()
    # the bar's total while a long restore runs (a short one is sized by its final count)
    from localstate.cli import _restore_total

    assert _restore_total(config, "rk", 0, 0, 3000) == survivors
    assert _restore_total(config, "rk", 0, 2900, 3000) == 100  # an incremental restore's tail
    result = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert f"rk[0]: {survivors} records" in result.output
    assert re.search(rf"rk\[0\].*{survivors}/{survivors} records", result.output), result.output


def test_compact_prints_a_table_or_says_there_is_nothing_to_compact(tmp_path):
    young = tmp_path / "young"
    young.mkdir()
    _fill_rounds(_rocks_props(young), 2)
    result = CliRunner().invoke(cli, ["compact", "-c", str(young / "job.properties")], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "nothing to compact (only the active segment): counts[0], rk[0]" in result.output
    assert "{" not in result.output  # no raw dicts
    old = tmp_path / "old"
    old.mkdir()
    _fill_rounds(_rocks_props(old, segment_bytes=4096), 30)
    result = CliRunner().invoke(cli, ["compact", "-c", str(old / "job.properties")], env=WIDE)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "│ rk" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[0] == "rk" and int(cells[2]) >= 1  # segments compacted
    before, after, removed = (int(c.replace(",", "")) for c in cells[3:6])
    assert before - after == removed > 0


def test_inspect_shows_times_roots_and_in_memory_stores(tmp_path):
    for job_root in ("a", "b"):
        (tmp_path / job_root).mkdir()
        _fill_rounds(_rocks_props(tmp_path / job_root), 1)
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(\d+ s ago\)", result.output), result.output
    assert "in memory (no local files)" in result.output  # the memory store
    assert re.search(r"rk .*\d+ files, [\d,]+ bytes", result.output)
    assert "┃ root" in result.output and "a/changelog" in result.output and "b/state" in result.output
    single = CliRunner().invoke(cli, ["inspect", str(tmp_path / "a")], env=WIDE)
    assert "┃ root" not in single.output  # one root: no column for it


@pytest.mark.parametrize("args", [
    ["restore"], ["compact"], ["verify"], ["restore", "--set", "job.partitions=2"],
])
def test_commands_without_a_config_say_pass_c(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "no job config: pass -c job.toml" in result.output and "job.name" not in result.output


def test_config_errors_are_one_line_without_traceback(tmp_path):
    bad_toml = tmp_path / "job.toml"
    bad_toml.write_text("[job\nname = 1\n")
    float_partitions = _props(tmp_path)
    for args in (["restore", "-c", str(bad_toml)],
                 ["verify", "-c", str(float_partitions), "--set", "job.partitions=1.5"],
                 ["compact", "-c", str(float_partitions), "--set", "stores.counts.factory=rockdb"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith("Error: ") and "Traceback" not in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Did you mean 'rocksdb'" in result.output
    assert not (tmp_path / "state").exists()  # nothing was created on the way to the error


@pytest.mark.parametrize("args", [
    ["run", "ad-click-join", "--events", "0"], ["run", "ad-click-join", "--partitions", "0"],
    ["run", "ad-click-join", "--rows", "-1"], ["demo", "--events", "0"], ["demo", "--partitions", "-3"],
    ["demo", "--events", "1.5"], ["bench", "--records", "0"], ["bench", "--repeats", "0"],
    ["bench", "--key-size", "x"], ["torture", "--trials", "0"], ["restore", "-p", "-1"],
    ["verify", "-p", "x"],
])
def test_bad_numbers_are_usage_errors_not_tracebacks(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_torture_unknown_engine_suggests_the_name():
    result = CliRunner().invoke(cli, ["torture", "--engine", "rockdb", "--trials", "1"])
    assert result.exit_code == 2
    assert "unknown engine 'rockdb'. Did you mean 'rocksdb'?" in " ".join(result.output.split())


def _cli_subprocess(code, *args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("missing", ["pyspark", "pyarrow"])
@pytest.mark.parametrize("args", [["demo", "--events", "10"], ["run", "pageviews-hourly", "--events", "10"]])
def test_spark_commands_without_the_spark_extra_name_it(args, missing):
    # Test double, declared: sys.modules[name] = None makes `import name` fail exactly as
    # it does when the package is not installed (ModuleNotFoundError naming it);
    # uninstalling packages from the shared venv is not an option. Without pyarrow the
    # command module cannot load (a stand-in command answers); without pyspark alone it
    # loads and checks before any work.
    proc = _cli_subprocess(f"""
        import sys
        sys.modules["{missing}"] = None
        from localstate.cli import main
        main(sys.argv[1:])
    """, *args)
    assert proc.returncode == 1, proc.stderr
    assert "No such option" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("Error: ") and "pip install 'localstate[spark]'" in proc.stderr
    assert "generating" not in proc.stdout  # refused before any work


def test_python_dash_m_localstate_works():
    proc = subprocess.run([sys.executable, "-m", "localstate", "engines", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["memory"]["installed"] is True
    usage = subprocess.run([sys.executable, "-m", "localstate", "--help"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("Usage: localstate ")


def test_help_texts_share_one_style():
    """Commands: a sentence with a capital and a full stop. Options: a lowercase phrase,
    no full stop, defaults as ``[default: ...]``."""
    import click

    ctx = click.Context(cli)
    problems = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        short = command.get_short_help_str(200)
        if not (short[:1].isupper() and short.endswith(".")):
            problems.append(f"{name}: short help {short!r}")
        for param in command.params:
            text = getattr(param, "help", None)
            if not text or param.name == "help":
                continue
            word = text.split()[0].split("'")[0]
            if word[:1].isupper() and not word.isupper() and word not in ("Spark", "Kafka", "RocksDB", "LevelDB"):
                problems.append(f"{name} {param.opts[0]}: starts with a capital: {text!r}")
            if text.rstrip().endswith("."):
                problems.append(f"{name} {param.opts[0]}: ends with a full stop: {text!r}")
            if re.search(r"\((?:default|e\.g\. default)[ :]", text) or "; default " in text:
                problems.append(f"{name} {param.opts[0]}: default not as [default: ...]: {text!r}")
    assert not problems, "\n".join(problems)


def test_quiet_stderr_parks_fd2_writes_and_shows_them_only_on_failure():
    # fd 2 written directly (os.write), as the JVM and librdkafka do, bypassing sys.stderr
    code = """
        import os, sys
        from localstate.terminal import quiet_stderr
        with quiet_stderr(True, "the test"):
            os.write(2, b"noise that would break a spinner\\n")
        print("after success", file=sys.stderr)
        try:
            with quiet_stderr(True, "the test"):
                os.write(2, b"the cause of the failure\\n")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        with quiet_stderr(True, "the restore", show_after=True):
            os.write(2, b"a warning worth reading\\n")
        print("end", file=sys.stderr)
    """
    proc = _cli_subprocess(code)
    assert proc.returncode == 0, proc.stderr
    assert "noise that would break a spinner" not in proc.stderr
    assert "after success" in proc.stderr
    assert "the test written to stderr while the progress display ran" in proc.stderr
    assert "the cause of the failure" in proc.stderr
    # show_after: shown once the display is gone, before what follows it
    assert proc.stderr.index("a warning worth reading") < proc.stderr.index("end")


def test_wipe_refuses_when_the_changelog_could_not_rebuild_what_it_deletes(tmp_path):
    props = _rocks_props(tmp_path)
    _fill_rounds(props, 2)
    rk_dir = tmp_path / "state" / "clijob" / "rk" / "0"
    files = sorted(p.name for p in rk_dir.iterdir())
    # the operator damage of RELIABILITY.md: a changelog segment deleted by hand
    for seg in (tmp_path / "changelog" / "clijob-rk" / "0").glob("*.log"):
        seg.unlink()
    result = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert "not wiping" in result.output and "rk[0]" in result.output
    assert sorted(p.name for p in rk_dir.iterdir()) == files  # the possibly last good copy is still there


def test_partitions_out_of_range_are_refused_before_anything_is_touched(tmp_path):
    props = _rocks_props(tmp_path)
    _fill_rounds(props, 1)
    for command in ("restore", "compact", "verify"):
        result = CliRunner().invoke(cli, [command, "-c", str(props), "-p", "3"])
        assert result.exit_code == 2, result.output
        assert "[3] out of range: job.partitions = 1" in result.output
    assert not (tmp_path / "state" / "clijob" / "counts" / "3").exists()


def test_extra_for_module_reads_the_package_requirements():
    from localstate.cli import extra_for_module

    assert extra_for_module("pyspark") == "spark"
    assert extra_for_module("pyspark.sql") == "spark"
    assert extra_for_module("confluent_kafka") == "kafka"
    assert extra_for_module("rocksdict") == "rocksdb"
    assert extra_for_module("matplotlib") == "bench"
    assert extra_for_module("no_such_module_anywhere") == "all" and extra_for_module(None) == "all"


def test_inspect_reports_a_damaged_checkpoint_and_counts_up_to_a_torn_tail(tmp_path):
    from localstate.changelog.file import FileChangelogPartition
    from localstate.changelog.file.inspect import count_records

    _fill(_props(tmp_path))
    ckpt = next((tmp_path / "changelog").glob("_checkpoints/*/partition-0.ckpt"))
    ckpt.write_bytes(b"{not json")
    segment = next((tmp_path / "changelog").glob("clijob-counts/0/*.log"))
    with open(segment, "ab") as f:
        f.write(b"LS\x01torn")  # a crashed writer's half batch
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "unreadable: " in result.output and str(ckpt) in result.output
    part = FileChangelogPartition(segment.parent, readonly=True)
    try:
        assert count_records(part) == 100 and count_records(part, 10, 20) == 10 and count_records(part, 100) == 0
    finally:
        part.close()
    report = json.loads(CliRunner().invoke(cli, ["inspect", str(tmp_path), "--json"]).output)
    assert report["partitions"][0]["records"] == 100


def test_a_deleted_first_segment_is_a_problem_not_a_silent_partial_restore(tmp_path):
    props = _rocks_props(tmp_path, segment_bytes=4096)
    _fill_rounds(props, 30)
    rk_dir = tmp_path / "state" / "clijob" / "rk" / "0"
    files = sorted(p.name for p in rk_dir.iterdir())
    first = min((tmp_path / "changelog" / "clijob-rk" / "0").glob("*.log"))
    first.unlink()
    checked = CliRunner().invoke(cli, ["verify", "-c", str(props)])
    assert checked.exit_code == 1 and "are missing" in checked.output
    wiped = CliRunner().invoke(cli, ["restore", "-c", str(props), "--wipe"], env=WIDE)
    assert wiped.exit_code == 1 and "not wiping" in wiped.output
    assert sorted(p.name for p in rk_dir.iterdir()) == files
    kept = CliRunner().invoke(cli, ["restore", "-c", str(props)], env=WIDE)
    assert kept.exit_code == 1 and "offsets 0..499 are missing" in kept.output
