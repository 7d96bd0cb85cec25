"""``localstate inspect`` of an objectstore changelog (a real S3 API: the moto server),
by URL with ``-o`` settings and by ``-c job.toml`` (which reads any changelog system:
tests/test_cli_config.py); and ``viewfs://`` refused at config time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import Config, ConfigError, TaskStorage
from localstate.cli import cli
from localstate.partitioning import task_for
from localstate.testing.s3 import objectstore_options

FAST = {"timeout.ms": 3000, "retries": 2, "retry.backoff.ms": 20}


def _job(tmp_path: Path, server: Any, bucket: str, partitions: int = 2) -> dict[str, Any]:
    return {
        "job.name": "clicks",
        "job.state.dir": str(tmp_path / "state"),
        "job.partitions": partitions,
        "job.changelog.system": "s3",
        **objectstore_options(server.endpoint, bucket, "jobs", **FAST),
        "stores.counts.factory": "memory",
        "stores.counts.changelog": "s3.clicks-counts",
        "stores.counts.key.serde": "string",
        "stores.counts.msg.serde": "json",
    }


def _url_args(values: dict[str, Any]) -> list[str]:
    args = [values["systems.s3.path"]]
    for key, value in values.items():
        if key.startswith(("systems.s3.config.", "systems.s3.client.")):
            args += ["-o", f"{key[len('systems.s3.'):]}={value}"]
    return args


def test_inspect_an_objectstore_url_and_a_config(tmp_path, s3_server):
    values = _job(tmp_path, s3_server, s3_server.create_bucket())
    config = Config.from_dict(values)
    users = [f"user-{i}" for i in range(20)]
    for p in range(2):
        with TaskStorage(config, p) as storage:
            storage.store("counts").put_all({u: {"n": 1} for u in users if task_for(u, 2) == p})
            storage.commit({"offset": 10}, version=0)
    per_task = [sum(task_for(u, 2) == p for u in users) for p in range(2)]
    result = CliRunner().invoke(cli, ["inspect", *_url_args(values), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [(c["job"], c["partition"], c["version"], c["offsets"]) for c in report["checkpoints"]] == [
        ("clicks", p, 0, {"counts": per_task[p]}) for p in range(2)]
    assert [(r["stream"], r["partition"], r["end_offset"], r["records"]) for r in report["partitions"]] == [
        ("clicks-counts", p, per_task[p], per_task[p]) for p in range(2)]
    assert report["generations"] == []

    toml = tmp_path / "job.toml"
    toml.write_text("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in values.items()))
    # generation 1 (by the command line): its streams, checkpoints and the record show up
    out = CliRunner().invoke(cli, ["rescale", "-c", str(toml), "--to", "3"])
    assert out.exit_code == 0 and "rescaled from 2 to 3 partitions" in out.output, out.output
    assert Config.load(toml).partitions == 3
    result = CliRunner().invoke(cli, ["inspect", "-c", str(toml), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [(g["job"], g["generation"], g["partitions"], g["previous_partitions"]) for g in report["generations"]] == [
        ("clicks", 1, 3, 2)]
    assert {(c["job"], c["partition"]) for c in report["checkpoints"]} == {("clicks.gen1", q) for q in range(3)}
    rows = {(r["stream"], r["partition"]): r for r in report["partitions"]}
    assert set(rows) == {("clicks-counts.gen1", q) for q in range(3)}  # the old generation was deleted
    assert sum(r["records"] for r in rows.values()) == 20
    assert all(r["tombstone_horizon"] == 0 for r in rows.values())  # copies are told apart by generation
    table = CliRunner().invoke(cli, ["inspect", "-c", str(toml)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "rescaled jobs" in table.output and "clicks.gen1" in table.output


def test_inspect_refuses_clearly(tmp_path, s3_server):
    missing = CliRunner().invoke(cli, ["inspect", "s3://no-such-bucket/x", "-o", f"config.endpoint={s3_server.endpoint}",
                                       "-o", "client.allow_http=true", "-o", "config.access_key_id=a",
                                       "-o", "config.secret_access_key=b", "-o", "retries=0"])
    assert missing.exit_code != 0 and "s3://no-such-bucket/x" in missing.output
    bad = CliRunner().invoke(cli, ["inspect", "s3://b/x", "-o", "config.endpoint"])
    assert bad.exit_code != 0 and "expected KEY=VALUE" in bad.output
    unknown = CliRunner().invoke(cli, ["inspect", "s3://b/x", "-o", "retry=3"])
    assert unknown.exit_code != 0 and "retry" in unknown.output
    toml = tmp_path / "file-only.toml"
    toml.write_text(f'"job.name" = "j"\n"systems.file.path" = "{tmp_path}"\n')
    file_job = CliRunner().invoke(cli, ["inspect", "-c", str(toml)], env={"COLUMNS": "300"})
    # a long title wraps inside the table: compare with the whitespace collapsed
    assert file_job.exit_code == 0 and f"task checkpoints in file changelog at {tmp_path}" in " ".join(
        file_job.output.split())
    assert CliRunner().invoke(cli, ["inspect"]).exit_code != 0
    assert "does not exist" in CliRunner().invoke(cli, ["inspect", str(tmp_path / "nope")]).output
    (tmp_path / "a-file").write_text("x")
    assert "is not a directory" in CliRunner().invoke(cli, ["inspect", str(tmp_path / "a-file")]).output


@pytest.mark.parametrize("url", ["viewfs://cluster/state"])
def test_viewfs_is_refused_when_the_config_is_read(tmp_path, url):
    """hdfs:// and webhdfs:// are served over WebHDFS (tests/test_objectstore_hdfs.py)."""
    with pytest.raises(ConfigError, match=r"systems\.s3\.path = .*mount table.*webhdfs://namenode"):
        Config.from_dict({"job.name": "j", "job.state.dir": str(tmp_path), "job.changelog.system": "s3",
                          "systems.s3.type": "objectstore", "systems.s3.path": url,
                          "stores.counts.factory": "memory", "stores.counts.changelog": "s3.counts"})
