"""The commands that read a job (``inspect``, ``verify``, ``get``, ``dump``) take the same
``-c job.toml``, ``--set``, ``-p`` (and ``--system`` where it selects something) and answer
the same way on every changelog system: a file directory, Kafka (the session's broker),
an object store (the moto S3 server, and a ``file://`` URL). Each is read-only: nothing on
disk, in the bucket or on the broker changes. Bad input is one ``Error:`` paragraph with
exit code 2 (usage) or 1 (a problem), never a traceback. And no help text shows reST markup."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from localstate import Config, TaskStorage
from localstate.cli import cli
from localstate.testing.kafka import free_port
from localstate.testing.s3 import QUICK_RETRIES, objectstore_options

ROOT = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "300"}  # one table row per line
COMMANDS = (["inspect"], ["verify"], ["get", "counts", "user-3"], ["dump", "counts"])
USERS = {f"user-{i}": {"n": i} for i in range(10)}
SYSTEMS = ("file", "kafka", "objectstore-s3", "objectstore-file")


def _task(user: str) -> int:
    return int(user.split("-")[1]) % 2  # the job's own routing: even users on task 0


def _system_values(kind: str, request: pytest.FixtureRequest, root: Path) -> dict[str, Any]:
    if kind == "file":
        return {"systems.file.path": str(root / "changelog")}
    if kind == "kafka":
        tag = uuid.uuid4().hex[:8]
        return {"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": request.getfixturevalue("kafka_broker"),
                "systems.kafka.checkpoint.topic": f"ckpt-{tag}", "stores.counts.changelog": f"kafka.counts-{tag}"}
    if kind == "objectstore-s3":
        server = request.getfixturevalue("s3_server")
        return {"job.changelog.system": "s3", **objectstore_options(server.endpoint, server.create_bucket(), "jobs",
                                                                    **QUICK_RETRIES)}
    return {"job.changelog.system": "s3", "systems.s3.type": "objectstore", "systems.s3.path": f"file://{root}/objects",
            **{f"systems.s3.{k}": v for k, v in QUICK_RETRIES.items()}}


def _write_toml(path: Path, values: dict[str, Any]) -> Path:
    path.write_text("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


@pytest.fixture(params=SYSTEMS)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A two-task job committed with TaskStorage on one changelog system, and its job.toml."""
    values = {"job.name": "clicks", "job.partitions": 2, "job.state.dir": str(tmp_path / "state"),
              "stores.counts.factory": "memory", "stores.counts.key.serde": "string",
              "stores.counts.msg.serde": "json", **_system_values(request.param, request, tmp_path)}
    config = Config.from_dict(values)
    for p in range(2):
        with TaskStorage(config, p) as storage:
            storage.store("counts").put_all({u: v for u, v in USERS.items() if _task(u) == p})
            storage.commit(input_position=10)
    with TaskStorage(config, 0) as storage:  # open and closed again: local copies are on disk
        pass
    system = values.get("job.changelog.system", "file")
    return {"kind": request.param, "values": values, "config": config, "system": system,
            "toml": _write_toml(tmp_path / "job.toml", values), "root": tmp_path}


def _snapshot(job: dict[str, Any]) -> dict[str, Any]:
    """Everything the job's tools could change: every local file (path, size, content), and
    the bucket's listing or the broker's topics and their ends."""
    files = {str(p.relative_to(job["root"])): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(job["root"].rglob("*")) if p.is_file()}
    remote: Any = None
    values = job["values"]
    if job["kind"] == "objectstore-s3":
        bucket = values["systems.s3.path"].split("/")[2]
        with urllib.request.urlopen(f"{values['systems.s3.config.endpoint']}/{bucket}?list-type=2") as answer:
            remote = re.sub(r"<LastModified>[^<]*</LastModified>", "", answer.read().decode())
    elif job["kind"] == "kafka":
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": values["systems.kafka.bootstrap.servers"], "group.id": "snapshot"})
        try:
            topics = consumer.list_topics(timeout=10).topics
            remote = {name: [consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                             for p in sorted(t.partitions)] for name, t in sorted(topics.items())
                      if name.endswith(values["systems.kafka.checkpoint.topic"][-8:])}
        finally:
            consumer.close()
    return {"files": files, "remote": remote}


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=WIDE)


