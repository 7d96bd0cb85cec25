"""A/B of the search engine's indexing path (benchmarks/RESULTS.md, "Search indexing,
sessions 3 and 4").

Same process, interleaved round by round, the ``search.index`` shape of the search suite
(100k documents, ``index_all`` in chunks of 10k, file changelog, one task commit):

* ``raw`` — raw tantivy, the suite's baseline row;
* ``engine`` — the engine as it is (JSON path, writer feeder thread);
* ``no feeder`` — the same with each batch applied on the task thread;
* ``no JSON`` — the same with every document on the ``Document.from_dict`` path (no
  JSON text for ``index_all``'s batches nor for ``index()``'s plain documents);
* ``before`` (with ``--before COMMIT``) — the engine's modules (``engines/search*.py``) as
  they were at ``COMMIT`` (read with ``git show`` from the repository this file is in),
  imported as a package of their own and registered by ``"module:Factory"``.

Each arm reports documents/s (median, and the median of its per-round ratios to raw),
the CPU of the whole process and of the task thread per document, and the load average.

    python -m localstate.benchmarks.ab_search_indexing DOCS REPEATS [--before COMMIT] [--single]   # e.g. 100000 5

``--single`` runs the per-call shape instead (one ``index()`` per document, the suite's
``search (index())`` row).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localstate.benchmarks.search_engine import (
    _documents,
    _raw_build,
    index_in_chunks,
    index_one_at_a_time,
    interleaved,
    timed,
)
from localstate.engines.search_documents import DocumentBuilder
from localstate.engines.search_feeder import WriterFeeder

Figures = tuple[float, float, float]
"""documents/s, process CPU seconds, task-thread CPU seconds."""

_BEFORE_PACKAGE = "_localstate_search_before"


def _inline_submit(self: WriterFeeder, operation: Callable[..., Any], *args: Any) -> None:
    self._raise_failure()
    operation(*args)


def engine_at(commit: str, into: Path) -> str:
    """Write the search engine's modules as they were at ``commit`` into a package under
    ``into`` (put on ``sys.path``) and return its factory as ``"module:Factory"``."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    package = into / _BEFORE_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for path in git("ls-tree", "--name-only", commit, "engines/").split():
        name = Path(path).name
        if name.startswith("search") and name.endswith(".py"):
            (package / name).write_text(git("show", f"{commit}:{path}"))
    sys.path.insert(0, str(into))
    return f"{_BEFORE_PACKAGE}.search:SearchEngineFactory"


def main(n: int, reps: int, before: str | None = None, single: bool = False) -> None:
    docs = _documents(n)
    shape = index_one_at_a_time if single else index_in_chunks
    threaded_submit, json_docs, plain_doc = WriterFeeder.submit, DocumentBuilder.json_docs, DocumentBuilder.plain_doc

    def engine(feeder: bool = True, json: bool = True) -> Callable[[Path], Figures]:
        def trial(root: Path) -> Figures:
            WriterFeeder.submit = threaded_submit if feeder else _inline_submit  # type: ignore[method-assign]
            DocumentBuilder.json_docs = json_docs if json else (lambda *a: None)  # type: ignore[method-assign]
            DocumentBuilder.plain_doc = plain_doc if json else (lambda *a: False)  # type: ignore[method-assign]
            try:
                return shape(root, docs)
            finally:
                WriterFeeder.submit, DocumentBuilder.json_docs = threaded_submit, json_docs  # type: ignore[method-assign]
                DocumentBuilder.plain_doc = plain_doc  # type: ignore[method-assign]
        return trial

    arms: dict[str, Callable[[Path], Figures]] = {
        "raw": lambda root: timed(n, lambda: _raw_build(root / "raw", docs)),
        "engine": engine(),
        "no feeder": engine(feeder=False),
        "no JSON": engine(json=False),
    }
    with tempfile.TemporaryDirectory(prefix="ls-search-before-") as scratch:
        if before is not None:
            factory = engine_at(before, Path(scratch))
            arms[f"before ({before[:10]})"] = lambda root: shape(root, docs, factory)
        load_before = os.getloadavg()[0]
        results = interleaved(arms, reps)
    loads = sorted((load_before, os.getloadavg()[0]))
    raw = results["raw"]
    print(f"{n} documents, {'one index() call each' if single else 'index_all per 10k'}, {reps} interleaved rounds, 1-minute load {loads[0]:.1f} (start or end) - {loads[1]:.1f}")
    for name, runs in results.items():
        rate = statistics.median(f[0] for f in runs)
        ratio = statistics.median(f[0] / r[0] for f, r in zip(runs, raw))
        print(f"  {name:20s} {rate:10,.0f} docs/s  {ratio:5.2f}x raw  "
              f"process CPU {1e6 * statistics.median(f[1] for f in runs) / n:5.2f} µs/doc  "
              f"task thread {1e6 * statistics.median(f[2] for f in runs) / n:5.2f} µs/doc")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("docs", type=int, nargs="?", default=100_000)
    parser.add_argument("repeats", type=int, nargs="?", default=5)
    parser.add_argument("--before", metavar="COMMIT", help="add an arm with the engine as it was at COMMIT")
    parser.add_argument("--single", action="store_true", help="one index() call per document instead of index_all")
    args = parser.parse_args()
    main(args.docs, args.repeats, args.before, args.single)
