"""The thread that feeds a ``search`` store's tantivy writer: batches of deletes and adds
run there, in the order they were handed over, while the task's thread goes on with the
change records and the next batch.

Why: tantivy parses a document's JSON (``add_json``) and waits for room in its indexing
queue without holding the GIL, so on the task's thread those ~1.4 µs per document were
time in which no Python ran.

The rules that keep it exact:

* one thread, one queue: operations reach the writer in hand-over order (a delete of an
  id still lands after the add of its older version, and before the newer one);
* whoever touches the writer directly (commit, rollback, restore, close) first calls
  :meth:`WriterFeeder.wait`, which returns when every handed-over operation has run;
* a failed operation makes the feeder *broken*: every later hand-over and wait raises
  that error again, so a task commit can never succeed over a batch that did not reach
  the index (the store must be closed, or rebuilt with :meth:`WriterFeeder.reset`);
* at most ``max_in_flight`` batches wait in the queue, so the task's thread cannot run
  far ahead of tantivy (memory stays bounded by a few batches of documents).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import tantivy
from localstate.errors import EngineError

from .search_documents import TantivyInput, add_to

__all__ = ["WriterFeeder", "apply_batch"]


def apply_batch(writer: tantivy.IndexWriter, deletes: list[tantivy.Query], items: list[TantivyInput]) -> None:
    """One batch, on the feeder thread: its deletes, then its adds."""
    for query in deletes:
        writer.delete_documents_by_query(query)
    add_to(writer, items)


class WriterFeeder:
    """Runs writer operations on one background thread, in hand-over order."""

    def __init__(self, store: str, max_in_flight: int = 2) -> None:
        self.store = store
        self.max_in_flight = max(1, max_in_flight)
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: list[Future[Any]] = []
        self._failure: BaseException | None = None

    def submit(self, operation: Callable[..., Any], *args: Any) -> None:
        """Run ``operation(*args)`` on the feeder thread after everything handed over
        before; waits for the oldest batch first when ``max_in_flight`` are queued."""
        self._raise_failure()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-search-{self.store}")
        self._in_flight.append(self._pool.submit(operation, *args))
        while len(self._in_flight) > self.max_in_flight:
            self._settle(self._in_flight.pop(0))
        self._raise_failure()

    def wait(self) -> None:
        """Return when every handed-over operation has run; raises the first failure."""
        while self._in_flight:
            self._settle(self._in_flight.pop(0))
        self._raise_failure()

    def reset(self) -> None:
        """Wait for the thread, then forget a failure (the writer's uncommitted state is
        being discarded: a rollback, a rebuild, a close)."""
        while self._in_flight:
            self._settle(self._in_flight.pop(0))
        self._failure = None

    def close(self) -> None:
        """:meth:`reset`, then stop the thread."""
        self.reset()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    @property
    def idle(self) -> bool:
        """No operation is queued or running."""
        return not self._in_flight

    def _settle(self, future: Future[Any]) -> None:
        try:
            future.result()
        except BaseException as e:  # any failure: the writer did not get the whole batch
            if self._failure is None:
                self._failure = e

    def _raise_failure(self) -> None:
        e = self._failure
        if e is not None:
            raise EngineError(
                f"store {self.store!r}: a batch of writes did not reach the tantivy writer ({type(e).__name__}: {e}); "
                "its documents are in the changelog but not in the index, so nothing more is written or committed: "
                "close the task and reopen it (the index is rebuilt from the changelog)"
            ) from e
