"""After a rescale, the ops tools with the old config (``verify``, ``get``, ``dump``,
``inspect``, :class:`StateReader`) refuse as opening a task does, instead of answering
for the wrong layout; and ``localstate rescale`` through the CLI says when it succeeded,
leaves the config file at the new count (or prints the exact line) and can be run again.
File changelog, objectstore on moto S3 and Kafka on tansu."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import ChangelogError, Config, StateReader
from localstate.cli import cli
from localstate.partitioning import task_for
from localstate.rescale import rescale
from localstate.testing.rescale_jobs import (
    USERS,
    expected,
    job_values,
    seeded_values,
    state_of,
    tree_digest,
)


@pytest.fixture(params=["file", "objectstore", "kafka"])
def system_values(request, tmp_path) -> dict[str, Any]:
    """Config values of the 4-task test job on the file changelog, on moto S3 or on the
    tansu Kafka broker."""
    values = job_values(tmp_path)
    if request.param == "kafka":
        job = f"clicks-{os.urandom(4).hex()}"
        values.update({"job.name": job, "job.changelog.system": "kafka",
                       "systems.kafka.bootstrap.servers": request.getfixturevalue("kafka_broker"),
                       "systems.kafka.checkpoint.topic": f"{job}-checkpoints",
                       "stores.counts.changelog": f"kafka.{job}-counts",
                       "systems.kafka.timeout.ms": 3000, "systems.kafka.retries": 2,
                       "systems.kafka.retry.backoff.ms": 100})
    if request.param == "objectstore":
        from localstate.testing.s3 import objectstore_options

        server = request.getfixturevalue("s3_server")
        values.update({"job.changelog.system": "s3", "stores.counts.changelog": "s3.counts",
                       **objectstore_options(server.endpoint, server.create_bucket(), "clicks",
                                             **{"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 20})})
    return values


def _properties(path: Path, values: dict[str, Any]) -> Path:
    path.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    return path


def test_read_only_tools_refuse_the_old_partition_count_after_a_rescale(tmp_path, system_values):
    old = seeded_values(system_values)
    rescale(old, 2)  # the library call leaves the config file as it was: job.partitions = 4
    props = _properties(tmp_path / "old.properties", system_values)
    runner = CliRunner()
    digest = tree_digest(tmp_path)
    user = next(u for u in USERS[:50] if task_for(u, 2) != task_for(u, 4))
    for args in (["verify", "-c", str(props)], ["verify", "--quick", "-c", str(props)],
                 ["get", "-c", str(props), "counts", user], ["dump", "-c", str(props), "counts"]):
        out = runner.invoke(cli, args)
        assert out.exit_code == 1, (args, out.output)
        assert "set job.partitions = 2" in out.output, (args, out.output)
    if "objectstore" in str(system_values.get("systems.s3.type", "")):
        out = runner.invoke(cli, ["inspect", "-c", str(props)])
        assert out.exit_code == 1 and "rescaled to 2 partitions" in out.output, out.output
    for p in (0, 3):
        with StateReader(old, p) as reader, pytest.raises(ChangelogError, match="set job.partitions = 2"):
            reader.store("counts").get(user)
    assert tree_digest(tmp_path) == digest  # the tools wrote nothing
    # with the new count they answer
    new = _properties(tmp_path / "new.properties", {**system_values, "job.partitions": 2})
    assert runner.invoke(cli, ["verify", "-c", str(new)]).exit_code == 0
    out = runner.invoke(cli, ["get", "-c", str(new), "counts", user])
    assert out.exit_code == 0 and out.output.strip() == '{"n": ' + str(USERS.index(user) * 10) + "}"


def _toml(path: Path, values: dict[str, Any], partitions_line: str, *, inline_job: bool = False) -> Path:
    """The job as a user writes it: a ``[job]`` table (or an inline ``job = {...}``), one
    table per system and store."""
    tables: dict[str, dict[str, Any]] = {}
    for k, v in values.items():
        if k == "job.partitions":
            continue
        head, _, rest = k.partition(".")
        if head in ("systems", "stores"):
            name, _, rest = rest.partition(".")
            head = f"{head}.{name}"
        tables.setdefault(head, {})[rest] = v

    def show(v: Any) -> str:
        return "true" if v is True else str(v) if isinstance(v, int) else f'"{v}"'

    text = ""
    if inline_job:
        job = tables.pop("job")
        text = "job = {" + ", ".join(f'"{k}" = {show(v)}' for k, v in job.items()) + f", {partitions_line}}}\n"
    for head, keys in tables.items():
        text += f"\n[{head}]\n" + "".join(f'"{k}" = {show(v)}\n' for k, v in keys.items())
        if head == "job" and partitions_line:
            text += partitions_line + "\n"
    path.write_text(textwrap.dedent(text))
    loaded, meant = Config.load(path), Config.from_dict(values)
    assert loaded.partitions == meant.partitions
    assert {k: v for k, v in loaded.to_dict().items() if k != "job.partitions"} == {
        k: v for k, v in meant.to_dict().items() if k != "job.partitions"}
    return path


@pytest.mark.parametrize("layout", ["partitions = 4   # tasks", ""], ids=["partitions-in-job-table", "default"])
def test_cli_rescale_says_it_succeeded_updates_the_config_and_runs_again(tmp_path, system_values, layout):
    """The issue's case: the state moved but the command exited 1 ("its layout is
    unusual") for a ``[job]`` table that did not set ``partitions``; a re-run then
    refused with "already has 3 partitions"."""
    values = {**system_values, "stores.counts.rescale.key": "key"}
    if not layout:
        values["job.partitions"] = 1
    config = seeded_values(values)
    toml = _toml(tmp_path / "job.toml", values, layout)
    runner = CliRunner()
    out = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "3"])
    assert out.exit_code == 0, out.output
    assert f"rescaled from {config.partitions} to 3 partitions at version 1" in out.output
    assert Config.load(toml).partitions == 3
    assert Config.load(toml).to_dict() == {**config.to_dict(), "job.partitions": 3}
    assert state_of(Config.load(toml)) == expected(3)
    again = runner.invoke(cli, ["rescale", "-c", str(toml), "--to", "3"])
    assert again.exit_code == 0 and "already at 3 partitions" in again.output, again.output
    assert state_of(Config.load(toml)) == expected(3)


def test_cli_rescale_with_a_config_it_cannot_edit_succeeds_and_prints_the_line(tmp_path, system_values):
    config = seeded_values(system_values)
    toml = _toml(tmp_path / "job.toml", system_values, "partitions = 4", inline_job=True)
    before = toml.read_text()
    out = CliRunner().invoke(cli, ["rescale", "-c", str(toml), "--to", "3"])
    assert out.exit_code == 0, out.output
    assert "rescaled from 4 to 3 partitions" in out.output
    assert f"the state is rescaled, but could not set job.partitions = 3 in {toml}" in out.output
    assert "write partitions = 3 in its [job] table" in out.output
    assert toml.read_text() == before
    assert state_of(config.with_overrides({"job.partitions": 3})) == expected(3)
    again = CliRunner().invoke(cli, ["rescale", "-c", str(toml), "--to", "3"])  # the re-run says the same
    assert again.exit_code == 0 and "already at 3 partitions" in again.output, again.output
