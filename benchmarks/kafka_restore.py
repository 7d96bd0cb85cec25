"""Cold restore of a rocksdb store from its Kafka changelog, against the
raw client in the same run, on a tansu broker started here.

The store: N random 16-byte keys with 100-byte values written through ``TaskStorage``
(rocksdb engine, Kafka changelog, bytes serdes, ``put_all`` and a commit per 10,000), so
the changelog holds what a real task writes: transactional batches with their commit
markers. Each repeat runs, interleaved:

* ``raw consume`` — one confluent-kafka consumer (``read_committed``, the same fetch
  settings and batch size as ours, the cyclic GC off as in our restore) taking ``key()``
  and ``value()`` of every message to partition EOF: the ceiling of any restore through
  this client;
* ``raw consume + rocksdict`` — the same loop writing ``WriteBatch``\\es of 100,000 into a
  fresh rocksdict database with our default options (what a hand-written restore does);
* ``localstate rocksdb`` — ``TaskStorage`` opened over an empty state directory: read the
  checkpoint, fence, restore the whole changelog into rocksdb, snapshot, check the tail.
  The row ``restore only`` is the same runs timed by the restore itself
  (``last_restore[...].seconds``: reading and applying the changelog, then the snapshot);
* ``quixstreams 3.28 replay`` — where a Quix interpreter is found
  (:func:`localstate.benchmarks.peers.quix_python`: ``LOCALSTATE_QUIX_PYTHON``), Quix's own recovery path replays the same records, with the headers its
  changelog carries, into its ``RocksDBStorePartition`` (``benchmarks/peers/quix_replay.py``).

Besides records/s (wall), every row reports records per second of the main thread's CPU
time: on a shared machine wall time measures the neighbours too, while the Python-side
work per record is what the restore path controls.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import rocksdict
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from localstate import Config, TaskStorage
from localstate.changelog.kafka.client import next_batch
from localstate.engines.rocksdb import RocksDBOptions
from localstate.testing.kafka import TansuBroker

from .peers import quix_python, run_peer
from .runner import add_ratios, make_row
from .timing import Stopwatch

__all__ = ["run"]

KEY_BYTES = 16
VALUE_BYTES = 100
COMMIT_EVERY = 10_000
RAW_BATCH = 100_000
_CONSUMER = {"fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 10, "reconnect.backoff.ms": 20}


class _Restore:
    def __init__(self, bootstrap: str, n: int, root: Path) -> None:
        self.bootstrap = bootstrap
        self.n = n
        self.root = root
        self.job = f"bench-restore-{uuid.uuid4().hex[:8]}"
        self.topic = f"{self.job}-kv"
        self._opens = 0

    def config(self, state_dir: Path) -> Config:
        return Config.from_dict({
            "job.name": self.job,
            "job.state.dir": str(state_dir),
            "stores.kv.factory": "rocksdb",
            "stores.kv.changelog": f"kafka.{self.topic}",
            "stores.kv.key.serde": "bytes",
            "stores.kv.msg.serde": "bytes",
            "systems.kafka.bootstrap.servers": self.bootstrap,
            "systems.kafka.checkpoint.topic": f"{self.job}-checkpoints",
        })

    def fill(self) -> None:
        rng = random.Random(17)
        value = bytes(range(VALUE_BYTES))
        self.records = [(rng.randbytes(KEY_BYTES), value) for _ in range(self.n)]
        with TaskStorage(self.config(self.root / "writer")) as storage:
            kv = storage.store("kv")
            for i in range(0, self.n, COMMIT_EVERY):
                kv.put_all(self.records[i : i + COMMIT_EVERY])
                storage.commit(input_position=i + COMMIT_EVERY)
        shutil.rmtree(self.root / "writer", ignore_errors=True)

    def fill_quix(self) -> str:
        """The same records in a topic as Quix's changelog carries them (column family header)."""
        topic = f"{self.job}-quix-changelog"
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "queue.buffering.max.messages": 1_000_000})
        headers = [("__column_family__", b"default")]
        for key, value in self.records:
            while True:
                try:
                    producer.produce(topic, value, key, 0, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(120) != 0:
            raise RuntimeError("could not fill the Quix changelog topic")
        return topic

    def quix(self, python: str, topic: str) -> tuple[float, float]:
        state_dir = Path(tempfile.mkdtemp(prefix="quix-", dir=self.root))
        try:
            result = run_peer(python, "quix_replay.py", [self.bootstrap, topic, str(self.n), str(state_dir / "db")], 600)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
        if result["records"] != self.n:
            raise RuntimeError(f"Quix replayed {result['records']} records, expected {self.n}")
        return result["seconds"], result["cpu"]

    def _consumer(self) -> Any:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "raw-restore-bench",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_committed", **_CONSUMER})
        consumer.assign([TopicPartition(self.topic, 0, 0)])
        return consumer

    def raw(self, write: bool) -> tuple[float, float]:
        """(seconds, main-thread CPU seconds) of a raw consume loop, writing to rocksdict if ``write``.

        The loop is as lean as this client allows, so the ceiling is an honest one:
        batches taken as our scan takes them (:func:`next_batch`: what is queued at once;
        ``consume(n, timeout)`` waits out its timeout at the partition's end),
        ``key()``/``value()`` by C-level ``map``, and the cyclic GC off (a ``Message`` is a
        GC-tracked object: with the collector on, a loop of 10,000-message batches ran at
        about half the speed, which an earlier version of this benchmark reported as the
        broker's ceiling)."""
        db_dir = Path(tempfile.mkdtemp(prefix="raw-restore-", dir=self.root))
        db = rocksdict.Rdict(str(db_dir), RocksDBOptions().to_native()) if write else None
        if db is not None:
            options = rocksdict.WriteOptions()
            options.disable_wal = True
            db.set_write_options(options)
        consumer = self._consumer()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with Stopwatch(cpu=True) as watch:
                n = 0
                done = False
                batch = rocksdict.WriteBatch(raw_mode=True) if db is not None else None
                while not done:
                    msgs = next_batch(consumer)
                    if not msgs:
                        continue
                    if any(map(Message.error, msgs)):
                        good = []
                        for m in msgs:
                            err = m.error()
                            if err is None:
                                good.append(m)
                            elif err.code() == KafkaError._PARTITION_EOF:
                                done = True
                            else:
                                raise RuntimeError(f"raw consumer: {err}")
                        msgs = good
                    keys, values = list(map(Message.key, msgs)), list(map(Message.value, msgs))
                    n += len(keys)
                    if batch is not None:
                        for key, value in zip(keys, values):
                            batch.put(key, value)
                        if len(batch) >= RAW_BATCH:
                            db.write(batch)  # type: ignore[union-attr]
                            batch = rocksdict.WriteBatch(raw_mode=True)
                if db is not None:
                    db.write(batch)
                    db.flush(True)
            seconds, cpu = watch.wall, watch.thread
        finally:
            if gc_was_enabled:
                gc.enable()
            consumer.close()
            if db is not None:
                db.close()
            shutil.rmtree(db_dir, ignore_errors=True)
        if n != self.n:
            raise RuntimeError(f"raw consumer read {n} records, expected {self.n}")
        return seconds, cpu

    def ours(self) -> tuple[float, float, float]:
        """(seconds of the open, main-thread CPU seconds, seconds of the restore itself)."""
        self._opens += 1
        state_dir = self.root / f"open-{self._opens}"
        config = self.config(state_dir)
        with Stopwatch(cpu=True) as watch:  # the open, not the close
            storage = TaskStorage(config)
        with storage:
            progress = storage.last_restore["kv"]
        seconds, cpu = watch.wall, watch.thread
        shutil.rmtree(state_dir, ignore_errors=True)
        if progress.records != self.n:
            raise RuntimeError(f"restored {progress.records} records, expected {self.n}")
        return seconds, cpu, progress.seconds


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Cold restore of 1M records (20k when ``quick``) into rocksdb from Kafka, ours vs raw."""
    n = 20_000 if quick else 1_000_000
    if quick:
        repeats = min(repeats, 2)
    params = {"records": n, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES, "commit_every": COMMIT_EVERY}
    timings: dict[str, list[tuple[float, float]]] = {"raw": [], "raw+db": [], "ours": [], "ours-restore": [],
                                                     "quix": []}
    quix_interpreter, _why_not = quix_python()
    root = Path(tempfile.mkdtemp(prefix="ls-kafka-restore-"))
    try:
        with TansuBroker() as broker:
            bench = _Restore(broker.bootstrap, n, root)
            bench.fill()
            quix_topic = bench.fill_quix() if quix_interpreter else ""
            for i in range(repeats + 1):  # the first round is the warm-up
                raw = bench.raw(write=False)
                ours = bench.ours()
                raw_db = bench.raw(write=True)
                if quix_interpreter:
                    quix = bench.quix(quix_interpreter, quix_topic)
                    if i:
                        timings["quix"].append(quix)
                if i:
                    timings["raw"].append(raw)
                    timings["raw+db"].append(raw_db)
                    timings["ours"].append(ours[:2])
                    timings["ours-restore"].append((ours[2], ours[1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    names = {
        "raw": ("raw consume", None, "read_committed consumer, key()+value() per message to EOF: the ceiling"),
        "raw+db": ("raw consume + rocksdict", "raw consume",
                   f"the same loop + rocksdict WriteBatch of {RAW_BATCH:,} (no WAL), flush at the end"),
        "ours": ("localstate rocksdb", "raw consume",
                 "TaskStorage open over an empty state dir: checkpoint, fencing, restore, snapshot, tail check"),
        "ours-restore": ("localstate rocksdb (restore only)", "raw consume",
                         "the same opens, timed by the restore itself (last_restore seconds)"),
        "quix": ("quixstreams 3.28 replay", "raw consume",
                 "Quix's recovery path per message (poll, header parse, a write batch each) into its "
                 "RocksDBStorePartition, then close"),
    }
    rows: list[dict[str, Any]] = []
    for key, (engine, baseline, notes) in names.items():
        runs = timings[key]
        if not runs:
            continue
        notes = f"{notes}; load {load:.1f}"
        rows.append(make_row("kafka.cold_restore", engine, params, "records/s", [n / s for s, _ in runs],
                             baseline=baseline, notes=notes))
        if key != "ours-restore":  # its CPU time is the whole open's, already in the row above
            rows.append(make_row("kafka.cold_restore", engine, params, "records/s of main-thread CPU",
                                 [n / c for _, c in runs], baseline=baseline, notes=notes))
    if timings["quix"]:  # the same opens against the peer
        for key in ("ours", "ours-restore"):
            engine, _, notes = names[key]
            row = make_row("kafka.cold_restore (vs Quix)", engine, params, "records/s",
                           [n / s for s, _ in timings[key]], baseline=names["quix"][0], notes=f"{notes}; load {load:.1f}")
            row["ratio_workload"] = "kafka.cold_restore"
            rows.append(row)
    add_ratios(rows)
    return rows
