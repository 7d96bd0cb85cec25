"""Figures for the ``search`` engine (tantivy), with raw tantivy measured in the same run.

* ``search.index`` — documents indexed per second through ``TaskStorage`` with the file
  changelog on (``index_all`` in chunks, then one task commit), against raw tantivy
  (``add_document`` + ``commit``) on the same documents and schema; also the per-call
  ``index()`` path. The three run interleaved (raw, batched, per call, raw, …) so that a
  change of load on a shared machine hits them alike; each row's notes also give the
  median CPU time of the whole process per document (tantivy's writer threads
  included), which load disturbs less than wall time.
* ``search.query`` — top-10 queries per second including the hits' stored documents,
  against raw tantivy (``parse_query`` + ``search`` + ``doc().to_dict()`` per hit).
* ``search.restore`` — seconds to rebuild a wiped local index of N documents from the
  changelog at open, against raw tantivy indexing the same documents (the floor).
"""

from __future__ import annotations

import random
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tantivy
from localstate import Config, TaskStorage

from .runner import make_row
from .timing import Stopwatch, interleaved_trials, repeat_trials

__all__ = ["run"]

FIELDS = "name:text:stored, bio:text, city:string:stored, age:int:fast"
_CHUNK = 10_000


def _documents(n: int, seed: int = 1) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(2000)]
    firsts = [f"first{i}" for i in range(300)]
    lasts = [f"last{i}" for i in range(1000)]
    cities = [f"city{i}" for i in range(50)]
    return [
        (
            f"user-{i}",
            {
                "name": f"{rng.choice(firsts)} {rng.choice(lasts)}",
                "bio": " ".join(rng.choices(vocab, k=8)),
                "city": rng.choice(cities),
                "age": rng.randrange(18, 90),
            },
        )
        for i in range(n)
    ]


def _queries(n: int, seed: int = 2) -> list[str]:
    rng = random.Random(seed)
    shapes: list[Callable[[], str]] = [
        lambda: f"w{rng.randrange(2000)}",
        lambda: f"w{rng.randrange(2000)} OR w{rng.randrange(2000)}",
        lambda: f"last{rng.randrange(1000)} AND city:city{rng.randrange(50)}",
        lambda: f"bio:w{rng.randrange(2000)} AND age:[30 TO 40]",
    ]
    return [rng.choice(shapes)() for _ in range(n)]


def _config(root: Path, factory: str = "search") -> Config:
    return Config.from_dict({
        "job.name": "bench",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.profiles.factory": factory,
        "stores.profiles.key.serde": "string",
        "stores.profiles.search.fields": FIELDS,
        "stores.profiles.search.default.fields": "name, bio",
        "stores.profiles.write.batch.size": 10_000,
        "stores.profiles.object.cache.size": 10_000,
    })


def _raw_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("name", stored=True)
    sb.add_text_field("bio")
    sb.add_text_field("city", stored=True, tokenizer_name="raw")
    sb.add_integer_field("age", fast=True)
    return sb.build()


def _raw_build(path: Path, docs: list[tuple[str, dict[str, Any]]]) -> tantivy.Index:
    path.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(_raw_schema(), path=str(path))
    writer = index.writer(64_000_000, 2)
    add, document = writer.add_document, tantivy.Document
    for _, d in docs:
        add(document(**d))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index


def timed(n: int, work: Callable[[], None]) -> tuple[float, float, float]:
    """``work()`` over ``n`` documents: (documents per second, process CPU seconds, CPU
    seconds of the calling thread)."""
    with Stopwatch(cpu=True) as watch:
        work()
    return n / watch.wall, watch.cpu, watch.thread


def index_in_chunks(root: Path, docs: list[tuple[str, dict[str, Any]]],
                    factory: str = "search") -> tuple[float, float, float]:
    """One run of the ``search.index`` shape: ``index_all`` per chunk of 10k documents,
    then one task commit, in a new store under ``root`` made by engine ``factory``
    (figures as :func:`timed`)."""
    with TaskStorage(_config(root, factory)) as s:
        p = s.store("profiles")

        def work() -> None:
            for i in range(0, len(docs), _CHUNK):
                p.index_all(docs[i : i + _CHUNK])
            s.commit(1)
        return timed(len(docs), work)


