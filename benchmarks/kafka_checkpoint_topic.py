"""What a Kafka task open costs as the shared checkpoint topic grows, by its segment size.

A task's open reads the checkpoint topic from its start and a broker compacts only rolled
segments, so the active segment is what an open reads beyond about one record per task.
An Apache Kafka node (:class:`localstate.testing.apache_kafka.ApacheKafkaBroker`: tansu
does not compact) is started on 127.0.0.1; one job's checkpoint topic is created by
localstate (``segment.bytes`` = :data:`~localstate.changelog.kafka.client.CHECKPOINT_SEGMENT_BYTES`),
another job's beforehand with Kafka's default 1 GiB segments. Task opens (one rocksdb
store) are timed on the empty topics, then both topics get the same ``--records``
checkpoint-sized records of 64 other tasks, and opens are timed at once and again after
the broker's log cleaner had time to run::

    python -m localstate.benchmarks.kafka_checkpoint_topic --records 300000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localstate.config import Config

__all__ = ["main"]

OTHER_TASKS = 64
RECORD_BYTES = 300
CLEANER_WAIT_S = 45.0
"""Long enough for the node's log cleaner (``log.cleaner.backoff.ms`` 15 s) to compact."""


def _open_ms(config: Config, opens: int) -> tuple[float, float, float]:
    """Median, min and max milliseconds of ``opens`` task opens (store opened, then closed)."""
    from localstate.storage import TaskStorage

    times = []
    for _ in range(opens):
        started = time.perf_counter()
        with TaskStorage(config, 0) as storage:
            storage.store("kv")
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), min(times), max(times)


def _fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = b"x" * RECORD_BYTES
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, f"other-job/{i % OTHER_TASKS}".encode())
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120) > 0:
        raise RuntimeError(f"records to {topic!r} were not all delivered")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--opens", type=int, default=7)
    args = parser.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic
    from localstate.config import Config
    from localstate.storage import TaskStorage
    from localstate.testing.apache_kafka import ApacheKafkaBroker

    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-topic-"))
    try:
        with ApacheKafkaBroker() as broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("ckpt-default", 1, 1, config={
                "cleanup.policy": "compact", "segment.bytes": str(1 << 30)})])["ckpt-default"].result(30)
            sides = {"segment.bytes 8 MiB (created by localstate)": "ckpt-small",
                     "segment.bytes 1 GiB (Kafka's default)": "ckpt-default"}
            configs = {}
            for name, topic in sides.items():
                job = f"job-{topic}"
                configs[name] = config = Config.from_dict({
                    "job.name": job, "job.state.dir": str(root / job), "stores.kv.factory": "rocksdb",
                    "stores.kv.changelog": f"kafka.{job}-kv", "stores.kv.key.serde": "string",
                    "stores.kv.msg.serde": "string", "systems.kafka.bootstrap.servers": broker.bootstrap,
                    "systems.kafka.checkpoint.topic": topic})
                with TaskStorage(config, 0) as storage:
                    storage.store("kv").put("a", "b")
                    storage.commit(input_position=1)

            def report(when: str) -> None:
                for name, config in configs.items():
                    median, low, high = _open_ms(config, args.opens)
                    print(f"{when:<40} {name:<45} open {median:7.1f} ms  (min {low:.1f}, max {high:.1f})", flush=True)

            report("empty topic")
            for topic in sides.values():
                _fill(broker.bootstrap, topic, args.records)
            report(f"+{args.records:,} records, at once")
            time.sleep(CLEANER_WAIT_S)
            report(f"+{args.records:,} records, {CLEANER_WAIT_S:.0f} s later")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
