"""The store counters in a streaming query's observed metrics are the real counts.

A real local Spark streaming query (the tasks run inside the query's plan) whose task
puts and deletes: the ``localstate.<store>`` observation carries ``puts`` and ``deletes``
under their own names (as documented in docs/metrics.md), equal to ``numRowsUpdated`` and
``numRowsRemoved`` — not nulls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage

pytestmark = pytest.mark.spark


def test_observed_metrics_carry_the_real_puts_and_deletes(spark: Any, tmp_path: Path) -> None:
    from localstate.contrib.spark import Emitter, StatefulJob, StreamTask, TaskContext

    class PutsAndDeletes(StreamTask):
        def init(self, context: TaskContext) -> None:
            self.seen = context.store("seen")

        def process(self, record: dict[str, Any], emit: Emitter) -> None:
            if record["op"] == "put":
                self.seen[record["user_id"]] = 1
            else:
                self.seen.delete(record["user_id"])

    config = Config.from_dict({
        "job.name": "observed", "job.partitions": 2, "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        "stores.seen.factory": "rocksdb", "stores.seen.changelog": "file.observed-seen",
        "stores.seen.key.serde": "string", "stores.seen.msg.serde": "long", "stores.seen.object.cache.size": 1000,
    })
    src = tmp_path / "in"
    src.mkdir()
    lines = [f'{{"user_id": "u{i}", "op": "put"}}' for i in range(5)]
    lines += [f'{{"user_id": "u{i}", "op": "del"}}' for i in (1, 3)]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    job = StatefulJob(config, PutsAndDeletes, key="user_id", output_schema="user_id string")
    from localstate.contrib.spark.sources import register_sources

    register_sources(spark)
    stream = spark.readStream.format("localstate-jsonl").schema("user_id string, op string").load(str(src))
    query = job.run_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    observed = query.lastProgress["observedMetrics"]["localstate.seen"].asDict()
    assert (observed["puts"], observed["deletes"]) == (5, 2), observed
    assert (observed["numRowsUpdated"], observed["numRowsRemoved"]) == (5, 2), observed
    assert all(value is not None for name, value in observed.items() if name != "numRowsTotal"), observed
    live = {}
    for p in range(2):
        with TaskStorage(config, p) as storage:
            live.update(storage.store("seen"))
    assert live == {"u0": 1, "u2": 1, "u4": 1}
