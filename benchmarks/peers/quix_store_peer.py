"""The peer row of ``kafka.store_put`` / ``kafka.store_get``: Quix Streams' ``RocksDBStore``
with a Kafka changelog, on the same keys, broker and commit size.

Run as a script by :mod:`localstate.benchmarks.kafka_changelog`, in an interpreter where
``quixstreams`` is installed (3.28.1 requires ``confluent-kafka<2.13``, older than
localstate's environment may hold, so it usually lives in a venv of its own:
``LOCALSTATE_QUIX_PYTHON=/path/to/venv/bin/python``).
It imports nothing from localstate, prints one JSON object and exits::

    python quix_store_peer.py --bootstrap 127.0.0.1:9092 --records 1000000 --seed 1

Per commit of ``--commit-every`` keys, as Quix's own checkpoint does: one partition
transaction, ``set_bytes`` per record, ``prepare()`` (changelog produce), producer
``flush()``, then ``flush(changelog_offset)`` (the RocksDB write batch). Gets are
``get_bytes`` per record in a fresh transaction, the same keys in the same order.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid


def keys_of(records: int, seed: int, key_bytes: int = 16) -> list[bytes]:
    """The benchmark's keys: ``records`` random ``key_bytes``-byte strings from ``seed``."""
    blob = random.Random(seed).randbytes(key_bytes * records)
    return [blob[i : i + key_bytes] for i in range(0, len(blob), key_bytes)]


def value_of(seed: int, value_bytes: int = 100) -> bytes:
    return random.Random(seed + 1).randbytes(value_bytes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--commit-every", type=int, default=10_000)
    args = parser.parse_args()

    from confluent_kafka.admin import AdminClient, NewTopic
    from quixstreams.internal_producer import InternalProducer
    from quixstreams.state.recovery import ChangelogProducerFactory
    from quixstreams.state.rocksdb import RocksDBStore

    keys = keys_of(args.records, args.seed)
    value = value_of(args.seed)
    topic = f"quix-changelog-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    producer = InternalProducer(broker_address=args.bootstrap)
    with tempfile.TemporaryDirectory(prefix="quix-peer-") as base:
        store = RocksDBStore(name="kv", stream_id="bench", base_dir=base,
                             changelog_producer_factory=ChangelogProducerFactory(topic, producer))
        partition = store.assign_partition(0)
        every = args.commit_every
        t0 = time.perf_counter()
        for start in range(0, len(keys), every):
            tx = partition.begin()
            set_bytes = tx.set_bytes
            for key in keys[start : start + every]:
                set_bytes(key, value, b"")
            tx.prepare(processed_offsets={"input": start})
            producer.flush()
            offset = producer.offsets.get((topic, 0))
            tx.flush(changelog_offset=offset)
        put_s = time.perf_counter() - t0
        tx = partition.begin()
        get_bytes = tx.get_bytes
        t0 = time.perf_counter()
        for key in keys:
            if get_bytes(key, b"") is None:
                raise SystemExit(f"quix peer: key {key!r} was written but is missing")
        get_s = time.perf_counter() - t0
        store.close()
    admin.delete_topics([topic])
    print(json.dumps({"puts_per_s": len(keys) / put_s, "gets_per_s": len(keys) / get_s}))


if __name__ == "__main__":
    main()
