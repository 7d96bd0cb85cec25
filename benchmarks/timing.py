"""The one timer of the benchmark suites.

* :class:`Stopwatch` times ``with`` blocks: wall seconds (``time.perf_counter``), and with
  ``cpu=True`` also the CPU seconds of the process (all its threads) and of the calling
  thread. Its figures are the sums over the blocks it timed, so one stopwatch can add up
  the commits of a loop while another times the whole loop.
* :func:`repeat_trials` runs a warm-up and then ``repeats`` trials that return their own
  figures (each in a fresh scratch directory if asked); :func:`timed_runs` times a body
  that way, with an untimed setup and teardown around each run; :func:`interleaved_trials`
  runs rounds of several trials in turn; :func:`spread` is the median, min and max of the
  figures.

What a trial sets up or tears down stays outside its stopwatch's ``with`` block, so it is
not timed (e.g. a store's open is timed and its close is not: open inside the block,
``with storage:`` after it).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["Stopwatch", "repeat_trials", "timed_runs", "interleaved_trials", "spread"]

T = TypeVar("T")


class Stopwatch:
    """Seconds spent inside the ``with`` blocks this stopwatch timed, summed.

    ``wall``: ``time.perf_counter``; with ``cpu=True`` also ``cpu`` (``time.process_time``:
    every thread of the process, e.g. RocksDB's) and ``thread`` (``time.thread_time``: the
    calling thread only). Without ``cpu`` a block costs two clock reads, so per-request
    latencies of a few microseconds stay honest."""

    __slots__ = ("wall", "cpu", "thread", "_with_cpu", "_start")

    def __init__(self, *, cpu: bool = False) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.thread = 0.0
        self._with_cpu = cpu
        self._start = (0.0, 0.0, 0.0)

    def __enter__(self) -> Stopwatch:
        # the wall clock is read last on entry and first on exit: the least of this
        # method's own work falls inside the timed span
        if self._with_cpu:
            cpu, thread = time.process_time(), time.thread_time()
            self._start = (time.perf_counter(), cpu, thread)
        else:
            self._start = (time.perf_counter(), 0.0, 0.0)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        end = time.perf_counter()
        wall, cpu, thread = self._start
        self.wall += end - wall
        if self._with_cpu:
            self.cpu += time.process_time() - cpu
            self.thread += time.thread_time() - thread


def repeat_trials(trial: Callable[..., T], repeats: int, *, scratch: str | None = None) -> list[T]:
    """A warm-up trial, then ``repeats`` timed ones; each trial returns its own figure
    (timing what it measures with a :class:`Stopwatch`: its setup and teardown stay
    outside the ``with`` block), the warm-up's is dropped.

    With ``scratch`` (a name prefix) each trial gets a fresh temporary directory as its
    argument, deleted after it."""
    out: list[T] = []
    for i in range(repeats + 1):
        figure = _once(trial, scratch)
        if i:
            out.append(figure)
    return out


def timed_runs(body: Callable[[Any], Any], repeats: int, *, setup: Callable[[], Any] | None = None,
               teardown: Callable[[Any], Any] | None = None) -> list[float]:
    """A warm-up, then ``repeats`` runs of ``body(setup())`` (``body(None)`` without a
    setup): the wall seconds of each timed ``body``. ``setup`` and ``teardown(what setup
    gave)`` run around every body, untimed."""
    out: list[float] = []
    for i in range(repeats + 1):
        state = setup() if setup is not None else None
        try:
            with Stopwatch() as watch:
                body(state)
        finally:
            if teardown is not None:
                teardown(state)
        if i:
            out.append(watch.wall)
    return out


def interleaved_trials(trials: Mapping[str, Callable[..., T]], repeats: int, *,
                       scratch: str | None = None) -> dict[str, list[T]]:
    """A warm-up round, then ``repeats`` rounds of every trial in turn (so a shared
    machine's slow stretch hits them all alike); each trial's figures in run order,
    ``scratch`` as in :func:`repeat_trials`."""
    out: dict[str, list[T]] = {name: [] for name in trials}
    for i in range(repeats + 1):
        for name, trial in trials.items():
            figure = _once(trial, scratch)
            if i:
                out[name].append(figure)
    return out


def _once(trial: Callable[..., T], scratch: str | None) -> T:
    if scratch is None:
        return trial()
    root = Path(tempfile.mkdtemp(prefix=f"{scratch}-"))
    try:
        return trial(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spread(runs: Sequence[float]) -> tuple[float, float, float]:
    """``(median, min, max)`` of the timed runs."""
    return statistics.median(runs), min(runs), max(runs)
