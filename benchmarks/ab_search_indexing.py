"""A/B of the search engine's indexing path (benchmarks/RESULTS.md, "Search indexing,
session 3").

Same process, interleaved round by round, the ``search.index`` shape of the search suite
(100k documents, ``index_all`` in chunks of 10k, file changelog, one task commit):

* ``raw`` — raw tantivy, the suite's baseline row;
* ``engine`` — the engine as it is (JSON path, writer feeder thread);
* ``no feeder`` — the same with each batch applied on the task thread;
* ``no JSON`` — the same with every batch on the ``Document.from_dict`` path.

Each arm reports documents/s (median, and its ratio to raw in the same rounds), the CPU
of the whole process and of the task thread per document, and the load average.

    python -m localstate.benchmarks.ab_search_indexing DOCS REPEATS    # e.g. 100000 5
"""
from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localstate.benchmarks.search_engine import (
    _documents,
    _raw_build,
    index_in_chunks,
    interleaved,
    timed,
)
from localstate.engines.search_documents import DocumentBuilder
from localstate.engines.search_feeder import WriterFeeder

Figures = tuple[float, float, float]
"""documents/s, process CPU seconds, task-thread CPU seconds."""


def _inline_submit(self: WriterFeeder, operation: Callable[..., Any], *args: Any) -> None:
    self._raise_failure()
    operation(*args)


def main(n: int, reps: int) -> None:
    docs = _documents(n)
    threaded_submit, json_docs = WriterFeeder.submit, DocumentBuilder.json_docs

    def engine(feeder: bool = True, json: bool = True) -> Callable[[Path], Figures]:
        def trial(root: Path) -> Figures:
            WriterFeeder.submit = threaded_submit if feeder else _inline_submit  # type: ignore[method-assign]
            DocumentBuilder.json_docs = json_docs if json else (lambda *a: None)  # type: ignore[method-assign]
            try:
                return index_in_chunks(root, docs)
            finally:
                WriterFeeder.submit, DocumentBuilder.json_docs = threaded_submit, json_docs  # type: ignore[method-assign]
        return trial

    arms: dict[str, Callable[[Path], Figures]] = {
        "raw": lambda root: timed(n, lambda: _raw_build(root / "raw", docs)),
        "engine": engine(),
        "no feeder": engine(feeder=False),
        "no JSON": engine(json=False),
    }
    load_before = os.getloadavg()[0]
    results = interleaved(arms, reps)
    loads = sorted((load_before, os.getloadavg()[0]))
    raw = statistics.median(f[0] for f in results["raw"])
    print(f"{n} documents, {reps} interleaved rounds, 1-minute load {loads[0]:.1f} (start or end) - {loads[1]:.1f}")
    for name, runs in results.items():
        rate = statistics.median(f[0] for f in runs)
        print(f"  {name:10s} {rate:10,.0f} docs/s  {rate / raw:5.2f}x raw  "
              f"process CPU {1e6 * statistics.median(f[1] for f in runs) / n:5.2f} µs/doc  "
              f"task thread {1e6 * statistics.median(f[2] for f in runs) / n:5.2f} µs/doc")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000, int(sys.argv[2]) if len(sys.argv) > 2 else 5)
