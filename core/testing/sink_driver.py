"""A streaming driver whose output goes to an exactly-once sink, for the sinks' kill tests.

::

    python -m localstate.testing.sink_driver --root DIR --input DIR --sink file
    python -m localstate.testing.sink_driver --root DIR --input DIR --sink kafka --bootstrap HOST:PORT --topic T

It runs the :class:`~localstate.testing.spark.KeyCount` job (rocksdb, file changelog under
``ROOT/job``) on ``local[2]`` over the JSON-lines files under ``--input``, one file per
micro-batch (``availableNow``), with ``output=`` a
:class:`~localstate.contrib.spark.sinks.FileSink` (``ROOT/out``, JSON) or a
:class:`~localstate.contrib.spark.sinks.KafkaSink` (transactional id
:data:`TRANSACTIONAL_ID`, key = the ``key`` column, markers in ``<topic>-markers``). A test arms fault points of the sink
through ``LOCALSTATE_FAULTS`` (:mod:`localstate.faults`) to SIGKILL the driver at an exact
moment, then starts it again on the same root. ``ROOT/result.json`` is written last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["TRANSACTIONAL_ID", "JOB_NAME", "job_config", "create_topic", "read_topic", "main"]

TRANSACTIONAL_ID = "sink-driver-out"
JOB_NAME = "sinkjob"


def job_config(root: Path, partitions: int) -> Any:
    """The job's config: rocksdb ``counts`` and the file changelog under ``root/job``."""
    from localstate.testing.spark import key_count_config

    return key_count_config(root / "job", partitions=partitions, engine="rocksdb", name=JOB_NAME)


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    """A new topic of ``partitions`` partitions on ``bootstrap``; its name."""
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"sink-out-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def read_topic(bootstrap: str, topic: str, *, isolation: str = "read_committed") -> list[tuple[str | None, Any]]:
    """Every record of ``topic`` a reader with ``isolation`` sees: ``(key, value as JSON)``.
    Waits for committed transactions' records to become readable (their markers are
    written after ``commit_transaction`` returns)."""
    from localstate.changelog.kafka.client import KafkaClient, KafkaSettings

    client = KafkaClient(KafkaSettings(bootstrap_servers=bootstrap, timeout_ms=10_000), where="test",
                         group_id="test-reader")
    consumer = client.consumer(isolation)
    out = []
    try:
        for p in client.partitions(topic):
            _, high = client.watermarks(client.probe(), topic, p)
            for msgs, _ in client.scan(consumer, topic, p, 0, high):
                out += [(m.key().decode() if m.key() is not None else None, json.loads(m.value())) for m in msgs]
    finally:
        consumer.close()
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--sink", required=True, choices=["file", "kafka"])
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--topic", default="")
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args(argv)

    from localstate.contrib.spark import StatefulJob, spark_session
    from localstate.contrib.spark.sinks import FileSink, KafkaSink
    from localstate.testing.spark import KeyCount, key_count_task

    t0 = time.monotonic()
    sink: Any = (FileSink(args.root / "out", format="json") if args.sink == "file"
                 else KafkaSink(args.bootstrap, args.topic, transactional_id=TRANSACTIONAL_ID, key="key",
                                marker_topic=f"{args.topic}-markers"))
    spark = spark_session("local[2]", app_name="localstate-sink-driver",
                          **{"spark.sql.shuffle.partitions": str(args.partitions)})
    result: dict[str, Any] = {"status": "failed"}
    try:
        job = StatefulJob(job_config(args.root, args.partitions), key_count_task("user_id"), key="user_id",
                          output_schema=KeyCount.OUTPUT_SCHEMA)
        stream = spark.readStream.schema("user_id string").option("maxFilesPerTrigger", 1).json(str(args.input))
        query = job.run_stream(stream, checkpoint_location=str(args.root / "spark-checkpoint"),
                               trigger={"availableNow": True}, output=sink)
        query.awaitTermination()
        last = query.lastProgress
        result = {"status": "ok", "last_batch": last["batchId"] if last else None}
    finally:
        result["seconds"] = time.monotonic() - t0
        (args.root / "result.json").write_text(json.dumps(result))
        if isinstance(sink, KafkaSink):
            sink.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
