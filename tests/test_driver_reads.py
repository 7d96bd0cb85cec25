"""What the Spark driver reads between runs writes nothing a running task could trip on.

``committed_batches`` (every ``job.run`` / stream start asks it for the next version) and
the demo's ``committed_records`` read every task's checkpoint. On the objectstore and
Kafka changelogs a checkpoint read *by a writer* claims the task (a claim object; a
transactional producer), which fences the instance that runs it. Read from the driver
they must not: a task committing beside them never fails. Real moto S3, file:// and the
tansu Kafka broker.
"""

from __future__ import annotations

from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.testing.changelog_conformance import task_values
from localstate.testing.s3 import QUICK_RETRIES, objectstore_options


@pytest.fixture(params=["s3", "file", "kafka"])
def system_values(request, tmp_path) -> dict[str, Any]:
    if request.param == "kafka":
        return {"job.changelog.system": "kafka",
                "systems.kafka.bootstrap.servers": request.getfixturevalue("kafka_broker")}
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        where = objectstore_options(server.endpoint, server.create_bucket(), **QUICK_RETRIES)
    else:
        where = {"systems.s3.type": "objectstore", "systems.s3.path": f"file://{tmp_path}/objects",
                 **{f"systems.s3.{k}": v for k, v in QUICK_RETRIES.items()}}
    return {"job.changelog.system": "s3", "job.checkpoint.system": "s3", **where}


def test_the_drivers_checkpoint_reads_never_fence_a_running_task(system_values, tmp_path):
    from localstate.contrib.spark.demo import committed_records
    from localstate.contrib.spark.streaming import committed_batches

    values = task_values(system_values, tmp_path)
    config = Config.from_dict(values)
    with TaskStorage(config) as task:
        for version in range(1, 6):
            task.store("kv").put(f"k{version}", version)
            task.commit(input_position=version, version=version)
            assert committed_batches(config) == {0: version}
            assert committed_records(config) >= version
    with TaskStorage(config) as again:
        assert again.checkpoint.version == 5