def index_one_at_a_time(root: Path, docs: list[tuple[str, dict[str, Any]]],
                        factory: str = "search") -> tuple[float, float, float]:
    """One run of the per-call ``search.index`` shape: one ``index()`` per document, then
    one task commit (otherwise as :func:`index_in_chunks`)."""
    with TaskStorage(_config(root, factory)) as s:
        index = s.store("profiles").index

        def work() -> None:
            for doc_id, doc in docs:
                index(doc_id, doc)
            s.commit(1)
        return timed(len(docs), work)


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    n = 3_000 if quick else 100_000
    nq = 200 if quick else 3_000
    if quick:
        repeats = min(repeats, 2)
    docs = _documents(n)
    queries = _queries(nq)
    params = {"docs": n, "fields": FIELDS, "changelog": "file"}
    rows: list[dict[str, Any]] = []

    # -- indexing (interleaved) ------------------------------------------------------------
    figures = interleaved_trials({
        "raw": lambda root: timed(n, lambda: _raw_build(root / "raw", docs)),
        "batched": lambda root: index_in_chunks(root, docs),
        "single": lambda root: index_one_at_a_time(root, docs),
    }, repeats, scratch="ls-search-bench")
    for name, engine, baseline, notes in [
        ("raw", "tantivy", None, "raw tantivy: add_document(Document(**fields)) + commit, 2 writer threads (as the engine)"),
        ("batched", "search", "tantivy", "index_all in chunks of 10k + task commit (changelog fsync)"),
        ("single", "search (index())", "tantivy", "one index() call per document + task commit"),
    ]:
        cpu = 1e6 * statistics.median(f[1] for f in figures[name]) / n
        rows.append(make_row("search.index", engine, params, "docs/s", [f[0] for f in figures[name]],
                             baseline=baseline,
                             notes=f"{notes}; interleaved with the other search.index rows; process CPU {cpu:.2f} µs/doc"))

    # -- queries --------------------------------------------------------------------------
    qparams = {"docs": n, "queries": nq, "limit": 10}

    def ours_queries(root: Path) -> float:
        with TaskStorage(_config(root)) as s:
            p = s.store("profiles")
            p.index_all(docs)
            s.commit(1)
            search = p.search
            with Stopwatch() as watch:
                for q in queries:
                    search(q, 10)
            return nq / watch.wall

    def raw_queries(root: Path) -> float:
        index = _raw_build(root / "raw", docs)
        with Stopwatch() as watch:
            for q in queries:
                searcher = index.searcher()
                hits = searcher.search(index.parse_query(q, ["name", "bio"]), 10, count=False).hits
                for _, address in hits:
                    searcher.doc(address).to_dict()
        return nq / watch.wall

    rows.append(make_row("search.query", "tantivy", qparams, "queries/s", repeat_trials(raw_queries, repeats, scratch="ls-search-bench"),
                         notes="parse_query + search + doc().to_dict() per hit (the stored fields as Python values)"))
    rows.append(make_row("search.query", "search", qparams, "queries/s", repeat_trials(ours_queries, repeats, scratch="ls-search-bench"),
                         baseline="tantivy", notes="search(q, 10): hits with decoded stored documents"))

    # -- restore --------------------------------------------------------------------------
    def ours_restore(root: Path) -> float:
        config = _config(root)
        with TaskStorage(config) as s:
            s.store("profiles").index_all(docs)
            s.commit(1)
        shutil.rmtree(root / "state" / "bench" / "profiles")
        with Stopwatch() as watch:  # the open, not the close
            s = TaskStorage(config)
        with s:
            assert s.last_restore["profiles"].records == n
        return watch.wall

    def raw_restore(root: Path) -> float:
        with Stopwatch() as watch:
            _raw_build(root / "raw", docs)
        return watch.wall

    rows.append(make_row("search.restore", "tantivy", params, "s", repeat_trials(raw_restore, repeats, scratch="ls-search-bench"),
                         notes="raw tantivy indexing the same documents (the floor)"))
    rows.append(make_row("search.restore", "search", params, "s", repeat_trials(ours_restore, repeats, scratch="ls-search-bench"),
                         baseline="tantivy", notes="open TaskStorage over a wiped store dir: read changelog, decode, bulk index, commit"))

    for row in rows:
        base = next((r for r in rows if r["workload"] == row["workload"] and r["engine"] == row["baseline"]), None)
        if base is not None and base["median"]:
            row["ratio"] = row["median"] / base["median"]
    return rows
