"""A/B of rocksdb's clean-close claim (benchmarks/RESULTS.md, quiet re-run section).

Same process, interleaved: the streaming task path (run_partition per task per micro-batch,
no Spark; PageViewsPerHour, rocksdb + file changelog) with rocksdb's clean-close claim off
(the next open rebuilds db/ from the snapshot, as before) and on.

    python -m localstate.benchmarks.ab_clean_close EVENTS REPEATS    # e.g. 5000000 3
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from localstate.benchmarks.spark_jobs import BATCH_ROWS, OUTPUT, Sizes, events, split_by_key
from localstate.contrib.spark import runner
from localstate.contrib.spark.job_windowed import PageViewsPerHour
from localstate.contrib.spark.jobs import job_config
from localstate.engines.rocksdb import RocksDBEngine

BATCHES = 10
TASKS = 4


def main(n: int, reps: int) -> None:
    table = events(Sizes(n, 100_000 if n >= 1e6 else 10_000, 1))
    per = -(-table.num_rows // BATCHES)
    parts = [split_by_key(table.slice(i * per, per), "user_id", TASKS) for i in range(BATCHES)]
    real = RocksDBEngine._write_clean_marker

    def trial(claim: bool) -> float:
        RocksDBEngine._write_clean_marker = real if claim else (lambda self: None)  # type: ignore[method-assign]
        root = Path(tempfile.mkdtemp(prefix="cleanclose-ab-"))
        config = job_config(PageViewsPerHour, root, partitions=TASKS, engine="rocksdb")
        t0 = time.perf_counter()
        for b in range(BATCHES):
            for p in range(TASKS):
                run = runner.TaskRun(config, PageViewsPerHour, OUTPUT, batch_id=b)
                for _ in runner.run_partition(run, p, iter(parts[b][p].to_batches(BATCH_ROWS))):
                    pass
        return table.num_rows / (time.perf_counter() - t0)

    trial(True)
    off, on = [], []
    for _ in range(reps):
        off.append(trial(False))
        on.append(trial(True))
    RocksDBEngine._write_clean_marker = real  # type: ignore[method-assign]
    print("load", os.getloadavg())
    print("claim off", [round(r) for r in off], "median", round(statistics.median(off)))
    print("claim on ", [round(r) for r in on], "median", round(statistics.median(on)))
    print("ratio on/off", statistics.median(on) / statistics.median(off))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

