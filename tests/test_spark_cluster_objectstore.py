"""The executor-kill run of test_spark_cluster.py with the changelog and the task
checkpoints on a real S3 API (moto_server on 127.0.0.1) instead of a shared directory.

Each executor keeps its own ``job.state.dir``; the only thing the executors share is
the S3 bucket. The same assertions as the file-changelog run: every planned executor
kill happened, tasks moved and restored from the bucket, every micro-batch's output
and the final state are exact (exactly once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from localstate.testing.s3 import MotoServer
from localstate.testing.spark_cluster_driver import OBJECTSTORE_ENV

from .test_spark_cluster import KILLS, ClusterRun, _remove_spark_work_dir, _run_cluster
from .test_spark_cluster import test_batch_job_on_two_executors_counts_exactly as check_batch
from .test_spark_cluster import (
    test_executors_killed_mid_stream_tasks_move_restore_and_stay_exactly_once as check_stream,
)

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]


@pytest.fixture(scope="module")
def s3_cluster_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRun]:
    mp = pytest.MonkeyPatch()
    with MotoServer() as server:
        # read by cluster_config in this process and in the driver it starts
        mp.setenv(OBJECTSTORE_ENV, json.dumps({"endpoint": server.endpoint, "bucket": server.create_bucket()}))
        try:
            run = _run_cluster(tmp_path_factory.mktemp("cluster-s3"), KILLS)
            yield run
        finally:
            mp.undo()
    _remove_spark_work_dir(run.result.get("app_id"))


def test_batch_job_on_two_executors_with_state_on_s3(s3_cluster_run: ClusterRun, monkeypatch) -> None:
    assert not (s3_cluster_run.root / "batch" / "changelog").exists(), "the file changelog was used"
    check_batch(s3_cluster_run)


def test_executors_killed_mid_stream_restore_from_s3_exactly_once(s3_cluster_run: ClusterRun) -> None:
    check_stream(s3_cluster_run, leftover_rebuilds=True)
