"""Kafka changelog figures against raw confluent-kafka, on a tansu broker started here.

Records are 116 bytes (16-byte key, 100-byte value), as in the issue.

* ``kafka.append`` — ``append()`` in chunks of 500 (the default ``write.batch.size``)
  then ``flush()`` (the transaction commit: every record acknowledged), against a raw
  idempotent ``acks=all`` producer doing ``produce()`` per record then ``flush()``.
  With 4 partitions, records go to the partitions chunk by chunk; ours writes through
  one transactional producer per task partition (4), raw through one producer.
* ``kafka.restore`` — ``read_batches(0, end)`` of the whole partition, against a raw
  consumer (same ``fetch.queue.backoff.ms=10``, ``fetch.wait.max.ms=10``) taking ``(key, value)`` of each
  message to partition EOF. With 4 partitions, ours restores them as 4 tasks would
  (one thread and consumer each); raw uses one consumer assigned all 4.
  ``raw-default`` is the raw consumer with librdkafka's default fetch settings
  (``fetch.queue.backoff.ms=1000``), for the effect of the tuning.
* ``kafka.restore_store`` — a whole ``TaskStorage`` open (checkpoint read, fencing,
  restore into the ``memory`` engine, tail check) of the 1-partition topic.
* ``kafka.store_put`` / ``kafka.store_get`` — the per-record path users feel: a rocksdb
  store with a Kafka changelog (bytes serdes, default object cache), random 16-byte keys,
  ``put`` per record and ``commit()`` per 10,000 (the exactly-once transaction), then
  ``get`` per record; against raw rocksdict (``WriteBatch`` per 10,000 keys, ``get``; no
  changelog) and Quix Streams' ``RocksDBStore`` with its changelog on the same broker
  (:mod:`localstate.benchmarks.peers.quix_store_peer`, run in ``LOCALSTATE_QUIX_PYTHON``; an
  error row when quixstreams is not installed). The three alternate per repeat.

Each cell: one warm-up run, then ``repeats`` timed runs; rows in records/s and MB/s.
The broker and the client share the machine, so figures are client+broker bound.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from localstate import Config, TaskStorage
from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.checkpoint import Checkpoint
from localstate.testing.kafka import TansuBroker

from .peers import quix_python, run_peer
from .runner import add_ratios, error_row, make_row
from .timing import Stopwatch, timed_runs

__all__ = ["run"]

KEY_BYTES = 16
VALUE_BYTES = 100
RECORD_BYTES = KEY_BYTES + VALUE_BYTES
CHUNK = 500
_TUNED_CONSUMER = {"fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 10}


def _records(n: int) -> list[tuple[bytes, bytes]]:
    value = bytes(range(VALUE_BYTES))
    return [(b"%016d" % i, value) for i in range(n)]


def _chunks(records: list[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
    return [records[i : i + CHUNK] for i in range(0, len(records), CHUNK)]


def _topic(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


class _Bench:
    def __init__(self, broker: TansuBroker, n: int, repeats: int) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap
        self.n = n
        self.repeats = repeats
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.records = _records(n)
        self.chunks = _chunks(self.records)
        self.warmup = _topic("warmup")
        self.create(self.warmup, 1)

    # -- helpers -----------------------------------------------------------------------------
    def create(self, topic: str, partitions: int) -> None:
        new = NewTopic(topic, partitions, 1, config={"cleanup.policy": "compact"})
        self.admin.create_topics([new])[topic].result(30)

    def delete(self, topic: str) -> None:
        try:
            self.admin.delete_topics([topic])[topic].result(30)
        except Exception:  # best effort: only frees broker memory
            pass

    def timed(self, setup: Callable[[], Any], body: Callable[[Any], None], teardown: Callable[[Any], None]) -> list[float]:
        """Warm-up + ``repeats`` runs; returns seconds of the timed runs (setup and teardown untimed)."""
        return timed_runs(body, self.repeats, setup=setup, teardown=teardown)

    def rows(self, workload: str, engine: str, params: dict[str, Any], seconds: list[float],
             baseline: str | None, notes: str) -> list[dict[str, Any]]:
        rate = [self.n / s for s in seconds]
        mbps = [self.n * RECORD_BYTES / 1e6 / s for s in seconds]
        return [
            make_row(workload, engine, params, "records/s", rate, baseline=baseline, notes=notes),
            make_row(workload, engine, params, "MB/s", mbps, baseline=baseline, notes=notes),
        ]

    # -- append ------------------------------------------------------------------------------
    def ours_append(self, partitions: int) -> list[float]:
        def setup() -> Any:
            topic = _topic("append")
            system = KafkaChangelogSystem("kafka", {"bootstrap.servers": self.bootstrap}, _topic("job"))
            parts = [system.open_partition(topic, p, partitions) for p in range(partitions)]
            return topic, system, parts

        def body(ctx: Any) -> None:
            _, _, parts = ctx
            for i, chunk in enumerate(self.chunks):
                parts[i % partitions].append(chunk)
            ends = [p.flush() for p in parts]
            assert sum(ends) >= self.n

        def teardown(ctx: Any) -> None:
            topic, system, parts = ctx
            for p in parts:
                p.close()
            system.close()
            self.delete(topic)

        return self.timed(setup, body, teardown)

    def raw_append(self, partitions: int) -> list[float]:
        def setup() -> Any:
            topic = _topic("raw-append")
            self.create(topic, partitions)
            producer = Producer({
                "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            })
            # connect and get the idempotent producer id outside the timer, as ours does
            producer.produce(self.warmup, b"w", b"w")
            producer.flush(30)
            return topic, producer

        def body(ctx: Any) -> None:
            topic, producer = ctx
            produce = producer.produce
            for i, chunk in enumerate(self.chunks):
                part = i % partitions
                for key, value in chunk:
                    try:
                        produce(topic, value, key, part)
                    except BufferError:
                        producer.poll(0.05)
                        produce(topic, value, key, part)
            if producer.flush(60) != 0:
                raise RuntimeError("raw producer did not deliver every record")

        def teardown(ctx: Any) -> None:
            self.delete(ctx[0])

        return self.timed(setup, body, teardown)

    # -- restore -----------------------------------------------------------------------------
    def fill(self, partitions: int) -> str:
        topic = _topic(f"restore{partitions}")
        self.create(topic, partitions)
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
        for i, chunk in enumerate(self.chunks):
            for key, value in chunk:
                while True:
                    try:
                        producer.produce(topic, value, key, i % partitions)
                        break
                    except BufferError:
                        producer.poll(0.05)
        if producer.flush(120) != 0:
            raise RuntimeError("could not fill the restore topic")
        return topic

    def ours_restore(self, topic: str, partitions: int) -> list[float]:
        def setup() -> Any:
            system = KafkaChangelogSystem("kafka", {"bootstrap.servers": self.bootstrap}, _topic("job"))
            parts = [system.open_partition(topic, p, partitions) for p in range(partitions)]
            ends = [p.end_offset() for p in parts]
            return system, parts, ends

        def read_one(part: Any, end: int) -> int:
            return sum(len(records) for records, _ in part.read_batches(0, end))

        def body(ctx: Any) -> None:
            _, parts, ends = ctx
            if partitions == 1:
                total = read_one(parts[0], ends[0])
            else:
                with ThreadPoolExecutor(partitions) as pool:
                    total = sum(pool.map(read_one, parts, ends))
            if total != self.n:
                raise RuntimeError(f"restored {total} records, expected {self.n}")

        def teardown(ctx: Any) -> None:
            system, parts, _ = ctx
            for p in parts:
                p.close()
            system.close()

        return self.timed(setup, body, teardown)

    def store_restore(self, topic: str) -> list[float]:
        """``TaskStorage`` open of a memory store whose checkpoint covers all of ``topic``."""
        job = _topic("job")
        base = {
            "job.name": job,
            "stores.kv.factory": "memory",
            "stores.kv.changelog": f"kafka.{topic}",
            "systems.kafka.bootstrap.servers": self.bootstrap,
            "systems.kafka.checkpoint.topic": f"{job}-checkpoints",
        }
        system = KafkaChangelogSystem("kafka", {"bootstrap.servers": self.bootstrap,
                                                "checkpoint.topic": f"{job}-checkpoints"}, job)
        part = system.open_partition(topic, 0, 1)
        end = part.end_offset()
        part.close()
        system.checkpoints().write(job, 0, Checkpoint(version=1, input_position=None, offsets={"kv": end}))
        system.close()
        tmp = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
        counter = iter(range(1 << 30))

        def setup() -> Config:
            return Config.from_dict({**base, "job.state.dir": str(tmp / str(next(counter)))})

        def body(config: Config) -> None:
            with TaskStorage(config) as storage:
                restored = storage.last_restore["kv"].records
            if restored != self.n:
                raise RuntimeError(f"restored {restored} records, expected {self.n}")

        try:
            return self.timed(setup, body, lambda config: None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def raw_restore(self, topic: str, partitions: int, tuned: bool) -> list[float]:
        def setup() -> Any:
            conf = {"bootstrap.servers": self.bootstrap, "group.id": "raw-bench", "enable.auto.commit": False,
                    "enable.partition.eof": True, "isolation.level": "read_committed"}
            if tuned:
                conf.update(_TUNED_CONSUMER)
            consumer = Consumer(conf)
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            return consumer

        def body(consumer: Any) -> None:
            records: list[tuple[bytes, bytes]] = []
            eofs = 0
            while eofs < partitions:
                msgs = consumer.consume(1000, 0)
                if not msgs:
                    first = consumer.poll(0.2)
                    msgs = [first] if first is not None else []
                for m in msgs:
                    err = m.error()
                    if err is None:
                        records.append((m.key(), m.value()))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        eofs += 1
                    else:
                        raise RuntimeError(str(err))
            if len(records) != self.n:
                raise RuntimeError(f"raw consumer read {len(records)} records, expected {self.n}")

        return self.timed(setup, body, lambda c: c.close())


STORE_COMMIT_EVERY = 10_000


def _store_ours(bootstrap: str, keys: list[bytes], value: bytes) -> tuple[float, ...]:
    """Per-record put (commit per 10k) then get through ``TaskStorage``; (puts/s, gets/s,
    puts per second of the main thread's CPU)."""
    job = _topic("store")
    root = Path(tempfile.mkdtemp(prefix="kafka-store-"))
    config = Config.from_dict({
        "job.name": job,
        "job.state.dir": str(root),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": f"kafka.{job}-kv",
        "stores.kv.key.serde": "bytes",
        "stores.kv.msg.serde": "bytes",
        "systems.kafka.bootstrap.servers": bootstrap,
        "systems.kafka.checkpoint.topic": f"{job}-checkpoints",
    })
    try:
        with TaskStorage(config) as storage:
            store = storage.store("kv")
            put, get, commit = store.put, store.get, storage.commit
            with Stopwatch(cpu=True) as puts:
                for start in range(0, len(keys), STORE_COMMIT_EVERY):
                    for key in keys[start : start + STORE_COMMIT_EVERY]:
                        put(key, value)
                    commit(input_position=start)
            with Stopwatch() as gets:
                for key in keys:
                    if get(key) is None:
                        raise RuntimeError(f"key {key!r} was written but is missing")
        return len(keys) / puts.wall, len(keys) / gets.wall, len(keys) / puts.thread
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _store_raw(keys: list[bytes], value: bytes) -> tuple[float, ...]:
    """Raw rocksdict, same options: a ``WriteBatch`` per 10k keys, then ``get`` per key."""
    import rocksdict
    from localstate.engines.rocksdb import RocksDBOptions

    root = Path(tempfile.mkdtemp(prefix="raw-store-"))
    try:
        db = rocksdict.Rdict(str(root / "db"), RocksDBOptions().to_native())
        with Stopwatch(cpu=True) as puts:
            for start in range(0, len(keys), STORE_COMMIT_EVERY):
                batch = rocksdict.WriteBatch(raw_mode=True)
                put = batch.put
                for key in keys[start : start + STORE_COMMIT_EVERY]:
                    put(key, value)
                db.write(batch)
        get = db.get
        with Stopwatch() as gets:
            for key in keys:
                if get(key) is None:
                    raise RuntimeError(f"raw rocksdict: key {key!r} was written but is missing")
        db.close()
        return len(keys) / puts.wall, len(keys) / gets.wall, len(keys) / puts.thread
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _store_quix(python: str, bootstrap: str, n: int, seed: int) -> tuple[float, ...]:
    figures = run_peer(python, "quix_store_peer.py", ["--bootstrap", bootstrap, "--records", str(n), "--seed", str(seed),
                                                      "--commit-every", str(STORE_COMMIT_EVERY)], 1800)
    return figures["puts_per_s"], figures["gets_per_s"]


NO_WRITE_BEHIND = "localstate, no write-behind"


def _store_ours_no_write_behind(bootstrap: str, keys: list[bytes], value: bytes) -> tuple[float, ...]:
    """:func:`_store_ours` with rocksdb's write-behind buffer off (the behaviour before it)."""
    from localstate.engines.rocksdb import RocksDBEngine

    saved = RocksDBEngine.write_behind_records
    RocksDBEngine.write_behind_records = 0
    try:
        return _store_ours(bootstrap, keys, value)
    finally:
        RocksDBEngine.write_behind_records = saved


def store_rows(bootstrap: str, n: int, repeats: int, *, report_missing_peer: bool = True,
               no_write_behind: bool = False) -> list[dict[str, Any]]:
    """``kafka.store_put`` / ``kafka.store_get``: ours, raw rocksdict and Quix, alternating.
    Without quixstreams the Quix rows are error cells (``report_missing_peer``) or left out
    (the quick CI form, which must not fail for an optional peer). ``no_write_behind``
    adds ours with rocksdb's write-behind buffer off to the same run."""
    from .peers.quix_store_peer import keys_of, value_of

    seed = 1
    keys, value = keys_of(n, seed), value_of(seed)
    python, why_not = quix_python()
    sides: dict[str, Callable[[], tuple[float, ...]]] = {
        "localstate rocksdb+kafka": lambda: _store_ours(bootstrap, keys, value),
        "raw rocksdict": lambda: _store_raw(keys, value),
    }
    if no_write_behind:
        sides[NO_WRITE_BEHIND] = lambda: _store_ours_no_write_behind(bootstrap, keys, value)
    if python is not None:
        sides["quix RocksDBStore+kafka"] = lambda: _store_quix(python, bootstrap, n, seed)
    runs: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
    for i in range(repeats + 1):
        for name, once in sides.items():
            figures = once()
            if i:  # the first round warms up every side
                runs[name].append(figures)
    params = {"records": n, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES,
              "commit_every": STORE_COMMIT_EVERY, "serdes": "bytes", "object.cache.size": 1000}
    rows: list[dict[str, Any]] = []
    notes = {
        "localstate rocksdb+kafka": "TaskStorage store: put per record, commit() per 10k (Kafka transaction)",
        "raw rocksdict": "WriteBatch per 10k keys (same native options, no changelog); get per key",
        NO_WRITE_BEHIND: "as ours, rocksdb's write-behind buffer off (each batch written as it comes)",
        "quix RocksDBStore+kafka": "quixstreams RocksDBStore partition transaction per 10k: set_bytes, "
                                   "prepare (changelog produce), producer flush, flush; get_bytes per key",
    }
    for workload, index, unit in (("kafka.store_put", 0, "puts/s"), ("kafka.store_get", 1, "gets/s")):
        for name, figures in runs.items():
            baseline = "raw rocksdict" if name in ("localstate rocksdb+kafka", NO_WRITE_BEHIND) else None
            row = make_row(workload, name, params, unit, [f[index] for f in figures], baseline=baseline,
                           notes=notes[name])
            rows.append(row)
        if "quix RocksDBStore+kafka" not in runs and report_missing_peer:
            rows.append(error_row(workload, "quix RocksDBStore+kafka", params, unit,
                                  why_not))
    for name, figures in runs.items():
        if len(figures[0]) > 2:  # the main thread's CPU (not measured for the Quix subprocess)
            baseline = "raw rocksdict" if name in ("localstate rocksdb+kafka", NO_WRITE_BEHIND) else None
            rows.append(make_row("kafka.store_put.cpu", name, params, "puts/cpu-s", [f[2] for f in figures],
                                 baseline=baseline, notes="puts per second of the main thread's CPU "
                                 "(thread_time): the work on the task's thread, steadier than wall time "
                                 "on a shared machine; the broker's and the client threads' work not included"))
    ours = {r["workload"]: r for r in rows if r["engine"] == "localstate rocksdb+kafka"}
    for r in rows:
        if r["engine"] == "quix RocksDBStore+kafka" and not r.get("error"):
            # how many times Quix's rate ours is, as an extra row (the row's ratio is vs raw)
            mine = ours[r["workload"]]
            rows.append(make_row(r["workload"] + ".vs_quix", "localstate rocksdb+kafka", params, "x",
                                 [a / b for a, b in zip(mine["runs"], r["runs"])],
                                 notes="ours / quix, per repeat (same run, same broker)"))
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Append and restore throughput for 1M records (20k when ``quick``) of 116 bytes,
    from 1 and from 4 partitions, ours vs raw confluent-kafka in the same run."""
    n = 20_000 if quick else 1_000_000
    if quick:
        repeats = min(repeats, 2)
    rows: list[dict[str, Any]] = []
    with TansuBroker() as broker:
        rows += store_rows(broker.bootstrap, n, min(repeats, 3), report_missing_peer=not quick)
        bench = _Bench(broker, n, repeats)
        for partitions in (1, 4):
            params = {"records": n, "record_bytes": RECORD_BYTES, "partitions": partitions, "chunk": CHUNK}
            raw = bench.rows("kafka.append", "raw confluent-kafka", params, bench.raw_append(partitions), None,
                             "idempotent acks=all producer, produce() per record, flush()")
            ours = bench.rows("kafka.append", "localstate kafka", params, bench.ours_append(partitions),
                              "raw confluent-kafka",
                              "append() per 500-record chunk + flush() = transaction commit"
                              + (", one transactional producer per task partition" if partitions > 1 else ""))
            rows += ours + raw
        for partitions in (1, 4):
            topic = bench.fill(partitions)
            params = {"records": n, "record_bytes": RECORD_BYTES, "partitions": partitions}
            raw = bench.rows("kafka.restore", "raw confluent-kafka", params,
                             bench.raw_restore(topic, partitions, tuned=True), None,
                             "one consumer, fetch.queue.backoff.ms=10 + fetch.wait.max.ms=10, (key, value) per message to EOF")
            ours = bench.rows("kafka.restore", "localstate kafka", params, bench.ours_restore(topic, partitions),
                              "raw confluent-kafka",
                              "read_batches(0, end)" + (", 4 tasks in threads" if partitions > 1 else ""))
            rows += ours + raw
            if partitions == 1:
                rows += bench.rows("kafka.restore_store", "localstate kafka -> memory", params,
                                   bench.store_restore(topic), None,
                                   "TaskStorage open: checkpoint read, fencing, restore into the memory "
                                   "engine, tail check (end to end; the engine's bulk load included)")
            if not quick and partitions == 1:
                rows += bench.rows("kafka.restore", "raw-default", params,
                                   bench.raw_restore(topic, partitions, tuned=False), None,
                                   "raw consumer with librdkafka's default fetch settings (fetch.queue.backoff.ms=1000)")
            bench.delete(topic)
    add_ratios(rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Only the per-record rows (``kafka.store_put`` / ``kafka.store_get``), on a broker
    started here: ``python -m localstate.benchmarks.kafka_changelog --records 1000000``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write-behind", action="store_true",
                        help="also ours with rocksdb's write-behind buffer off, in the same run")
    args = parser.parse_args(argv)
    with TansuBroker() as broker:
        rows = store_rows(broker.bootstrap, args.records, args.repeats, no_write_behind=args.no_write_behind)
    add_ratios(rows)
    for r in rows:
        figure = "error: " + r["error"] if r.get("error") else f"{r['median']:>12,.2f} {r['unit']}"
        ratio = "" if r.get("ratio") is None else f"  ratio vs {r['baseline']}: {r['ratio']:.2f}"
        runs = ", ".join(f"{x:,.0f}" if x > 100 else f"{x:.2f}" for x in r["runs"])
        print(f"{r['workload']:<24} {r['engine']:<26} {figure}{ratio}  [{runs}]")


if __name__ == "__main__":
    main()
