"""What the built-in windows cost: the windowed page-views port against the hand-written job,
and the window operator alone.

* ``window_stream``: the streaming shape of :mod:`localstate.benchmarks.spark_streaming`
  without Spark — the same page views (5M events, 100k users, 6 hours; quick: 40k, 1k) in
  time order, cut into ``micro_batches`` consecutive micro-batches, each split by user into
  4 tasks and run through the runner's task path (:func:`run_partition`: open the storage,
  ``process_batch`` per Arrow batch of 10k rows, ``window``, the exactly-once commit,
  close; rocksdb + file changelog), so windows stay open across micro-batches.
  :class:`PageViewsPerHour` (hand-written) and :class:`PageViewsPerHourWindowed` (the
  built-in tumbling window) run interleaved; the warm-up pair's outputs must be identical
  (Arrow IPC bytes, batch by batch). Rate = events / CPU seconds of this process (the
  machine is shared; wall seconds in the notes); the windowed row carries ``ratio`` =
  windowed rate / hand-written rate (the target: ratio >= 1 / 1.1).
* ``window_operator``: :class:`~localstate.windows.WindowedAggregation` alone on a memory
  store, no runner and no commit: ``add_batch`` per 10k-row batch and ``close`` after each,
  per window kind (tumbling and hopping in Arrow; sessions per key in memory; sliding a batch per read and write).
* ``window_stream_spark`` (only with ``--spark``, not in the suite): the two jobs as
  :meth:`StatefulJob.run_stream` queries on the streaming benchmark's Parquet files.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from localstate import Config, TaskStorage
from localstate.contrib.spark.job_windowed import PageViewsPerHour, PageViewsPerHourWindowed
from localstate.contrib.spark.jobs import job_config
from localstate.contrib.spark.runner import StreamTask, TaskRun, run_partition
from localstate.windows import Count, Hopping, Session, Sliding, Sum, Tumbling, WindowedAggregation

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run", "stream_rows", "operator_rows", "main"]

TASKS = 4
BATCH_ROWS = 10_000
ENGINE = "rocksdb"
OUTPUT = pa.schema([("window_start", pa.int64()), ("user_id", pa.string()), ("views", pa.int64())])
FULL = {"events": 5_000_000, "users": 100_000, "micro_batches": 10}
QUICK = {"events": 40_000, "users": 1_000, "micro_batches": 4}
HOURS = 6


def _events(events: int, users: int) -> pa.Table:
    from localstate.contrib.spark.workload import generate

    return PageViewsPerHour.input_table(generate(events, users=users, hours=HOURS, seed=7))


def _micro_batches(table: pa.Table, batches: int) -> list[list[pa.Table]]:
    """``table`` cut into ``batches`` consecutive slices, each split by user into the tasks."""
    from .spark_jobs import split_by_key

    step = -(-table.num_rows // batches)
    return [split_by_key(table.slice(b * step, step), PageViewsPerHour.KEY, TASKS) for b in range(batches)]


def _stream(task: type[StreamTask], root: Path, micro: list[list[pa.Table]], collect: bool) -> tuple[float, float, bytes]:
    """Run the micro-batches through ``task``'s runner path with fresh state under ``root``;
    (CPU seconds, wall seconds, output as Arrow IPC bytes when ``collect``)."""
    config = job_config(task, root, partitions=TASKS, engine=ENGINE)
    sink = io.BytesIO()
    writer = pa.ipc.new_stream(sink, OUTPUT) if collect else None
    with Stopwatch(cpu=True) as watch:
        for b, parts in enumerate(micro):
            for p, part in enumerate(parts):
                for out in run_partition(TaskRun(config, task, OUTPUT, batch_id=b), p, iter(part.to_batches(BATCH_ROWS))):
                    if writer is not None:
                        writer.write_batch(out)
    if writer is not None:
        writer.close()
    return watch.cpu, watch.wall, sink.getvalue()


def stream_rows(quick: bool, repeats: int, work: Path) -> list[dict[str, Any]]:
    sizes = QUICK if quick else FULL
    table = _events(sizes["events"], sizes["users"])
    n = table.num_rows
    micro = _micro_batches(table, sizes["micro_batches"])
    del table
    params = {**sizes, "hours": HOURS, "tasks": TASKS, "batch_rows": BATCH_ROWS, "engine": ENGINE,
              "changelog": "file"}
    jobs = (PageViewsPerHour, PageViewsPerHourWindowed)

    def one(task: type[StreamTask], collect: bool) -> tuple[float, float, bytes]:
        root = work / f"{task.NAME}-{time.time_ns()}"
        try:
            return _stream(task, root, micro, collect)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    outputs = [one(task, True)[2] for task in jobs]
    if outputs[0] != outputs[1]:
        raise RuntimeError("the windowed port emitted other bytes than the hand-written PageViewsPerHour")
    windows = pa.ipc.open_stream(outputs[0]).read_all().num_rows
    runs: dict[type, list[tuple[float, float]]] = {task: [] for task in jobs}
    for _ in range(repeats):
        for task in jobs:
            cpu, wall, _ = one(task, False)
            runs[task].append((cpu, wall))
    rows = []
    base_name = "PageViewsPerHour (hand-written)"
    for task, name in zip(jobs, (base_name, "PageViewsPerHourWindowed (localstate.windows Tumbling + Count)")):
        cpu = [n / c for c, _ in runs[task]]
        wall = [round(n / w) for _, w in runs[task]]
        row = make_row("window_stream", name, params, "events/CPU-s", cpu,
                       baseline=None if task is PageViewsPerHour else base_name,
                       notes=f"runner path per micro-batch and task (open, process, window, commit, close); "
                             f"wall events/s {wall}; output identical in the warm-up pair ({windows:,} windows)")
        rows.append(row)
    rows[1]["ratio"] = rows[1]["median"] / rows[0]["median"]
    return rows


def _operator_config(root: Path, serde: str) -> Config:
    return Config.from_dict({
        "job.name": "windows-bench", "job.state.dir": str(root / "state"), "systems.file.path": str(root / "changelog"),
        "stores.w.factory": "memory", "stores.w.key.serde": "tuple", "stores.w.msg.serde": serde,
        "stores.w.object.cache.size": 0, "stores.w.write.batch.size": 10_000,
    })


KINDS: dict[str, tuple[Any, Any, str, bool]] = {
    "tumbling 1h count (Arrow)": (Tumbling(3600, grace=60), Count(), "long", True),
    "hopping 1h/15min count (Arrow)": (Hopping(3600, 900, grace=60), Count(), "long", True),
    "sliding 10min sum (a batch per read and write)": (Sliding(600, grace=60), Sum(), "msgpack", False),
    "session 30min sum (per key, in memory)": (Session(1800, grace=60), Sum(), "msgpack", False),
}


def operator_rows(quick: bool, repeats: int, work: Path) -> list[dict[str, Any]]:
    rows = []
    for kind, (windows, aggregator, serde, arrow) in KINDS.items():
        n = (20_000 if arrow else 5_000) if quick else (1_000_000 if arrow else 100_000)
        table = _events(n, max(100, n // 50))
        table = table.append_column("v", pa.array([1] * table.num_rows, pa.int64()))
        batches = table.to_batches(BATCH_ROWS)
        runs = []
        for i in range(repeats + 1):
            root = work / f"op-{time.time_ns()}"
            try:
                with TaskStorage(_operator_config(root, serde), 0) as storage:
                    op = WindowedAggregation(storage, "w", windows, aggregator)
                    with Stopwatch(cpu=True) as watch:
                        for batch in batches:
                            op.add_batch(batch, key="user_id", time="ts", value="v")
                            op.close()
                    seconds = watch.cpu
            finally:
                shutil.rmtree(root, ignore_errors=True)
            if i:  # the first is the warm-up
                runs.append(table.num_rows / seconds)
        rows.append(make_row("window_operator", kind, {"records": table.num_rows, "batch_rows": BATCH_ROWS,
                                                       "engine": "memory"}, "records/CPU-s", runs,
                             notes="add_batch + close per batch, no runner, no commit"))
    return rows


def spark_rows(quick: bool, repeats: int, work: Path) -> list[dict[str, Any]]:
    """The two jobs as Structured Streaming queries, interleaved (see the module docstring)."""
    from . import spark_streaming as ss
    from .spark_jobs import Sizes, events, start_session

    sizes = ss.STREAM_QUICK if quick else ss.STREAM_FULL
    table = events(Sizes(sizes.events, sizes.users, sample_every=1))
    n = table.num_rows
    input_dir = work / "stream-input"
    ss.write_stream_files(table, input_dir, sizes.batches * ss.FILES_PER_TRIGGER)
    del table
    spark, owned = start_session(quick)
    try:
        jobs = (PageViewsPerHour, PageViewsPerHourWindowed)
        outputs = [ss.localstate_stream(spark, input_dir, work / f"warm-{t.NAME}", collect=True, task=t).output
                   for t in jobs]
        if outputs[0] is None or outputs[1] is None or not outputs[0].equals(outputs[1]):
            raise RuntimeError("the windowed port's stream output differs from PageViewsPerHour's")
        runs: dict[type, list[float]] = {t: [] for t in jobs}
        for r in range(repeats):
            for t in jobs:
                root = work / f"run{r}-{t.NAME}"
                try:
                    runs[t].append(n / ss.localstate_stream(spark, input_dir, root, task=t).seconds)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
    finally:
        if owned:
            spark.stop()
    params = {"events": n, "users": sizes.users, "micro_batches": sizes.batches, "tasks": TASKS, "engine": ENGINE}
    base_name = "run_stream PageViewsPerHour (hand-written)"
    base = make_row("window_stream_spark", base_name, params, "events/s", runs[jobs[0]],
                    notes="StatefulJob.run_stream, availableNow, noop sink; interleaved")
    ours = make_row("window_stream_spark", "run_stream PageViewsPerHourWindowed", params, "events/s",
                    runs[jobs[1]], baseline=base_name, notes="output identical in the warm-up pair")
    ours["ratio"] = ours["median"] / base["median"]
    return [base, ours]


def run(quick: bool = False, repeats: int = 5, spark: bool = False) -> list[dict[str, Any]]:
    """Every row of the suite (see the module docstring); warm-up + ``repeats`` runs each."""
    work = Path(tempfile.mkdtemp(prefix="bench-windows-"))
    try:
        rows = stream_rows(quick, repeats, work) + operator_rows(quick, repeats, work)
        if spark:
            rows += spark_rows(quick, repeats, work)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m localstate.benchmarks.windows [--quick] [--repeats N] [--spark] [--json PATH]``."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m localstate.benchmarks.windows")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also the Structured Streaming pair")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    rows = run(args.quick, args.repeats, args.spark)
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for r in rows:
        ratio = f"  ratio {r['ratio']:.3f}" if r["ratio"] is not None else ""
        print(f"{r['workload']:20} {r['engine'][:64]:64} {r['median']:>12,.0f} {r['unit']}"
              f"  runs {[round(x) for x in r['runs']]}{ratio}\n    {r['notes']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average_start": load, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