def _one_paragraph_error(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), result.output
    message = result.output.split("Error: ", 1)[1].strip()
    assert "\n\n" not in message, result.output
    return " ".join(message.split())


# -- every command, every changelog system ----------------------------------------------------

def test_each_command_reads_the_job_from_its_config_on_every_changelog_system(job: dict[str, Any]) -> None:
    toml, config = str(job["toml"]), job["config"]
    before = _snapshot(job)
    per_task = [sum(_task(u) == p for u in USERS) for p in range(2)]

    table = _run("inspect", "-c", toml)
    assert table.exit_code == 0, table.output
    flat = " ".join(table.output.split())  # a long title wraps over lines
    assert "None" not in flat and "task checkpoints in " in flat, table.output
    report = json.loads(_run("inspect", "-c", toml, "--json").output)
    assert [(c["job"], c["partition"], c["version"], c["offsets"]) for c in report["checkpoints"]] == [
        ("clicks", p, 1, {"counts": per_task[p]}) for p in range(2)]
    assert [(r["stream"], r["partition"], r["records"]) for r in report["partitions"]] == [
        (config.stores["counts"].changelog[1], p, per_task[p]) for p in range(2)]
    assert [(s["store"], s["partition"]) for s in report["stores"]] == [("counts", 0), ("counts", 1)]
    assert all(report["where"][section] for section in ("checkpoints", "partitions", "stores"))
    described = report["where"]["checkpoints"]
    assert report["where"]["partitions"] == described
    assert re.search(r"changelog (at|on) ", described) and described.split()[0] in ("file", "kafka", "objectstore")
    titles = [f"task checkpoints in {described}", f"changelog partitions in {described}",
              f"local stores in {config.state_dir}"]
    assert [flat.find(t) for t in titles] == sorted(flat.find(t) for t in titles) and all(t in flat for t in titles)

    verified = _run("verify", "-c", toml)
    assert verified.exit_code == 0, verified.output
    assert "counts[0]: ok" in verified.output and "2 store partition(s) checked, 0 with problems" in verified.output
    got = _run("get", "-c", toml, "counts", "user-3")
    assert got.exit_code == 0 and got.output.strip() == '{"n": 3}', got.output
    dumped = _run("dump", "-c", toml, "counts")
    assert dumped.exit_code == 0, dumped.output
    assert dumped.output.splitlines() == [f"{_task(u)}\t{u}\t{json.dumps(USERS[u])}"
                                          for u in sorted(USERS, key=lambda u: (_task(u), u))]

    # -p means one thing everywhere: only these task partitions (repeatable)
    one = json.loads(_run("inspect", "-c", toml, "-p", "1", "--json").output)
    assert {r["partition"] for section in ("checkpoints", "partitions", "stores") for r in one[section]} == {1}
    assert "counts[1]: ok" in _run("verify", "-c", toml, "-p", "1").output
    assert "counts[0]" not in _run("verify", "-c", toml, "-p", "1").output
    assert _run("get", "-c", toml, "-p", "0", "counts", "user-3").exit_code == 1  # user-3 is on task 1
    assert _run("get", "-c", toml, "-p", "0", "-p", "1", "counts", "user-3").output.strip() == '{"n": 3}'
    assert {line.split("\t")[0] for line in _run("dump", "-c", toml, "-p", "1", "counts").output.splitlines()} == {"1"}
    # --system: only the stores on that system, on inspect and verify
    assert _run("inspect", "-c", toml, "--system", job["system"]).exit_code == 0
    assert _run("verify", "-c", toml, "--system", job["system"]).exit_code == 0

    assert _snapshot(job) == before  # read-only, every one of them


def test_bad_arguments_are_usage_errors_that_change_nothing(job: dict[str, Any], tmp_path: Path) -> None:
    toml = str(job["toml"])
    before = _snapshot(job)
    for command in COMMANDS:
        name, rest = command[0], command[1:]
        missing = _run(name, "-c", str(tmp_path / "no-such.toml"), *rest)
        assert "does not exist" in _one_paragraph_error(missing, 2)
        folder = _run(name, "-c", str(tmp_path), *rest)
        assert "is a directory" in _one_paragraph_error(folder, 2)
        out_of_range = _run(name, "-c", toml, "-p", "2", *rest)
        assert "[2] out of range: job.partitions = 2" in _one_paragraph_error(out_of_range, 2)
        if name in ("inspect", "verify"):
            unknown = _run(name, "-c", toml, "--system", job["system"] + "x", *rest)
            message = _one_paragraph_error(unknown, 2)
            assert f"keeps nothing on a system named '{job['system']}x'" in message
            assert f"Did you mean '{job['system']}'" in message
    assert _snapshot(job) == before


