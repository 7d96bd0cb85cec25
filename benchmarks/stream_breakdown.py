"""Where a streaming micro-batch's time goes, from a query's progress reports and Spark's
stage figures: the driver's part, scheduling, each stage's wall and task time, and inside
localstate's Python tasks their open, input wait, state work, commit and close."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .spark_streaming import StreamRun

__all__ = ["percentile", "latencies_ms", "localstate_breakdown", "floor_breakdown", "spark_breakdown", "format_parts"]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values, dtype=float), q)) if values else 0.0


def latencies_ms(run: StreamRun) -> list[float]:
    """``triggerExecution`` of every data micro-batch of ``run`` (ms)."""
    return [float(p["durationMs"].get("triggerExecution", 0)) for p in run.data_batches]


def localstate_breakdown(runs: list[StreamRun], task_docs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Mean seconds per data micro-batch of the localstate query: driver, scheduling,
    the read/shuffle-write stage, and per-task sums of the Python stage's parts: open,
    input, the task's own work (init + process_batch + window, and each of them),
    commit, close."""
    parts: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        parts.setdefault(name, []).append(value)

    for run, docs in zip(runs, task_docs):
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for doc in docs:
            if doc.get("version") is not None:
                by_batch.setdefault(int(doc["version"]), []).append(doc)
        for p in run.data_batches:
            batch = int(p["batchId"])
            for name, value in _stage_parts(run, p):
                add(name, value)
            tasks = by_batch.get(batch, [])
            task_s = {key: sum(d.get(key, 0.0) for d in tasks)
                      for key in ("open", "input", "init", "process_batch", "window", "commit")}
            add("python task-s: open storage", task_s["open"])
            # a fraction, not seconds: format_parts prints keys ending in "share" as a percentage
            add("task runs that kept their storage open from the previous micro-batch: share",
                sum(1 for d in tasks if d.get("kept_open")) / len(tasks) if tasks else 0.0)
            add("python task-s: wait for input (shuffle read, Arrow)", task_s["input"])
            add("python task-s: state work (init + process_batch + window)",
                task_s["init"] + task_s["process_batch"] + task_s["window"])
            for key in ("init", "process_batch", "window", "commit"):
                add(f"python task-s: {key}", task_s[key])
            add("python task-s: close (memtable flush, clean-close claim)", _close_seconds(p))
    return {k: statistics.mean(v) for k, v in parts.items()}


def _stage_parts(run: StreamRun, progress: dict[str, Any]) -> list[tuple[str, float]]:
    """Seconds of one data micro-batch of a query that shuffles into a second stage: the
    batch, the driver's part, scheduling, and each stage's wall and summed task time."""
    durations = progress["durationMs"]
    trigger = durations.get("triggerExecution", 0) / 1000
    add_batch = durations.get("addBatch", 0) / 1000
    stages = run.stages.get(int(progress["batchId"]), [])
    read = [s for s in stages if s["shuffle_read"] == 0]
    python = [s for s in stages if s["shuffle_read"] > 0]
    return [
        ("micro-batch (triggerExecution)", trigger),
        ("driver: offsets, planning, offset/commit logs", trigger - add_batch),
        ("addBatch: job scheduling and gaps between stages", add_batch - sum(s["wall"] for s in read + python)),
        ("stage 1 wall: read input + shuffle write", sum(s["wall"] for s in read)),
        ("stage 2 wall: shuffle read + Python tasks", sum(s["wall"] for s in python)),
        ("stage 1 task-s", sum(s["task_s"] for s in read)),
        ("stage 2 task-s", sum(s["task_s"] for s in python)),
    ]


def floor_breakdown(runs: list[StreamRun]) -> dict[str, float]:
    """Mean seconds per data micro-batch of the ``mapInArrow`` floor (:func:`floor_stream`):
    the parts it shares with the localstate query (no state, so no task timers)."""
    parts: dict[str, list[float]] = {}
    for run in runs:
        for p in run.data_batches:
            for name, value in _stage_parts(run, p):
                parts.setdefault(name, []).append(value)
    return {k: statistics.mean(v) for k, v in parts.items()}


def _close_seconds(progress: dict[str, Any]) -> float:
    """The tasks' storage close time (summed) of one micro-batch: ``closeTimeMs`` of the
    runner's observed metrics. Every store's observation repeats its task's figure, so
    one store's is the answer (the largest, should a store be missing from a task)."""
    observed = progress.get("observedMetrics") or {}
    closes = []
    for name, metrics in observed.items():
        if name.startswith("localstate."):
            fields = metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)  # a pyspark Row
            closes.append(fields.get("closeTimeMs") or 0)
    return max(closes, default=0) / 1000


def spark_breakdown(runs: list[StreamRun]) -> dict[str, float]:
    """Mean seconds per data micro-batch of Spark's own query (progress and stages)."""
    parts: dict[str, list[float]] = {}
    for run in runs:
        for p in run.data_batches:
            durations = p["durationMs"]
            trigger = durations.get("triggerExecution", 0) / 1000
            add_batch = durations.get("addBatch", 0) / 1000
            stages = run.stages.get(int(p["batchId"]), [])
            state = p["stateOperators"][0] if p.get("stateOperators") else {}
            for name, value in (
                ("micro-batch (triggerExecution)", trigger),
                ("driver: offsets, planning, offset/commit logs", trigger - add_batch),
                ("stage 1 wall: Parquet read + partial aggregate + shuffle write",
                 sum(s["wall"] for s in stages if s["shuffle_read"] == 0)),
                ("stage 2 wall: shuffle read + aggregate + state store",
                 sum(s["wall"] for s in stages if s["shuffle_read"] > 0)),
                ("state store: updates (task-s)", state.get("allUpdatesTimeMs", 0) / 1000),
                ("state store: removals (task-s)", state.get("allRemovalsTimeMs", 0) / 1000),
                ("state store: commit (task-s)", state.get("commitTimeMs", 0) / 1000),
            ):
                parts.setdefault(name, []).append(value)
    return {k: statistics.mean(v) for k, v in parts.items()}


def format_parts(parts: dict[str, float]) -> str:
    return "; ".join(f"{k[:-len(' share')]} {v:.0%}" if k.endswith(" share") else f"{k} {v * 1000:,.0f} ms"
                     for k, v in parts.items())
