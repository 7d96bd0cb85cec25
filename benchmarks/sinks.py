"""``localstate bench --suite sinks``: what exactly-once output costs beside a plain write.

The same rows (``key string, count long``; 200k, quick: 5k), computed and persisted once,
written as one batch per run on ``local[2]``:

* ``sink_file`` — :class:`~localstate.contrib.spark.sinks.FileSink` (parquet: Spark's
  write to a hidden directory, fsync of its files, one rename) vs a plain
  ``df.write.parquet(<path>/batch_id=N)``;
* ``sink_kafka`` — :class:`~localstate.contrib.spark.sinks.KafkaSink` (rows and marker in
  one transaction) vs the same rows, serialized the same way (``to_json`` on the
  executors, ``toLocalIterator`` to the driver), produced by an idempotent producer
  without a transaction and flushed — on one Apache Kafka node started by the suite.

Besides, the sinks' fixed work per batch, timed alone: ``sink_file_publish`` (fsync of a
batch's files and directories, the rename, fsync of the sink directory) and
``sink_kafka_batch_fixed`` (the transaction of an empty batch: begin, marker, commit), ms.

Each pair is warmed up once, then run ``repeats`` times interleaved; rows/s, median.
The ``ratio`` of a sink row is the median over the rounds of its rate over the plain
write's in the same round (below 1: the sink's cost).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run", "FULL_ROWS", "QUICK_ROWS"]

FULL_ROWS = 200_000
QUICK_ROWS = 5_000
KEYS = 10_000


def _rows(spark: Any, n: int) -> Any:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    df = spark.range(n).select(F.concat(F.lit("user-"), (F.col("id") % KEYS).cast("string")).alias("key"),
                               F.col("id").alias("count")).repartition(2)
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    df.count()
    return df


def _interleaved(pair: list[tuple[str, Callable[[int], float]]], repeats: int) -> list[list[float]]:
    """Warm each up once, then ``repeats`` rounds of each in turn; seconds per run."""
    runs: list[list[float]] = [[] for _ in pair]
    for i, (_, once) in enumerate(pair):
        once(-1 - i)
    for r in range(repeats):
        for i, (_, once) in enumerate(pair):
            runs[i].append(once(r))
    return runs


def _pair_rows(workload: str, pair: list[tuple[str, Callable[[int], float]]], n: int, repeats: int,
               params: dict[str, Any], notes: str) -> list[dict[str, Any]]:
    runs = _interleaved(pair, repeats)
    (sink_name, _), (plain_name, _) = pair
    base = make_row(workload, plain_name, params, "rows/s", [n / s for s in runs[1]], notes=notes)
    ours = make_row(workload, sink_name, params, "rows/s", [n / s for s in runs[0]], baseline=plain_name, notes=notes)
    # the median of the per-round ratios: load that comes and goes hits both runs of a round
    ours["ratio"] = statistics.median(b / a for a, b in zip(runs[0], runs[1]))
    return [ours, base]


def file_rows(spark: Any, df: Any, n: int, repeats: int, work: Path) -> list[dict[str, Any]]:

    from localstate.contrib.spark.sinks import FileSink, publish_dir

    sink = FileSink(work / "sink", format="parquet")
    plain = work / "plain"

    def with_sink(r: int) -> float:
        with Stopwatch() as watch:
            sink.write(df, r + 10)
        return watch.wall

    def without(r: int) -> float:
        with Stopwatch() as watch:
            df.write.parquet((plain / f"batch_id={r + 10}").as_uri())
        return watch.wall

    rows = _pair_rows("sink_file", [("FileSink (parquet, fsync + rename)", with_sink),
                                    ("plain df.write.parquet", without)],
                      n, repeats, {"rows": n, "format": "parquet", "spark_partitions": 2},
                      "one batch per run; interleaved")
    # the sink's own work beyond Spark's write, timed alone: sync the batch's files, publish
    publish = []
    for r in range(repeats):
        temp, final = work / f".tmp-publish-{r}", work / "publish" / f"batch_id={r}"
        final.parent.mkdir(exist_ok=True)
        df.write.parquet(temp.as_uri())
        with Stopwatch() as watch:
            publish_dir(temp, final)
        publish.append(watch.wall * 1000)
    rows.append(make_row("sink_file_publish", "FileSink fsync + rename of one batch", {"rows": n, "files": 2},
                         "ms", publish, notes="per batch, after Spark's write; no baseline (a plain write has none)"))
    return rows


def kafka_rows(spark: Any, df: Any, n: int, repeats: int) -> list[dict[str, Any]]:
    import uuid

    from confluent_kafka import Producer
    from localstate.contrib.spark.sinks import KafkaSink
    from localstate.testing.apache_kafka import ApacheKafkaBroker
    from localstate.testing.sink_driver import create_topic
    from pyspark.sql import functions as F

    with ApacheKafkaBroker() as broker:
        bootstrap = broker.bootstrap
        topics = [create_topic(bootstrap) for _ in range(2)]
        sink = KafkaSink(bootstrap, topics[0], transactional_id=f"bench-{uuid.uuid4().hex[:8]}", key="key")
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5})

        def with_sink(r: int) -> float:
            with Stopwatch() as watch:
                sink.write(df, r + 10)
            return watch.wall

        def without(r: int) -> float:
            with Stopwatch() as watch:
                rows = df.select(F.col("key").cast("string"), F.to_json(F.struct(*[F.col(c) for c in df.columns])))
                for k, v in rows.toLocalIterator(prefetchPartitions=True):
                    while True:
                        try:
                            producer.produce(topics[1], v, k)
                            break
                        except BufferError:
                            producer.poll(0.05)
                producer.flush(60)
            return watch.wall

        def empty_batch(r: int) -> float:
            with Stopwatch() as watch:
                sink.deliver([], 1_000 + r)
            return watch.wall * 1000

        try:
            rows = _pair_rows("sink_kafka", [("KafkaSink (one transaction + marker)", with_sink),
                                             ("plain idempotent producer, no transaction", without)],
                              n, repeats, {"rows": n, "partitions": 3, "broker": "Apache Kafka, one KRaft node"},
                              "one batch per run; same to_json + toLocalIterator; interleaved")
            empty_batch(-1)
            rows.append(make_row("sink_kafka_batch_fixed", "KafkaSink transaction of an empty batch",
                                 {"rows": 0}, "ms", [empty_batch(r) for r in range(repeats)],
                                 notes="begin, marker, commit: the fixed cost of a batch"))
            return rows
        finally:
            sink.close()
            producer.flush(10)


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Every row of the suite (see the module docstring)."""
    from .spark_jobs import start_session

    n = QUICK_ROWS if quick else FULL_ROWS
    work = Path(tempfile.mkdtemp(prefix="bench-sinks-"))
    spark, owned = start_session(quick)
    try:
        df = _rows(spark, n)
        try:
            return file_rows(spark, df, n, repeats, work) + kafka_rows(spark, df, n, repeats)
        finally:
            df.unpersist()
    finally:
        if owned:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.sinks [--quick] [--repeats N]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localstate.benchmarks.sinks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    rows = run(args.quick, args.repeats)
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for r in rows:
        ratio = f"  ratio {r['ratio']:.3f}" if r["ratio"] is not None else ""
        print(f"{r['workload']:12} {r['engine']:45} {r['median']:>12,.0f} {r['unit']}"
              f"  runs {[round(x) for x in r['runs']]}{ratio}")


if __name__ == "__main__":
    main()
