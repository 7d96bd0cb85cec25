"""The issue's proof on a real local Spark session: run an example job at 4 partitions,
rescale it to 6 and to 3 (the latter as a Spark job, ``rescale(spark=...)``), run on,
and compare state and output with the same job run at the new count from the start.
Library-level cases (each engine, each refusal, crashes) are in tests/test_rescale.py."""

from __future__ import annotations

import pyarrow as pa
import pytest
from localstate import ConfigError
from localstate.contrib.spark import StatefulJob
from localstate.contrib.spark.job_engines import DistinctViewers, TrendingPages
from localstate.contrib.spark.job_joins import ProfileSettingsJoin
from localstate.contrib.spark.jobs import job_config, snapshot_state
from localstate.contrib.spark.streaming import committed_batches, rescaled_position
from localstate.contrib.spark.workload import generate
from localstate.partitioning import task_for
from localstate.rescale import rescale


def _run(spark, config, table: pa.Table, task: type = ProfileSettingsJoin) -> list[tuple]:
    job = StatefulJob(config, task, key=task.KEY, output_schema=task.OUTPUT_SCHEMA)
    out = job.run(spark.createDataFrame(table)).toArrow()
    return sorted(tuple(r.values()) for r in out.to_pylist())


@pytest.mark.parametrize("task,targets", [
    (ProfileSettingsJoin, ((6, False), (3, True))),  # three key-value stores; 4 -> 3 as a Spark job
    (DistinctViewers, ((6, False),)),                # hyperloglog sketches keyed by page
])
def test_rescaled_job_equals_a_job_run_at_the_new_count_from_the_start(spark, tmp_path, task, targets):
    table = task.input_table(generate(3_000, seed=11))
    first, second = table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)
    for to, on_spark in targets:
        old = job_config(task, tmp_path / f"to{to}", partitions=4)
        _run(spark, old, first, task)
        result = rescale(old, to, input_position=rescaled_position, spark=spark if on_spark else None)
        new = result.config
        assert (result.from_partitions, result.to_partitions, result.version) == (4, to, 0)
        assert set(committed_batches(new).values()) == {0}
        direct = job_config(task, tmp_path / f"direct{to}", partitions=to)
        _run(spark, direct, first, task)
        # Every key's state sits in the task Spark routes its rows to ...
        rescaled_state, direct_state = snapshot_state(new), snapshot_state(direct)
        suffix = 2 if task is DistinctViewers else 0  # a sketch's record key: page + register index
        for (store, q), items in rescaled_state.items():
            assert all(task_for(k[:len(k) - suffix].decode(), to) == q for k in items if k != b"\x00"), store
        assert rescaled_state == direct_state
        # The batch the job was rescaled at cannot be applied again (its pre-state is gone) ...
        job = StatefulJob(new, task, key=task.KEY, output_schema=task.OUTPUT_SCHEMA)
        with pytest.raises(Exception, match="micro-batch 0 is the batch the job was rescaled at"):
            job.run(spark.createDataFrame(first), version=0)
        # ... and running on gives what the job at the new count gives.
        out_rescaled, out_direct = _run(spark, new, second, task), _run(spark, direct, second, task)
        assert out_rescaled and out_rescaled == out_direct
        assert snapshot_state(new) == snapshot_state(direct)
        # The old count no longer runs (after a scale-down StatefulJob.run already refuses on the
        # missing checkpoint of old task 3, before a task opens the changelog).
        with pytest.raises(Exception, match=f"has {to} partitions but the job has job.partitions = 4|"
                                            "if the job was rescaled with `localstate rescale --to N`"):
            _run(spark, old, second, task)


def test_a_job_with_a_top_n_heap_is_refused(spark, tmp_path):
    config = job_config(TrendingPages, tmp_path, partitions=4)
    _run(spark, config, TrendingPages.input_table(generate(1_000, seed=3)), TrendingPages)
    with pytest.raises(ConfigError, match="store 'top' .topn. cannot be rescaled"):
        rescale(config, 6)
    assert set(committed_batches(config).values()) == {0}


