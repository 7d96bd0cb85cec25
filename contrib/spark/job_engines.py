"""Use case 5: jobs on the special engines — top-N, HyperLogLog and full-text search.

* :class:`TrendingPages` — running top-N pages by views: exact counts in a key-value
  store, the best pages of each task in a ``topn`` store (a persistent heap, so the
  task never sorts all pages). Pages are partitioned by page, so the global top-N is
  the top of the union of the tasks' lists (:func:`merge_top`).
* :class:`DistinctViewers` — distinct viewers per page in a ``hyperloglog`` store: a
  few KB per page however many viewers, and only the registers that grew go to the
  changelog at commit.
* :class:`ProfileSearch` — user profiles indexed in a ``search`` (tantivy) store as
  they change; :func:`search_profiles` queries every task's index and merges by score.
"""

from __future__ import annotations

import heapq
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate import Config, TaskStorage

from .runner import Emitter, StreamTask, TaskContext
from .workload import Workload

__all__ = ["TrendingPages", "DistinctViewers", "ProfileSearch", "merge_top", "search_profiles"]


class TrendingPages(StreamTask):
    """Running top-``TOP_N`` pages by views.

    Input: ``page`` (one row per view); keyed by ``page``. Each batch is counted per
    page in Arrow, the counts are added in the ``views`` store (one ``get_all`` and one
    ``put_all``) and every changed page is offered to the ``top`` heap with its new
    count. Output, at each window/commit boundary: this task's ``rank``, ``page``,
    ``views`` (best first).
    """

    NAME = "trending-pages"
    KEY = "page"
    TOP_N = 20
    OUTPUT_SCHEMA = "partition int, rank int, page string, views long"
    STORES: dict[str, dict[str, Any]] = {
        "views": {"factory": "kv", "key.serde": "string", "msg.serde": "long",
                  "object.cache.size": 20_000, "write.batch.size": 5_000},
        "top": {"factory": "topn", "key.serde": "string", "topn.size": TOP_N},
    }

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        return workload.page_views.select(["page", "ts"])

    def init(self, context: TaskContext) -> None:
        self.partition = context.partition
        self.views = context.store("views")
        self.top = context.store("top")

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        if batch.num_rows == 0:
            return
        counts = pa.table({"page": batch.column("page")}).group_by("page", use_threads=False).aggregate(
            [("page", "count")])
        pages = counts.column("page").to_pylist()
        added = counts.column("page_count").to_pylist()
        known = self.views.get_all(pages)
        totals = [(p, known.get(p, 0) + n) for p, n in zip(pages, added)]
        self.views.put_all(totals)
        self.top.offer_all(totals)

    def window(self, emit: Emitter) -> None:
        emit.rows([
            {"partition": self.partition, "rank": rank, "page": page, "views": int(score)}
            for rank, (page, score, *_rest) in enumerate(self.top.top(self.TOP_N), 1)
        ])


def merge_top(output: pa.Table, k: int) -> list[tuple[str, int]]:
    """The global top ``k`` ``(page, views)`` from :class:`TrendingPages` output rows
    (each page lives in one task, so the union of the per-task lists holds the answer).
    When a task emitted several lists (several runs), its latest list counts."""
    latest: dict[str, int] = {}
    for row in output.to_pylist():
        latest[row["page"]] = max(latest.get(row["page"], 0), row["views"])
    return heapq.nlargest(k, latest.items(), key=lambda kv: kv[1])