def test_an_invalid_or_unreadable_config_is_one_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('[job\nname = "x"\n')
    no_name = _write_toml(tmp_path / "no-name.toml", {"systems.file.path": str(tmp_path / "changelog")})
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    unreadable = _write_toml(tmp_path / "unreadable.toml", {"job.name": "j"})
    unreadable.chmod(0)
    for command in COMMANDS:
        name, rest = command[0], command[1:]
        assert "is not valid TOML" in _one_paragraph_error(_run(name, "-c", str(broken), *rest), 1)
        assert "is not UTF-8 text" in _one_paragraph_error(_run(name, "-c", str(binary), *rest), 1)
        assert "job.name" in _one_paragraph_error(_run(name, "-c", str(no_name), *rest), 1)
        if os.geteuid() != 0:  # root reads any file
            assert "is not readable" in _one_paragraph_error(_run(name, "-c", str(unreadable), *rest), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary.toml", "broken.toml", "no-name.toml",
                                                          "unreadable.toml"]


@pytest.mark.parametrize("kind", ["kafka", "objectstore-s3", "missing-bucket"])
def test_an_unreachable_broker_or_bucket_is_one_error_naming_it(kind: str, tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    values: dict[str, Any] = {"job.name": "clicks", "job.state.dir": str(tmp_path / "state"),
                              "stores.counts.factory": "memory", "stores.counts.key.serde": "string",
                              "stores.counts.msg.serde": "json"}
    if kind == "kafka":
        values.update({"job.changelog.system": "kafka", "systems.kafka.bootstrap.servers": nobody,
                       "systems.kafka.timeout.ms": 500, "systems.kafka.retries": 0})
    elif kind == "objectstore-s3":
        values.update({"job.changelog.system": "s3",
                       **objectstore_options(f"http://{nobody}", "bucket", "jobs", **QUICK_RETRIES)})
        values["systems.s3.retries"] = 0
    else:  # the server answers; the bucket is not there
        nobody = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
        values.update({"job.changelog.system": "s3", **objectstore_options(
            request.getfixturevalue("s3_server").endpoint, nobody, "jobs", **QUICK_RETRIES)})
    toml = str(_write_toml(tmp_path / "job.toml", values))
    for name, *rest in COMMANDS:
        message = _one_paragraph_error(_run(name, "-c", toml, *rest), 1)
        assert nobody in message, (name, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]  # no state directory was made


def test_inspect_path_and_config_are_either_or(tmp_path: Path) -> None:
    toml = str(_write_toml(tmp_path / "job.toml", {"job.name": "j", "systems.file.path": str(tmp_path / "c")}))
    assert "not both" in _one_paragraph_error(_run("inspect", str(tmp_path), "-c", toml), 2)
    assert "pass -c job.toml" in _one_paragraph_error(_run("inspect", str(tmp_path), "-p", "0"), 2)
    assert "object-store URL" in _one_paragraph_error(_run("inspect", str(tmp_path), "-o", "a=b"), 2)
    assert "give -c job.toml" in _one_paragraph_error(_run("inspect"), 2)


# -- help texts and the CLI reference page -----------------------------------------------------

MARKUP = re.compile(r"(?<!`)``(?!`)|:(?:func|class|meth|mod|attr|data|exc|obj|ref|doc|py:\w+):`")


def _every_command() -> list[tuple[click.Context, click.Command]]:
    found: list[tuple[click.Context, click.Command]] = []

    def walk(command: click.Command, ctx: click.Context) -> None:
        found.append((ctx, command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, click.Context(sub, info_name=name, parent=ctx))

    walk(cli, click.Context(cli, info_name="localstate"))
    return found


def test_no_help_text_shows_markup_or_a_cut_summary() -> None:
    problems = []
    commands = _every_command()
    assert {ctx.command_path for ctx, _ in commands} >= {f"localstate {n}" for n in (
        "inspect", "verify", "get", "dump", "restore", "compact", "rescale", "engines", "run", "bench", "torture",
        "demo", "new-engine")}
    for ctx, command in commands:
        text = command.get_help(ctx)
        problems += [f"{ctx.command_path}: {line.strip()}" for line in text.splitlines() if MARKUP.search(line)]
        short = command.get_short_help_str(90)
        if short.endswith("...") or short != command.get_short_help_str(1000):
            problems.append(f"{ctx.command_path}: summary cut: {short!r}")
    listing = cli.get_help(click.Context(cli, info_name="localstate"))
    problems += [f"localstate --help: {line.strip()}" for line in listing.splitlines()
                 if line.rstrip().endswith("...") and not line.startswith("Usage:")]
    assert not problems, "\n".join(problems)


def test_the_cli_reference_page_shows_no_markup() -> None:
    pytest.importorskip("mkdocs")
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "cli.md").read_text().replace(hooks.CLI_REFERENCE, hooks._cli_reference())
    assert "localstate inspect [OPTIONS] [PATH]" in page
    assert not [line for line in page.splitlines() if MARKUP.search(line)]


def test_the_four_commands_share_their_job_options() -> None:
    ctx = click.Context(cli)
    options = {}
    for name in ("inspect", "verify", "get", "dump"):
        command = cli.get_command(ctx, name)
        assert command is not None
        options[name] = {param.opts[0]: (tuple(param.opts), param.help, getattr(param, "multiple", False))
                         for param in command.params if param.opts[0] in ("-c", "--set", "--partition", "--system")}
    assert options["inspect"] == options["verify"]
    for name in ("get", "dump"):
        assert options[name] == {k: v for k, v in options["inspect"].items() if k != "--system"}


@pytest.fixture(params=SYSTEMS)
def new_job(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A job that has never run: its config only (the bucket exists, the broker runs)."""
    values = {"job.name": "clicks", "job.partitions": 2, "job.state.dir": str(tmp_path / "state"),
              "stores.counts.factory": "memory", "stores.counts.key.serde": "string",
              "stores.counts.msg.serde": "json", **_system_values(request.param, request, tmp_path)}
    return {"kind": request.param, "values": values, "config": Config.from_dict(values),
            "system": values.get("job.changelog.system", "file"),
            "toml": _write_toml(tmp_path / "job.toml", values), "root": tmp_path}


def test_a_job_that_never_committed_is_reported_and_nothing_is_created(new_job: dict[str, Any]) -> None:
    toml = str(new_job["toml"])
    before = _snapshot(new_job)
    report = json.loads(_run("inspect", "-c", toml, "--json").output)
    assert [c.get("note") for c in report["checkpoints"]] == ["no checkpoint: this task has not committed yet"] * 2
    assert [(r["end_offset"], r["records"]) for r in report["partitions"]] == [(0, 0), (0, 0)]
    assert report["stores"] == []
    shown = _run("inspect", "-c", toml)
    assert shown.exit_code == 0 and "has not committed yet" in shown.output, shown.output
    verified = _run("verify", "-c", toml)
    assert verified.exit_code == 0, verified.output
    assert "counts[0]: nothing committed" in verified.output
    assert "job 'clicks' has committed nothing there yet" in " ".join(verified.output.split())
    for command in (["get", "counts", "user-3"], ["dump", "counts"]):
        message = _one_paragraph_error(_run(command[0], "-c", toml, *command[1:]), 1)
        assert "has no committed state" in message, message
    assert _snapshot(new_job) == before


def test_a_changelog_no_checkpoint_explains_is_a_problem_on_every_system(job: dict[str, Any]) -> None:
    """Checkpoints looked for where there are none (another checkpoint topic, directory or
    prefix) beside a changelog holding records: verify reports it, on every system alike."""
    toml, kind = str(job["toml"]), job["kind"]
    elsewhere = {"file": "job.checkpoint.system=other", "kafka": "systems.kafka.checkpoint.topic=ckpt-none",
                 "objectstore-s3": "job.checkpoint.system=other", "objectstore-file": "job.checkpoint.system=other"}
    args = ["-c", toml, "--set", elsewhere[kind]]
    if kind != "kafka":
        args += ["--set", "systems.other.type=file", "--set", f"systems.other.path={job['root'] / 'elsewhere'}"]
    before = _snapshot(job)
    result = _run("verify", *args)
    assert result.exit_code == 1, result.output
    assert "holds records up to offset" in result.output and "no checkpoint names the store" in result.output
    assert _snapshot(job) == before
