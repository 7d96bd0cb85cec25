"""``search``: a persistent full-text index on tantivy, fault tolerant through change records.

Use case: searching user profiles.

.. code-block:: properties

    stores.profiles.factory = search
    stores.profiles.key.serde = string
    stores.profiles.search.fields = name:text:stored, bio:text, city:string:stored, age:int
    stores.profiles.search.default.fields = name, bio

>>> profiles = storage.store("profiles")                         # doctest: +SKIP
>>> profiles.index("u1", {"name": "Ada Lovelace", "bio": "loves engines", "city": "London"})
>>> profiles.search("bio:engines AND city:London")                # doctest: +SKIP
[('u1', 0.92, {'name': 'Ada Lovelace', 'city': 'London'})]

The contract (change records, documents, hits, read-your-writes, persistence and
restore, errors) is written in docs/engines.md, "search". This module is the engine: the
index's life cycle, writes, reads and restore. ``search_documents.py`` builds documents
(one or in bulk), ``search_feeder.py`` runs the batches of deletes and adds on a thread
of their own, ``search_files.py`` owns the files beside the index (the changelog offset
it covers, the rule for reusing it), ``search_schema.py`` the schema and options.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import tantivy
from localstate.engine import (
    ChangeRecord,
    StorageEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import (
    ConfigError,
    CorruptionError,
    InvalidValueError,
    LocalStateError,
    StoreClosedError,
)
from localstate.serdes import Serde

from .search_documents import DocumentBuilder, TantivyInput, decode_hits, id_term, unpack
from .search_feeder import WriterFeeder, apply_batch
from .search_files import SearchFiles
from .search_schema import (
    DOC_FIELD,
    ID_FIELD,
    MIN_HEAP_PER_THREAD,
    FieldSpec,
    InvalidQueryError,
    SearchOptions,
    build_schema,
    parse_fields,
    parse_query,
)

__all__ = [
    "FieldSpec",
    "InvalidQueryError",
    "SearchEngine",
    "SearchEngineFactory",
    "SearchOptions",
    "parse_fields",
]

log = logging.getLogger("localstate")

_ID = ID_FIELD
_DOC = DOC_FIELD
_DELETE_CHUNK = 100_000


# -- the engine ---------------------------------------------------------------------------------------
class SearchEngine(StorageEngine):
    """A tantivy index of documents keyed by id; docs/engines.md ("search") states the contract.

    Writes are ``O(1)`` Python work per document plus tantivy indexing; ``get`` is a dict
    lookup for uncommitted writes, else one term query; ``search`` is one tantivy query
    plus one stored-document fetch per hit.
    """

    def __init__(self, context: StoreContext, options: SearchOptions | None = None) -> None:
        """The index lives in ``context.directory``; documents are logged through
        ``context.change_logger`` and their ids encoded with ``context.key_serde``."""
        directory, name = context.directory, context.store
        change_logger: Any = context.change_logger
        key_serde: Serde = context.key_serde
        self.name = name
        self.directory = Path(directory)
        self.options = options = options or SearchOptions(fields="text:text:stored")
        options.validate(f"stores.{name}.search")
        self._fields = options.schema_fields()
        self._docs = DocumentBuilder(name, self._fields, build_schema(self._fields), key_serde, options.document_format)
        self._schema_text = self._docs.schema_text
        self._schema = self._docs.schema
        self._search_fields = options.search_fields()
        stored = [f.name for f in self._fields if f.stored]
        self._stored: list[str] | None = stored or None
        self._schema_names = self._docs.schema_names
        self._decode_doc = self._docs.decode_doc
        self._key_serde = key_serde
        self._logger = change_logger
        self._log = change_logger.log if change_logger is not None else None
        self._log_all = change_logger.log_all if change_logger is not None else None
        self._logged = bool(change_logger is not None and getattr(change_logger, "enabled", True))
        self._files = SearchFiles(self.directory, name, self._schema_text)
        self._index_dir = self._files.index_dir
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._feeder = WriterFeeder(name)
        """Sends the batches of deletes and adds to the writer on its own thread; anything
        else that touches the writer waits for it first (``_w``, ``_drop_writer``)."""
        self._closed = False
        self._buffer: dict[bytes, tuple[bytes, TantivyInput | None] | None] = {}
        """Writes not yet sent to the tantivy writer (last write per id wins): ``None`` for
        a delete, else the change record and what to add (a ``Document``, JSON text, or
        ``None`` for a plain JSON document of ``index()``, whose text ``_send`` makes from
        the change record: DocumentBuilder.document_or_json)."""
        self._sent: dict[bytes, bytes | None] = {}
        """Writes sent to the writer but not yet in a tantivy commit (for get())."""
        self._dirty = False
        """The writer holds operations that are not in a tantivy commit."""
        self._reader_stale = True
        self._opstamp = 0
        self._index_empty = False
        """The index was created empty and no tantivy commit has happened since: only ids in
        ``_sent`` can have a document, so writes of other ids need no delete."""
        self._open_problem: str | None = None
        """Why the local index cannot be reused as it is (checked by prepare_restore)."""
        self._open()

    # -- opening --------------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            self._index_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._translate(e, "create the index directory") from e
        try:
            exists = tantivy.Index.exists(str(self._index_dir))
        except (ValueError, OSError):
            exists = True  # let Index.open report what is wrong
        if exists:
            built_with = self._files.built_with()
            if built_with != self._schema_text:
                self._open_problem = (
                    f"its schema {built_with!r} differs from stores.{self.name}.search.fields = {self._schema_text!r}"
                )
                if not self._logged:
                    raise ConfigError(
                        f"store {self.name!r}: the index at {self._index_dir} was built with schema {built_with!r}, "
                        f"but stores.{self.name}.search.fields = {self._schema_text!r}, and the store has no "
                        "changelog to re-index from; restore the old schema or delete the directory"
                    )
                self._create_empty()
                return
        try:
            if exists:
                self._index = tantivy.Index.open(str(self._index_dir))
                self._opstamp = self._files.meta_opstamp()
            else:
                self._index = tantivy.Index(self._schema, path=str(self._index_dir))
                self._files.write_schema()
                self._index_empty = True
        except (ValueError, OSError, CorruptionError) as e:
            self._index = None
            self._open_problem = f"it cannot be opened ({e})"
            if not self._logged:
                raise CorruptionError(
                    f"store {self.name!r}: the tantivy index at {self._index_dir} is corrupt ({e}) and the store has "
                    "no changelog to rebuild it from; delete the directory to start empty (its documents are lost)"
                ) from e
            self._create_empty()
            return
        self._new_writer(self.options.heap_size_bytes)

    def _create_empty(self) -> None:
        """Replace whatever is on disk by an empty index (and no checkpoint file)."""
        self._drop_writer()
        self._index = None
        self._files.refuse_if_another_writer()
        try:
            self._files.clear()
            self._index = tantivy.Index(self._schema, path=str(self._index_dir))
            self._files.write_schema()
        except (OSError, ValueError) as e:
            raise self._translate(e, "create an empty index") from e
        self._opstamp = 0
        self._index_empty = True
        self._buffer.clear()
        self._sent.clear()
        self._dirty = False
        self._reader_stale = True
        self._new_writer(self.options.heap_size_bytes)

    def _new_writer(self, heap: int) -> None:
        assert self._index is not None
        try:
            self._writer = self._index.writer(heap, self._threads(heap))
        except ValueError as e:
            raise self._translate(e, "create a tantivy writer") from e

    def _threads(self, heap: int) -> int:
        wanted = self.options.writer_threads or min(os.cpu_count() or 1, 8)
        return max(1, min(wanted, heap // MIN_HEAP_PER_THREAD))

    def _drop_writer(self) -> None:
        """Discard uncommitted operations and release the writer lock (consumes the writer)."""
        self._feeder.reset()
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.rollback()
            finally:
                writer.wait_merging_threads()
        self._dirty = False

    def _w(self) -> tantivy.IndexWriter:
        """The writer, for direct use: after every batch handed to the feeder has run."""
        self._feeder.wait()
        return self._feed_writer()

    def _feed_writer(self) -> tantivy.IndexWriter:
        """The writer (a new one after a bulk restore consumed it), for the feeder."""
        w = self._writer
        if w is None:
            if self._closed:
                raise StoreClosedError(f"store {self.name!r} (search engine at {self._index_dir}) is closed")
            self._new_writer(self.options.heap_size_bytes)
            w = self._writer
            assert w is not None
        return w

    def _ix(self) -> tantivy.Index:
        if self._closed or self._index is None:
            raise StoreClosedError(f"store {self.name!r} (search engine at {self._index_dir}) is closed")
        return self._index

    # -- writes -------------------------------------------------------------------------------------
    def index(self, doc_id: Any, doc: Mapping[str, Any]) -> None:
        """Add or replace the document ``doc_id``. Visible to ``get`` at once, to ``search``
        at the next read (see read-your-writes). Bad documents raise before anything is logged."""
        self._ix()
        key = self._docs.key(doc_id)
        encoded, tdoc = self._docs.document_or_json(key, doc)
        buffer = self._buffer
        buffer[key] = (encoded, tdoc)
        if self._logged:
            self._log(key, encoded)  # type: ignore[misc]
        if len(buffer) >= self.options.write_buffer_docs:
            self._send()

    def index_all(self, docs: Iterable[tuple[Any, Mapping[str, Any]]] | Mapping[Any, Mapping[str, Any]]) -> None:
        """Index many ``(doc_id, doc)`` pairs; all are validated before any is applied or logged."""
        self._ix()
        try:
            pairs = list(docs.items() if isinstance(docs, Mapping) else docs)
        except TypeError as e:
            raise InvalidValueError(f"store {self.name!r}: index_all takes (doc_id, doc) pairs or a mapping: {e}") from e
        if not pairs:
            return
        doc_ids, values = self._docs.split_pairs(pairs)
        keys = self._docs.keys(doc_ids)
        encoded, tdocs = self._docs.documents(keys, values)
        records = dict(zip(keys, encoded))  # the change records; the last write of an id wins
        if len(records) != len(keys):
            tdocs = list(dict(zip(keys, tdocs)).values())
            keys = list(records)
            encoded = list(records.values())
        if len(keys) < self.options.write_buffer_docs:
            self._stage(list(zip(keys, zip(encoded, tdocs))))
        else:
            # a big batch goes straight to the writer: one delete of its ids, then adds
            self._send()
            self._feed(keys, tdocs)
            self._sent.update(records)
        if self._logged:
            self._log_all(records)  # type: ignore[misc]

    def delete(self, doc_id: Any) -> None:
        """Remove document ``doc_id`` (not an error if it does not exist); logs a tombstone."""
        self._ix()
        key = self._docs.key(doc_id)
        self._buffer[key] = None
        if self._logged:
            self._log(key, None)  # type: ignore[misc]
        if len(self._buffer) >= self.options.write_buffer_docs:
            self._send()

    def delete_all(self, doc_ids: Iterable[Any]) -> None:
        """Remove many documents."""
        self._ix()
        keys = self._docs.keys(list(doc_ids))
        self._stage([(k, None) for k in keys])
        if self._logged:
            self._log_all([(k, None) for k in keys])  # type: ignore[misc]

    def _stage(self, items: list[tuple[bytes, tuple[bytes, TantivyInput | None] | None]]) -> None:
        limit = self.options.write_buffer_docs
        buffer = self._buffer
        i, n = 0, len(items)
        while i < n:
            room = max(1, limit - len(buffer))
            buffer.update(items[i : i + room])
            i += room
            if len(buffer) >= limit:
                self._send()
                buffer = self._buffer  # _send() starts a new buffer

    def _send(self) -> None:
        """Send the write buffer to the tantivy writer: one delete of all its ids, then adds."""
        buffer = self._buffer
        if not buffer:
            return
        items: list[TantivyInput] = [value[1] for value in buffer.values() if value is not None and value[1] is not None]
        plain = [key for key, value in buffer.items() if value is not None and value[1] is None]
        if plain:  # the documents index() left to be made here, in one bulk pass
            items += self._docs.json_texts(plain, [buffer[key][0] for key in plain])  # type: ignore[index]
        self._feed(list(buffer), items)
        self._sent.update((key, None if value is None else value[0]) for key, value in buffer.items())
        self._buffer = {}

    def _feed(self, keys: list[bytes], items: list[TantivyInput]) -> None:
        """Hand the writer one delete of the documents of ``keys`` that may exist, then the
        adds of ``items`` (on the feeder thread: see search_feeder.py)."""
        self._feeder.submit(apply_batch, self._feed_writer(), self._delete_queries(keys), items)
        self._dirty = True

    def _delete_queries(self, keys: list[bytes]) -> list[tantivy.Query]:
        """The deletes of the documents of ``keys`` that may exist, before their new versions
        are added. In an index created empty and not committed since, only ids already sent
        can exist: the others are skipped (a delete query cost the writer's threads ~45% on
        top of indexing new documents, measured; benchmarks/RESULTS.md)."""
        if self._index_empty:
            sent = self._sent
            keys = [k for k in keys if k in sent]
        term_set = tantivy.Query.term_set_query
        return [term_set(self._schema, _ID, list(map(id_term, keys[i : i + _DELETE_CHUNK])))
                for i in range(0, len(keys), _DELETE_CHUNK)]

    def _commit_writer(self) -> None:
        """Make every write searchable and durable in a tantivy commit (not a task commit)."""
        self._send()
        if self._dirty:
            try:
                self._opstamp = self._w().commit()
            except (ValueError, RuntimeError, OSError) as e:
                raise self._translate(e, "commit the tantivy writer") from e
            self._dirty = False
            self._sent = {}
            self._index_empty = False
            self._reader_stale = True

    def _searcher(self) -> tantivy.Searcher:
        index = self._ix()
        if self._buffer or self._dirty:
            self._commit_writer()
        if self._reader_stale:
            index.reload()
            self._reader_stale = False
        return index.searcher()

    # -- reads --------------------------------------------------------------------------------------
    def _lookup(self, key: bytes) -> bytes | None:
        """The encoded document of ``key`` as of every write so far, or None."""
        self._ix()
        staged = self._buffer.get(key, False)
        if staged is not False:
            return None if staged is None else staged[0]
        sent = self._sent.get(key, False)
        if sent is not False:
            return sent
        index = self._ix()
        if self._reader_stale:
            index.reload()
            self._reader_stale = False
        searcher = index.searcher()
        try:
            hits = searcher.search(tantivy.Query.term_query(self._schema, _ID, key.decode("latin-1")), 1, count=False).hits
            if not hits:
                return None
            return unpack(searcher.doc(hits[0][1]).get_first(_DOC))[1]
        except (ValueError, OSError) as e:
            raise self._translate(e, f"read document {key!r}") from e

    def get(self, doc_id: Any) -> dict[str, Any] | None:
        """The whole document ``doc_id`` (including uncommitted writes), or None."""
        encoded = self._lookup(self._docs.key(doc_id))
        return None if encoded is None else self._decode_doc(encoded)

    def __contains__(self, doc_id: Any) -> bool:
        return self._lookup(self._docs.key(doc_id)) is not None

    def parse_query(self, query: str) -> tantivy.Query:
        """Parse ``query`` (tantivy query language) over ``default.fields``.

        Raises :class:`InvalidQueryError` (a ``ValueError``) naming the query.
        """
        return parse_query(self._ix(), query, self._search_fields, self.name, self._schema_names)

    def search(self, query: str | tantivy.Query, limit: int = 10) -> list[tuple[Any, float, dict[str, Any]]]:
        """The best ``limit`` matches as ``(doc_id, score, doc)``, best first.

        ``doc`` holds the ``stored`` schema fields (the whole document if none is marked
        stored). Sees every write made so far (commits the tantivy writer lazily).
        """
        if type(limit) is not int or limit <= 0:
            raise InvalidValueError(f"store {self.name!r}: search limit must be a positive int, got {limit!r}")
        q = query if isinstance(query, tantivy.Query) else self.parse_query(query)
        searcher = self._searcher()
        try:
            # tantivy sizes its top-k heap by ``limit``: never ask for more than exist
            hits = searcher.search(q, min(limit, max(1, searcher.num_docs)), count=False).hits
            return decode_hits(searcher, hits, self._key_serde.decode, self._decode_doc, self._stored)
        except (ValueError, OSError) as e:
            raise self._translate(e, f"run query {query!r}") from e

    def _translate(self, e: BaseException, action: str) -> LocalStateError:
        return self._files.translate(e, action)

    def count(self, query: str | tantivy.Query) -> int:
        """How many documents match ``query``."""
        q = query if isinstance(query, tantivy.Query) else self.parse_query(query)
        searcher = self._searcher()
        return searcher.search(q, 1, count=True).count

    def __len__(self) -> int:
        """Number of documents (commits the tantivy writer lazily, like ``search``)."""
        return self._searcher().num_docs

    def _all_documents(self) -> Iterator[tuple[bytes, bytes]]:
        searcher = self._searcher()
        n = searcher.num_docs
        if not n:
            return
        for _, address in searcher.search(tantivy.Query.all_query(), n, count=False).hits:
            d = searcher.doc(address)
            yield unpack(d.get_first(_DOC))

    def documents(self) -> dict[Any, dict[str, Any]]:
        """Every document as ``{doc_id: doc}`` (``O(n)``; for tools and tests)."""
        decode_key, decode_doc = self._key_serde.decode, self._decode_doc
        return {decode_key(k): decode_doc(v) for k, v in self._all_documents()}

    # -- StorageEngine --------------------------------------------------------------------------------
    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        lookup = self._lookup
        return [(k, lookup(k)) for k in keys]

    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        """Bulk-apply change records: one writer with ``restore.heap.size.bytes``, one commit,
        then the writer is consumed by ``wait_merging_threads()`` and a normal one recreated."""
        self._ix()
        self._commit_writer()
        self._drop_writer()
        self._new_writer(self.options.restore_heap_size_bytes)
        writer = self._writer
        assert writer is not None
        empty = into_empty and self._opstamp == 0 and self._files.meta_segments() == 0
        latest: dict[bytes, bytes | None] = {}
        latest.update(records)
        if not empty:
            for query in self._delete_queries(list(latest)):
                writer.delete_documents_by_query(query)
        misfits = self._docs.add_restored(writer, ((k, v) for k, v in latest.items() if v is not None))
        del latest
        if misfits:
            log.warning(
                "store %r: %d restored documents have fields that do not fit stores.%s.search.fields = %r; "
                "those fields are not indexed (get() still returns them)",
                self.name, misfits, self.name, self._schema_text,
            )
        self._opstamp = writer.commit()
        self._index_empty = False
        self._reader_stale = True
        # the bulk writer is consumed here; index writes need a writer with the normal heap
        self._writer = None
        writer.wait_merging_threads()
        self._new_writer(self.options.heap_size_bytes)

    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        self._ix()
        problem = self._open_problem
        offset = -1
        if problem is None:
            offset, problem = self._files.reusable_from(
                committed_offset, min_valid_offset, self._opstamp, lambda: self._searcher().num_docs)
        if problem is None:
            return max(offset, 0)
        if offset > committed_offset or "opstamp" in problem:
            log.info("store %r: rebuilding the index at %s from the changelog: %s", self.name, self._index_dir, problem)
        else:
            log.warning("store %r: rebuilding the index at %s from the changelog: %s", self.name, self._index_dir, problem)
        self._open_problem = None
        self._create_empty()
        return 0

    def flush(self) -> None:
        """Commit the tantivy writer (durable on return)."""
        self._ix()
        self._commit_writer()

    def checkpoint(self, offset: int) -> None:
        """Record that the index (as of the last ``flush()``) equals changelog ``[0, offset)``."""
        self._ix()
        self._commit_writer()
        self._write_checkpoint(offset)

    def _write_checkpoint(self, offset: int) -> None:
        self._files.write_checkpoint(offset, self._opstamp, self._searcher().num_docs)

    def wipe(self) -> None:
        self._ix()
        self._create_empty()

    def close(self) -> None:
        """Discard uncommitted writes, wait for merges, release the writer lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._buffer = {}
        self._sent = {}
        try:
            self._drop_writer()
        finally:
            self._index = None
            self._feeder.close()

    def __enter__(self) -> SearchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- invariants ---------------------------------------------------------------------------------
    def _check(self) -> None:
        """Verify every internal invariant (``O(n)``; for tests)."""
        assert not self._closed and self._index is not None
        for key, value in self._buffer.items():
            assert type(key) is bytes
            assert value is None or (type(value[0]) is bytes and isinstance(value[1], (tantivy.Document, str, type(None))))
        for key, value in self._sent.items():
            assert type(key) is bytes and (value is None or type(value) is bytes)
        assert not self._sent or self._dirty, "writes sent but the writer is not dirty"
        if not self._dirty:
            assert self._opstamp == self._files.meta_opstamp(), "opstamp differs from meta.json"
        overlay = {**self._sent, **{k: (None if v is None else v[0]) for k, v in self._buffer.items()}}
        was_stale = self._reader_stale
        index = self._index
        index.reload()
        searcher = index.searcher()
        seen: dict[bytes, bytes] = {}
        n = searcher.num_docs
        if n:
            for _, address in searcher.search(tantivy.Query.all_query(), n, count=False).hits:
                d = searcher.doc(address)
                key, encoded = unpack(d.get_first(_DOC))
                assert key not in seen, f"document id {key!r} indexed twice"
                seen[key] = encoded
                assert isinstance(self._decode_doc(seen[key]), dict)
        assert len(seen) == n
        assert not (self._index_empty and seen), "an index marked empty has committed documents"
        self._reader_stale = was_stale
        for key, value in overlay.items():
            assert self._lookup(key) == value
        for key, value in seen.items():
            if key not in overlay:
                assert self._lookup(key) == value


class SearchEngineFactory(StorageEngineFactory):
    """Factory ``search``: options under ``stores.<s>.search.*`` (:class:`SearchOptions`)."""

    options_prefix = "search"
    options_type = SearchOptions
    description = "full-text index (tantivy); stores the changelog offset it covers, replays only the tail"

    def create(self, spec: StoreSpec, context: StoreContext) -> SearchEngine:
        options = spec.options
        if options is None or not options.fields:
            raise ConfigError(
                f"store {spec.name!r}: set stores.{spec.name}.search.fields, e.g. "
                "'name:text:stored, bio:text, city:string:stored'"
            )
        return SearchEngine(context, options)