class DistinctViewers(StreamTask):
    """Distinct viewers per page (HyperLogLog, about 1% error).

    Input: ``page``, ``user_id``; keyed by ``page``. Views are buffered in Arrow (up to
    :attr:`PENDING_ROWS`), grouped by page, and each page's viewers go to its sketch in
    one vectorised ``add_all``. Output, at each
    window/commit boundary, for the pages this task attempt touched: ``page``,
    ``distinct_viewers`` (estimate), ``views`` (views seen in this attempt).
    """

    NAME = "distinct-viewers"
    KEY = "page"
    OUTPUT_SCHEMA = "page string, distinct_viewers long, views long"
    STORES: dict[str, dict[str, Any]] = {
        "viewers": {"factory": "hyperloglog", "key.serde": "string"},
    }

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        return workload.page_views.select(["page", "user_id"])

    PENDING_ROWS = 500_000
    """Views buffered (in Arrow) before they go to the sketches: fewer, larger ``add_all``
    calls. Always flushed at the window/commit boundary."""

    def init(self, context: TaskContext) -> None:
        self.viewers = context.store("viewers")
        self.touched: dict[str, int] = {}
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append(pa.table({"page": batch.column("page"), "user_id": batch.column("user_id")}))
        self._pending_rows += batch.num_rows
        if self._pending_rows >= self.PENDING_ROWS:
            self._apply_pending()

    def _apply_pending(self) -> None:
        if not self._pending:
            return
        grouped = pa.concat_tables(self._pending).group_by("page", use_threads=False).aggregate(
            [("user_id", "list"), ("user_id", "count")])
        self._pending = []
        self._pending_rows = 0
        add_all = self.viewers.add_all
        touched = self.touched
        for page, users, n in zip(grouped.column("page").to_pylist(), grouped.column("user_id_list").to_pylist(),
                                  grouped.column("user_id_count").to_pylist()):
            add_all(page, users)
            touched[page] = touched.get(page, 0) + n

    def window(self, emit: Emitter) -> None:
        self._apply_pending()
        count = self.viewers.count
        emit.rows([{"page": p, "distinct_viewers": int(round(count(p))), "views": n}
                   for p, n in self.touched.items()])
        self.touched = {}


class ProfileSearch(StreamTask):
    """User profiles in a full-text index, kept current as profiles change.

    Input: the profile stream (``user_id``, ``ts``, ``name``, ``zip``, ``city``,
    ``bio``, ``deleted``); keyed by ``user_id``. The newest row per user in a batch is
    indexed (a deleted account is removed from the index). Output, at each
    window/commit boundary: ``partition``, ``indexed``, ``deleted`` (this attempt's
    counts). Query with :func:`search_profiles`.
    """

    NAME = "profile-search"
    KEY = "user_id"
    OUTPUT_SCHEMA = "partition int, indexed long, deleted long"
    STORES: dict[str, dict[str, Any]] = {
        "profiles": {
            "factory": "search",
            "key.serde": "string",
            "search.fields": "name:text:stored, bio:text:stored, city:text:stored, zip:string:stored",
            "search.heap.size.bytes": 20_000_000,
        },
    }
    _FIELDS = ("name", "bio", "city", "zip")

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        return workload.profiles

    def init(self, context: TaskContext) -> None:
        self.partition = context.partition
        self.index = context.store("profiles")
        self.indexed = self.deleted = 0

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.take(pc.sort_indices(batch, [("ts", "ascending")]))
        newest = {row["user_id"]: row for row in batch.to_pylist()}
        gone = [user for user, row in newest.items() if row["deleted"]]
        docs = [(user, {f: row[f] for f in self._FIELDS}) for user, row in newest.items() if not row["deleted"]]
        self.index.index_all(docs)
        self.index.delete_all(gone)
        self.indexed += len(docs)
        self.deleted += len(gone)

    def window(self, emit: Emitter) -> None:
        emit({"partition": self.partition, "indexed": self.indexed, "deleted": self.deleted})
        self.indexed = self.deleted = 0


def search_profiles(config: Config, query: str, limit: int = 10) -> list[tuple[str, float, dict[str, Any]]]:
    """Run ``query`` against every task's profile index of a stopped
    :class:`ProfileSearch` job and return the best ``limit`` ``(user_id, score, doc)``.

    Each task's index scores with its own term statistics (as in any sharded index), so
    scores of different tasks are comparable but not identical to one big index's."""
    hits: list[tuple[str, float, dict[str, Any]]] = []
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage:
            hits.extend(storage.store("profiles").search(query, limit=limit))
    return heapq.nlargest(limit, hits, key=lambda h: h[1])
