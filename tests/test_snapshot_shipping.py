"""Engine snapshots shipped beside the changelog, so a task that moves to another machine
(a lost executor, a resized cluster) replays only what follows the newest one.

The conformance kit checks the move and damaged snapshots on every system
(``test_a_moved_task_replays_only_past_the_newest_shipped_snapshot``); these are the
system-specific parts: hard links and incremental fetches on the file changelog, a
checkpoint that goes back, Kafka's own snapshot store (a shared directory or S3) and its
keys, and bad settings. Real RocksDB, a real file log, the tansu broker, moto S3.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.errors import ConfigError
from localstate.storage import Recovery
from localstate.testing.changelog_conformance import KV_ENGINES, dump, on_another_machine, unique
from localstate.testing.s3 import objectstore_options

pytestmark = pytest.mark.skipif("rocksdb" not in KV_ENGINES, reason="rocksdb is not installed")


def file_job(tmp_path: Path, interval: int = 0, **extra: Any) -> dict[str, Any]:
    job = unique("ship")
    return {
        "job.name": job,
        "job.state.dir": str(tmp_path / "machine-a"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": f"file.{job}-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.rocksdb.snapshot.interval.records": interval,
        **extra,
    }


def commit_batches(config: Config, batches: range, model: dict[str, int], keys: int = 300) -> None:
    with TaskStorage(config) as s:
        kv = s.store("kv")
        for b in batches:
            rng = random.Random(b)
            for _ in range(100):
                k = f"k{rng.randrange(keys)}"
                if rng.random() < 0.1:
                    kv.delete(k)
                    model.pop(k, None)
                else:
                    kv.put(k, b)
                    model[k] = b
            s.commit(input_position=b)


def shipped_dir(values: dict[str, Any]) -> Path:
    return Path(values["systems.file.path"]) / values["stores.kv.changelog"].split(".", 1)[1] / "0" / "shipped"


def test_on_one_filesystem_shipped_files_are_hard_links_of_the_local_snapshot(tmp_path):
    values = file_job(tmp_path)
    commit_batches(Config.from_dict(values), range(3), {})
    shipped = sorted((shipped_dir(values) / "sst").iterdir())
    assert shipped
    local = {p.name: p for p in (tmp_path / "machine-a").rglob("snapshots/*/*.sst")}
    for f in shipped:
        twin = local.get(f.name.split("-", 1)[1])
        assert twin is not None and twin.stat().st_ino == f.stat().st_ino  # no second copy on disk


def test_a_task_moving_back_fetches_only_the_files_it_does_not_hold(tmp_path):
    values = file_job(tmp_path)
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(values), range(1), model)  # one SST file
    b = on_another_machine(values, tmp_path, "machine-b")
    with TaskStorage(b) as s:
        assert s.last_restore["kv"].records == 0  # the snapshot of the last commit
        first = s.changelog("kv")._shipped  # type: ignore[union-attr]
        assert first.fetched_files > 0 and first.linked_files == 0
    commit_batches(Config.from_dict(values), range(1, 2), model)  # back on machine a: one more
    with TaskStorage(b) as s:  # and to b again: its older copy holds the first file
        shipped = s.changelog("kv")._shipped  # type: ignore[union-attr]
        assert s.last_restore["kv"].records == 0
        assert (shipped.fetched_files, shipped.linked_files) == (1, 1)
        assert dump(s) == model


def test_snapshots_can_be_turned_off(tmp_path):
    values = file_job(tmp_path, **{"systems.file.snapshots": False})
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(values), range(3), model)
    assert not shipped_dir(values).exists()
    with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
        assert s.last_restore["kv"].start_offset == 0
        assert dump(s) == model


def test_a_checkpoint_that_goes_back_deletes_the_snapshots_past_it(tmp_path):
    """Commit 3 is undone (its checkpoint lost: the operator goes back to commit 2): the
    snapshot shipped after commit 3 describes records that are no longer committed; it is
    deleted before the task writes those offsets again, and a later move never sees them."""
    values = file_job(tmp_path)
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(values), range(2), model)
    kept = dict(model)
    commit_batches(Config.from_dict(values), range(2, 3), model)
    manifests = sorted((shipped_dir(values) / "snapshots").iterdir())
    assert len(manifests) == 2
    with TaskStorage(Config.from_dict(values), recovery=Recovery(use_previous_checkpoint=True)) as s:
        assert dump(s) == kept
        assert sorted((shipped_dir(values) / "snapshots").iterdir()) == manifests[:1]
        s.store("kv").put("after", 1)
        s.commit(input_position=9)
    with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {**kept, "after": 1}


@pytest.mark.parametrize(("key", "value", "match"), [
    ("every", "2.5", r"snapshots\.every = '2\.5'"),
    ("every", "-1", r"snapshots\.every = '-1'"),
    ("path", "shared/snapshots", r"snapshots\.path = 'shared/snapshots'.*URL"),
    ("path", "file://shared", r"absolute path"),
])
def test_bad_kafka_snapshot_settings_are_config_errors(key, value, match):
    values = {"job.name": "j", "systems.kafka.type": "kafka", "systems.kafka.bootstrap.servers": "127.0.0.1:1",
              "systems.kafka.snapshots.path": "file:///tmp/x", f"systems.kafka.snapshots.{key}": value,
              "stores.kv.factory": "memory", "stores.kv.changelog": "kafka.t"}
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(values)


def test_a_file_snapshot_store_takes_no_object_store_keys():
    values = {"job.name": "j", "systems.kafka.type": "kafka", "systems.kafka.bootstrap.servers": "127.0.0.1:1",
              "systems.kafka.snapshots.path": "file:///tmp/x", "systems.kafka.snapshots.config.region": "eu",
              "stores.kv.factory": "memory", "stores.kv.changelog": "kafka.t"}
    with pytest.raises(ConfigError, match=r"config\.region: not used with a file:// path"):
        Config.from_dict(values)


def kafka_job(kafka_broker: str, tmp_path: Path, snapshots: dict[str, Any], job: str | None = None) -> dict[str, Any]:
    job = job or unique("ship")
    return {
        "job.name": job,
        "job.state.dir": str(tmp_path / "machine-a"),
        "job.changelog.system": "kafka",
        "systems.kafka.bootstrap.servers": kafka_broker,
        "systems.kafka.checkpoint.topic": f"{job}-checkpoints",
        **{f"systems.kafka.snapshots.{k}": v for k, v in snapshots.items()},
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": f"kafka.{job}-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        INTERVAL: 0,
    }


INTERVAL = "stores.kv.rocksdb.snapshot.interval.records"


@pytest.mark.kafka
@pytest.mark.s3
def test_kafka_ships_snapshots_to_s3(kafka_broker, s3_server, tmp_path):
    bucket = s3_server.create_bucket()
    s3 = {k.split(".", 2)[2]: v for k, v in objectstore_options(s3_server.endpoint, bucket, "snaps").items()
          if not k.endswith(".type")}
    values = kafka_job(kafka_broker, tmp_path, s3)
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(values), range(4), model)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any("/snapshots/" in k for k in keys) and any("/sst/" in k for k in keys)
    with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
        assert s.last_restore["kv"].records == 0
        assert dump(s) == model


@pytest.mark.kafka
def test_a_recreated_kafka_topic_never_gets_the_old_topics_snapshots(kafka_broker, tmp_path):
    """The changelog and checkpoint topics are deleted and the job starts over under the
    same names: the old topic's snapshots (at offsets the new topic reaches again) are
    keyed by the old topic's id and are never fetched into the new log's state."""
    from tests.test_kafka_changelog import delete_topics

    shared = {"path": f"file://{tmp_path / 'shared'}"}
    values = kafka_job(kafka_broker, tmp_path, shared)
    commit_batches(Config.from_dict(values), range(6), {}, keys=1000)
    delete_topics(kafka_broker, [f"{values['job.name']}-kv", f"{values['job.name']}-checkpoints"])
    time.sleep(1)
    # the new log ships its first snapshot only (a long interval): the old log's newer
    # ones stay the newest by offset
    fresh = {**values, "job.state.dir": str(tmp_path / "machine-new"), INTERVAL: 1_000_000}
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(fresh), range(100, 108), model, keys=1000)
    with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
        assert dump(s) == model


def test_files_an_older_writer_left_without_a_manifest_are_deleted_by_the_next_snapshot(tmp_path):
    """An upload killed before its manifest (the ``snapshot.ship.before_manifest`` kill of
    the crash trials) leaves files no manifest names: the next writer's clean-up deletes
    them; its own and the kept snapshots' files stay."""
    values = file_job(tmp_path)
    model: dict[str, int] = {}
    commit_batches(Config.from_dict(values), range(2), model)
    leftover = shipped_dir(values) / "sst" / "0000000001-000099.sst"
    leftover.write_bytes(b"half an upload")
    commit_batches(Config.from_dict(values), range(2, 4), model)
    assert not leftover.exists()
    with TaskStorage(on_another_machine(values, tmp_path, "machine-b")) as s:
        assert s.last_restore["kv"].records == 0
        assert dump(s) == model


def test_inspect_shows_the_newest_shipped_snapshot(tmp_path):
    from click.testing import CliRunner
    from localstate.cli import cli

    values = file_job(tmp_path)
    commit_batches(Config.from_dict(values), range(3), {})
    out = CliRunner().invoke(cli, ["inspect", "--json", str(tmp_path / "changelog")])
    assert out.exit_code == 0, out.output
    import json

    [row] = json.loads(out.output)["partitions"]
    offsets = sorted(int(p.name[:20]) for p in (shipped_dir(values) / "snapshots").iterdir())
    assert row["shipped_snapshots"] == offsets and len(offsets) == 2
    table = CliRunner().invoke(cli, ["inspect", str(tmp_path / "changelog")], env={"COLUMNS": "250"}).output
    assert "shipped snapshot" in table and f"{offsets[-1]} (+1 older)" in table
