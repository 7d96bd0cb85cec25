"""A/B of the routes to host affinity for a Spark task, without localstate's state.

One streaming query per route over the same Parquet files (one per micro-batch, ``rows``
rows of string keys each, ``availableNow``), 6 tasks, on ``local-cluster[3,1,1024]`` by
default. Each route's task only reads its input as Arrow and reports its partition and
executor, so the figures are the route's own cost and placement:

* ``plain``: ``foreachBatch`` → ``repartition(6, key).mapInArrow`` (no placement; the
  runner's path with ``affinity=False``);
* ``placed``: ``foreachBatch`` → :func:`localstate.contrib.spark.placement.placed` with the
  registry's proposals → ``mapInArrow`` (the runner's path on a cluster);
* ``stateful``: the query's own ``groupBy(task).applyInPandasWithState`` with one group
  per task (keys chosen to hash onto distinct shuffle partitions), a one-number Spark
  state per task; each pandas chunk is converted back to Arrow, as a localstate task
  would need.

Prints, per route: median micro-batch ``triggerExecution`` (ms, batches after the first
two), task runs that moved / runs, and the load average before and after::

    python -m localstate.benchmarks.ab_affinity_routes --rows 300000 --batches 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

TASKS = 6


def _write(directory: Path, batches: int, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    directory.mkdir(parents=True)
    base = time.time() - batches - 10
    for b in range(batches):
        ids = rng.integers(0, rows * 4, rows)
        path = directory / f"part-{b:04d}.parquet"
        pq.write_table(pa.table({"user_id": pa.array([f"user-{i:08d}" for i in ids.tolist()])}), path)
        os.utime(path, (base + b, base + b))


def _report(batches: list[tuple[int, str]], seen: dict[int, list[str]]) -> None:
    """Add one micro-batch's ``(partition, executor)`` runs to ``seen``."""
    for p, executor in batches:
        seen.setdefault(p, []).append(executor)


def _median_ms(query: Any) -> float:
    times = [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p.get("numInputRows")]
    return float(statistics.median(times[2:] or times))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local-cluster[3,1,1024]")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--routes", default="plain,placed,stateful")
    args = parser.parse_args(argv)

    import pyarrow as pa
    from localstate.contrib.spark import spark_session
    from localstate.contrib.spark.placement import Placement, live_executors, location, placed
    from localstate.contrib.spark.runner import executor_id, spark_task_keys
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    work = Path(tempfile.mkdtemp(prefix="localstate-ab-affinity-"))
    _write(work / "input", args.batches, args.rows)
    spark = spark_session(args.master, **{"spark.sql.shuffle.partitions": str(TASKS)})
    out_schema = "p int, executor string, rows long"

    def count(batches: Any) -> Any:
        from pyspark import TaskContext

        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"p": pa.array([TaskContext.get().partitionId()], pa.int32()),
                                          "executor": [executor_id()], "rows": pa.array([rows], pa.int64())})

    def stream() -> Any:
        return spark.readStream.schema("user_id string").option("maxFilesPerTrigger", 1).parquet(
            str(work / "input"))

    for route in args.routes.split(","):
        load = os.getloadavg()
        seen: dict[int, list[str]] = {}
        checkpoint = str(work / f"ckpt-{route}")
        if route in ("plain", "placed"):
            registry = Placement(TASKS)

            def run_batch(df: Any, batch_id: int, route: str = route, registry: Placement = registry,
                          seen: dict[int, list[str]] = seen) -> None:
                shuffled = df.repartition(TASKS, "user_id")
                if route == "placed":
                    executors = live_executors(spark.sparkContext)
                    locations = [location(e, executors[e]) if e else None for e in registry.assign(executors)]
                    from localstate.contrib.spark.placement import unpacked

                    out = placed(shuffled, locations).mapInArrow(lambda batches: count(unpacked(batches)),
                                                                 out_schema)
                else:
                    out = shuffled.mapInArrow(count, out_schema)
                ran = {r.p: r.executor for r in out.collect()}
                registry.record(ran)
                _report(sorted(ran.items()), seen)

            query = stream().writeStream.foreachBatch(run_batch).option("checkpointLocation", checkpoint) \
                .trigger(availableNow=True).start()
        else:
            keys = spark_task_keys(TASKS)
            task_key = F.element_at(F.array(*(F.lit(k) for k in keys)),
                                    F.pmod(F.hash("user_id"), F.lit(TASKS)) + 1)

            def stateful(key: Any, pdfs: Any, state: Any) -> Any:
                import pandas as pd

                rows = sum(pa.Table.from_pandas(pdf, preserve_index=False).num_rows for pdf in pdfs)
                state.update((state.get[0] + rows if state.exists else rows,))
                from pyspark import TaskContext

                yield pd.DataFrame({"p": [TaskContext.get().partitionId()], "executor": [executor_id()],
                                    "rows": [rows]})

            def sink(df: Any, batch_id: int, seen: dict[int, list[str]] = seen) -> None:
                _report(sorted({(r.p, r.executor) for r in df.collect()}), seen)

            grouped = stream().withColumn("task", task_key).groupBy("task").applyInPandasWithState(
                stateful, out_schema, "n long", "append", GroupStateTimeout.NoTimeout)
            query = grouped.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint) \
                .trigger(availableNow=True).start()
        query.awaitTermination()
        moves = sum(a != b for runs in seen.values() for a, b in zip(runs, runs[1:]))
        runs = sum(len(r) - 1 for r in seen.values())
        print(f"{route}: median micro-batch {_median_ms(query):.0f} ms, {moves} of {runs} runs moved, "
              f"executors {sorted({e for r in seen.values() for e in r})}, load {load} -> {os.getloadavg()}",
              flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
