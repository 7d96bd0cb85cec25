"""Quix Streams' changelog replay of one store partition, timed: run by
``benchmarks/kafka_restore.py`` with the interpreter of a virtualenv where
``quixstreams==3.28.1`` is installed (its confluent-kafka pin differs from ours).

Usage: ``python quix_replay.py BOOTSTRAP TOPIC RECORDS STATE_DIR`` prints one JSON line
``{"seconds": ..., "cpu": ..., "records": ...}``.

What runs is Quix's own recovery path for each changelog message, as its
``RecoveryManager._recovery_loop`` drives it: ``consumer.poll()`` of one message, then
``RecoveryPartition.recover_from_changelog_message`` into a ``RocksDBStorePartition``
(header parsing, one RocksDB write batch per message), then the partition is closed
(flushed). The consumer reads to partition EOF (the tansu broker understates the high
watermark Quix would otherwise stop at). Only Quix's public state classes are used;
nothing here is copied from Quix.
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition
from quixstreams.state.recovery import RecoveryPartition
from quixstreams.state.rocksdb.partition import RocksDBStorePartition


def main(bootstrap: str, topic: str, records: int, state_dir: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "quix-replay-bench", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    t0, c0 = time.perf_counter(), time.thread_time()
    store = RocksDBStorePartition(state_dir)
    recovery = RecoveryPartition(changelog_name=topic, partition_num=0, store_partition=store,
                                 committed_offsets={}, lowwater=0, highwater=records)
    n = 0
    while True:
        msg = consumer.poll(1)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                break
            raise RuntimeError(str(err))
        recovery.recover_from_changelog_message(msg)
        n += 1
    store.close()
    seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    consumer.close()
    print(json.dumps({"seconds": seconds, "cpu": cpu, "records": n}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