def test_cli_rescale_on_spark(spark, tmp_path):
    """``localstate rescale --spark``: the same result as the library path, config file updated."""
    from click.testing import CliRunner
    from localstate import Config, TaskStorage
    from localstate.cli import cli

    props = tmp_path / "job.properties"
    values = {"job.name": "cli", "job.partitions": 4, "job.state.dir": str(tmp_path / "state"),
              "systems.file.path": str(tmp_path / "changelog"), "stores.counts.factory": "rocksdb",
              "stores.counts.key.serde": "string", "stores.counts.msg.serde": "long"}
    props.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    config = Config.load(props)
    users = [f"u{i}" for i in range(500)]
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("counts").put_all([(u, i) for i, u in enumerate(users) if task_for(u, 4) == p])
            storage.commit("pos", version=2)
    master = spark.sparkContext.master
    out = CliRunner().invoke(cli, ["rescale", "-c", str(props), "--to", "2", "--spark", "--master", master])
    assert out.exit_code == 0, out.output
    new = Config.load(props)
    assert new.partitions == 2
    for q in range(2):
        with TaskStorage(new, q) as storage:
            with storage.store("counts").all() as items:
                assert dict(items) == {u: i for i, u in enumerate(users) if task_for(u, 2) == q}


@pytest.mark.parametrize("kind", ["objectstore", "kafka"])
def test_rescale_on_spark_writes_the_next_generation(spark, tmp_path, request, kind):
    """``rescale(spark=...)`` of a job on moto S3 / the tansu broker: executors write the
    new partitions straight into generation 1; the driver commits it."""
    import os

    from localstate import Config, TaskStorage

    job = f"sparkrescale-{os.urandom(3).hex()}"
    values = {"job.name": job, "job.partitions": 4, "job.state.dir": str(tmp_path / "state"),
              "stores.counts.factory": "memory", "stores.counts.key.serde": "string",
              "stores.counts.msg.serde": "long"}
    if kind == "objectstore":
        from localstate.testing.s3 import objectstore_options

        server = request.getfixturevalue("s3_server")
        values.update({"job.changelog.system": "s3", "stores.counts.changelog": f"s3.{job}-counts",
                       **objectstore_options(server.endpoint, server.create_bucket(), job)})
    else:
        values.update({"job.changelog.system": "kafka", "stores.counts.changelog": f"kafka.{job}-counts",
                       "systems.kafka.bootstrap.servers": request.getfixturevalue("kafka_broker"),
                       "systems.kafka.checkpoint.topic": f"{job}-ckpt"})
    config = Config.from_dict(values)
    users = [f"u{i}" for i in range(300)]
    for p in range(4):
        with TaskStorage(config, p) as storage:
            storage.store("counts").put_all([(u, i) for i, u in enumerate(users) if task_for(u, 4) == p])
            storage.commit("pos", version=2)
    result = rescale(config, 3, spark=spark)
    assert result.records == {"counts": 300}
    for q in range(3):
        with TaskStorage(result.config, q) as storage:
            assert storage.changelog("counts").stream == f"{job}-counts.gen1"
            with storage.store("counts").all() as items:
                assert dict(items) == {u: i for i, u in enumerate(users) if task_for(u, 3) == q}


def test_a_spark_job_on_an_object_store_rescaled_equals_one_run_at_the_new_count(spark, tmp_path, s3_server):
    """The issue's proof for the objectstore changelog (moto S3): ProfileSettingsJoin run
    by StatefulJob at 4 partitions, rescaled 4 -> 3 on Spark (a new generation), run on,
    and compared with the job run at 3 from the start."""
    from localstate.testing.s3 import objectstore_options

    task = ProfileSettingsJoin
    bucket = s3_server.create_bucket()

    def config(name: str, partitions: int):
        return job_config(task, tmp_path / name, partitions=partitions, extra={
            "job.changelog.system": "s3", **objectstore_options(s3_server.endpoint, bucket, name)})

    table = task.input_table(generate(2_000, seed=12))
    first, second = table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)
    old, direct = config("rescaled", 4), config("direct", 3)
    _run(spark, old, first, task)
    _run(spark, direct, first, task)
    new = rescale(old, 3, input_position=rescaled_position, spark=spark).config
    assert snapshot_state(new) == snapshot_state(direct)
    out_rescaled, out_direct = _run(spark, new, second, task), _run(spark, direct, second, task)
    assert out_rescaled and out_rescaled == out_direct
    assert snapshot_state(new) == snapshot_state(direct)
