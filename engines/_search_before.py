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

Contract
--------
* **Change records**: key = the document id encoded with the store's ``key.serde``;
  value = the whole document encoded as JSON (orjson; ``document.format = msgpack`` is
  the alternative), or a tombstone on ``delete``. ``restore()`` rebuilds the index from
  exactly these records: one writer with ``restore.heap.size.bytes``, one commit.
* **Documents** are ``dict``\\s with ``str`` keys. Fields named in the schema are
  indexed (type-checked by tantivy: a wrong type is an :class:`InvalidValueError`, and
  nothing is logged); other fields are kept in the stored document only. A ``None``
  schema field counts as absent. ``get()`` returns the whole document as decoded from
  its change record (JSON semantics: tuples come back as lists).
* **Search hits** are ``(doc_id, score, doc)``, best first, where ``doc`` holds the
  schema fields marked ``stored`` (the whole document when no field is marked).
* **Read-your-writes** (what we chose): writes go to an in-memory batch that is sent
  to the tantivy writer every ``write.buffer.docs`` documents. ``get()`` sees every
  write at once (it checks the uncommitted writes first). ``search()`` and ``len()``
  see only committed tantivy segments, so when writes are pending they first commit
  the tantivy writer — lazily, **at most once per batch of writes** between two reads.
  Such an early tantivy commit is not a task commit: if the task then dies before its
  commit, the index is ahead of the changelog and is rebuilt on reopen (below).
* **Persistence**: the index lives in ``<store dir>/index``. At each task commit
  ``flush()`` commits the tantivy writer and ``checkpoint(offset)`` then writes
  ``<store dir>/search-checkpoint.json`` atomically: the changelog offset the index
  covers, the tantivy commit opstamp and the document count (the Python binding has
  no commit payload, so the offset lives in this side file, written *after* the index
  commit). ``prepare_restore(C, min_valid)`` reuses the index — and only ``[L, C)`` is
  replayed — when the side file is readable, its opstamp equals the opstamp in
  tantivy's ``meta.json`` (merges keep it; any later tantivy commit bumps it), its
  document count matches, its schema equals the configured one and
  ``min_valid <= L <= C``. Otherwise the index is wiped and rebuilt from ``[0, C)``:
  after a crash between the tantivy commit and the task checkpoint the index is
  *ahead* of ``C`` and cannot be rolled back, a schema change needs a re-index, and a
  corrupt directory is rebuilt with a warning. Without a changelog a corrupt index is
  a :class:`CorruptionError` naming the path.
* tantivy allows one writer per index: a second engine over the same directory gets
  :class:`StoreLockedError`. A writer consumed by ``wait_merging_threads()`` (after a
  bulk restore, at ``close()``) is replaced by a new one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgpack
import orjson
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
    EngineError,
    InvalidValueError,
    LocalStateError,
    SerializationError,
    StoreClosedError,
    StoreLockedError,
)
from localstate.faults import fault_point
from localstate.locking import io_error
from localstate.serdes import Serde

from .search_schema import (
    DOC_FIELD,
    ID_FIELD,
    MIN_HEAP_PER_THREAD,
    FieldSpec,
    SearchOptions,
    build_schema,
    parse_fields,
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
_CHECKPOINT_FILE = "search-checkpoint.json"
_INDEX_DIR = "index"
_SCHEMA_FILE = "search-schema.txt"
_CHECKPOINT_VERSION = 1
_RESTORE_CHUNK = 50_000
_DELETE_CHUNK = 100_000
_KEY_LENGTH = struct.Struct(">I")


class InvalidQueryError(InvalidValueError):
    """A search query tantivy cannot parse; the message shows the query and the cause."""


def _codec(fmt: str) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    if fmt == "msgpack":
        packer = msgpack.Packer(use_bin_type=True)
        return packer.pack, lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False)
    return orjson.dumps, orjson.loads


def _pack(key: bytes, encoded: bytes) -> bytes:
    """The stored ``_doc`` value: 4-byte key length, key, encoded document (one stored
    field instead of two: ~10% faster indexing)."""
    return b"%b%b%b" % (_KEY_LENGTH.pack(len(key)), key, encoded)


def _unpack(stored: bytes) -> tuple[bytes, bytes]:
    n = int.from_bytes(stored[:4], "big") + 4
    return stored[4:n], stored[n:]


# -- the engine ---------------------------------------------------------------------------------------
class SearchEngine(StorageEngine):
    """A tantivy index of documents keyed by id; see the module docstring for the contract.

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
        self._schema_text = ", ".join(f.canonical() for f in self._fields)
        self._schema = build_schema(self._fields)
        self._search_fields = options.search_fields()
        stored = [f.name for f in self._fields if f.stored]
        self._stored: list[str] | None = stored or None
        self._floats = [f.name for f in self._fields if f.type == "float"]
        self._schema_names = frozenset(f.name for f in self._fields)
        self._encode_doc, self._decode_doc = _codec(options.document_format)
        self._key_serde = key_serde
        self._logger = change_logger
        self._log = change_logger.log if change_logger is not None else None
        self._log_all = change_logger.log_all if change_logger is not None else None
        self._logged = bool(change_logger is not None and getattr(change_logger, "enabled", True))
        self._index_dir = self.directory / _INDEX_DIR
        self._checkpoint_path = self.directory / _CHECKPOINT_FILE
        self._schema_path = self.directory / _SCHEMA_FILE
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._closed = False
        self._buffer: dict[bytes, tuple[bytes, tantivy.Document] | None] = {}
        """Writes not yet sent to the tantivy writer (last write per id wins)."""
        self._sent: dict[bytes, bytes | None] = {}
        """Writes sent to the writer but not yet in a tantivy commit (for get())."""
        self._dirty = False
        """The writer holds operations that are not in a tantivy commit."""
        self._reader_stale = True
        self._opstamp = 0
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
            try:
                built_with = self._schema_path.read_text().strip()
            except OSError:
                built_with = "(unknown: search-schema.txt is missing)"
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
                self._opstamp = self._meta_opstamp()
            else:
                self._index = tantivy.Index(self._schema, path=str(self._index_dir))
                self._write_schema()
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
        self._refuse_if_another_writer()
        try:
            if self._checkpoint_path.exists():
                self._checkpoint_path.unlink()
            shutil.rmtree(self._index_dir, ignore_errors=True)
            self._index_dir.mkdir(parents=True, exist_ok=True)
            self._index = tantivy.Index(self._schema, path=str(self._index_dir))
            self._write_schema()
        except (OSError, ValueError) as e:
            raise self._translate(e, "create an empty index") from e
        self._opstamp = 0
        self._buffer.clear()
        self._sent.clear()
        self._dirty = False
        self._reader_stale = True
        self._new_writer(self.options.heap_size_bytes)

    def _refuse_if_another_writer(self) -> None:
        """Raise StoreLockedError if another writer holds the index (tantivy's lock is a flock)."""
        lock = self._index_dir / ".tantivy-writer.lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            return  # no lock file: no writer
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(
                f"store {self.name!r}: the index at {self._index_dir} has a writer in this or another process; "
                "it was not wiped. Close the other engine/TaskStorage first"
            ) from None
        finally:
            os.close(fd)

    def _write_schema(self) -> None:
        """Record the schema the (new, empty) index is built with, durably."""
        tmp = self._schema_path.with_name(_SCHEMA_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(self._schema_text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._schema_path)

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
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.rollback()
            finally:
                writer.wait_merging_threads()
        self._dirty = False

    def _meta_opstamp(self) -> int:
        path = self._index_dir / "meta.json"
        try:
            return int(json.loads(path.read_bytes())["opstamp"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"store {self.name!r}: cannot read the opstamp of {path}: {e}") from e

    def _read_checkpoint(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self._checkpoint_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("store %r: unreadable %s (%s); the index will be rebuilt", self.name, self._checkpoint_path, e)
            return {"problem": str(e), "schema": self._schema_text}
        return data if isinstance(data, dict) else {"problem": "not an object", "schema": self._schema_text}

    def _w(self) -> tantivy.IndexWriter:
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

    # -- encoding ---------------------------------------------------------------------------------
    def _key(self, doc_id: Any) -> bytes:
        try:
            key = self._key_serde.encode(doc_id)
        except Exception as e:
            raise SerializationError(
                f"store {self.name!r}: document id {doc_id!r} ({type(doc_id).__name__}) cannot be encoded by "
                f"key serde {self._key_serde.name!r}: {e}. Set stores.{self.name}.key.serde (e.g. string)"
            ) from e
        if type(key) is not bytes:
            raise SerializationError(f"store {self.name!r}: key serde {self._key_serde.name!r} returned {type(key).__name__}")
        return key

    def _document(self, key: bytes, doc: Any) -> tuple[bytes, tantivy.Document]:
        """Encode ``doc`` for the changelog and build its tantivy document (validated)."""
        if type(doc) is not dict:
            if doc is None:
                raise InvalidValueError(f"store {self.name!r}: index(doc_id, None) is not allowed; use delete(doc_id)")
            if not isinstance(doc, Mapping):
                raise InvalidValueError(
                    f"store {self.name!r}: a document is a dict of fields, got {type(doc).__name__} for id {key!r}"
                )
            doc = dict(doc)
        try:
            encoded = self._encode_doc(doc)
        except (TypeError, ValueError, OverflowError) as e:
            raise SerializationError(
                f"store {self.name!r}: document {key!r} cannot be encoded as {self.options.document_format}: {e}"
            ) from e
        return encoded, self._tantivy_doc(key, doc, encoded)

    def _tantivy_doc(self, key: bytes, doc: dict[str, Any], encoded: bytes) -> tantivy.Document:
        """The tantivy document of ``doc`` (schema fields, id and stored encoding)."""
        for f in self._floats:
            v = doc.get(f)
            if type(v) is float and not math.isfinite(v):
                raise InvalidValueError(f"store {self.name!r}: document {key!r} field {f!r} = {v!r}: NaN/inf cannot be indexed")
        fields = {**doc, _ID: key.decode("latin-1"), _DOC: _pack(key, encoded)}
        try:
            tdoc = tantivy.Document.from_dict(fields, self._schema)
        except ValueError as e:
            nones = [k for k in self._schema_names if k in doc and doc[k] is None]
            if not nones:
                raise InvalidValueError(
                    f"store {self.name!r}: document {key!r} does not fit schema stores.{self.name}.search.fields "
                    f"= {self._schema_text!r}: {e}"
                ) from e
            return self._tantivy_doc(key, {k: v for k, v in doc.items() if v is not None}, encoded)
        return tdoc

    # -- writes -------------------------------------------------------------------------------------
    def index(self, doc_id: Any, doc: Mapping[str, Any]) -> None:
        """Add or replace the document ``doc_id``. Visible to ``get`` at once, to ``search``
        at the next read (see read-your-writes). Bad documents raise before anything is logged."""
        self._ix()
        key = self._key(doc_id)
        encoded, tdoc = self._document(key, doc)
        buffer = self._buffer
        buffer[key] = (encoded, tdoc)
        if self._logged:
            self._log(key, encoded)  # type: ignore[misc]
        if len(buffer) >= self.options.write_buffer_docs:
            self._send()

    def index_all(self, docs: Iterable[tuple[Any, Mapping[str, Any]]] | Mapping[Any, Mapping[str, Any]]) -> None:
        """Index many ``(doc_id, doc)`` pairs; all are validated before any is applied or logged."""
        self._ix()
        if isinstance(docs, Mapping):
            docs = docs.items()
        key_of, document = self._key, self._document
        batch: dict[bytes, tuple[bytes, tantivy.Document]] = {}
        for doc_id, doc in docs:
            key = key_of(doc_id)
            batch[key] = document(key, doc)
        if len(batch) < self.options.write_buffer_docs:
            self._stage(list(batch.items()))
        else:
            # a big batch goes straight to the writer: one delete of its ids, then adds
            self._send()
            writer = self._w()
            keys = list(batch)
            for i in range(0, len(keys), _DELETE_CHUNK):
                ids = [k.decode("latin-1") for k in keys[i : i + _DELETE_CHUNK]]
                writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, _ID, ids))
            add = writer.add_document
            for _, tdoc in batch.values():
                add(tdoc)
            self._dirty = True
            self._sent.update(zip(keys, map(itemgetter(0), batch.values())))
        if self._logged:
            self._log_all(zip(batch, map(itemgetter(0), batch.values())))  # type: ignore[misc]

    def delete(self, doc_id: Any) -> None:
        """Remove document ``doc_id`` (not an error if it does not exist); logs a tombstone."""
        self._ix()
        key = self._key(doc_id)
        self._buffer[key] = None
        if self._logged:
            self._log(key, None)  # type: ignore[misc]
        if len(self._buffer) >= self.options.write_buffer_docs:
            self._send()

    def delete_all(self, doc_ids: Iterable[Any]) -> None:
        """Remove many documents."""
        self._ix()
        keys = [self._key(d) for d in doc_ids]
        self._stage([(k, None) for k in keys])
        if self._logged:
            self._log_all([(k, None) for k in keys])  # type: ignore[misc]

    def _stage(self, items: list[tuple[bytes, tuple[bytes, tantivy.Document] | None]]) -> None:
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
        writer = self._w()
        ids = [k.decode("latin-1") for k in buffer]
        writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, _ID, ids))
        add = writer.add_document
        sent = self._sent
        for key, value in buffer.items():
            if value is None:
                sent[key] = None
            else:
                add(value[1])
                sent[key] = value[0]
        self._buffer = {}
        self._dirty = True

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
            return _unpack(searcher.doc(hits[0][1]).get_first(_DOC))[1]
        except (ValueError, OSError) as e:
            raise self._translate(e, f"read document {key!r}") from e

    def get(self, doc_id: Any) -> dict[str, Any] | None:
        """The whole document ``doc_id`` (including uncommitted writes), or None."""
        encoded = self._lookup(self._key(doc_id))
        return None if encoded is None else self._decode_doc(encoded)

    def __contains__(self, doc_id: Any) -> bool:
        return self._lookup(self._key(doc_id)) is not None

    def parse_query(self, query: str) -> tantivy.Query:
        """Parse ``query`` (tantivy query language) over ``default.fields``.

        Raises :class:`InvalidQueryError` (a ``ValueError``) naming the query.
        """
        if not isinstance(query, str):
            raise InvalidQueryError(f"store {self.name!r}: a query is a str or tantivy.Query, got {type(query).__name__}")
        try:
            return self._ix().parse_query(query, self._search_fields)
        except ValueError as e:
            raise InvalidQueryError(
                f"store {self.name!r}: invalid search query {query!r}: {e}. Query syntax: "
                f"terms, field:term, \"phrases\", AND/OR/NOT, +/-, field:[a TO b]; fields: "
                f"{', '.join(sorted(self._schema_names))}"
            ) from e

    def search(self, query: str | tantivy.Query, limit: int = 10) -> list[tuple[Any, float, dict[str, Any]]]:
        """The best ``limit`` matches as ``(doc_id, score, doc)``, best first.

        ``doc`` holds the ``stored`` schema fields (the whole document if none is marked
        stored). Sees every write made so far (commits the tantivy writer lazily).
        """
        if type(limit) is not int or limit <= 0:
            raise InvalidValueError(f"store {self.name!r}: search limit must be a positive int, got {limit!r}")
        q = query if isinstance(query, tantivy.Query) else self.parse_query(query)
        searcher = self._searcher()
        out = []
        decode_key, decode_doc, stored = self._key_serde.decode, self._decode_doc, self._stored
        doc_at = searcher.doc
        from_bytes = int.from_bytes
        try:
            # tantivy sizes its top-k heap by ``limit``: never ask for more than exist
            hits = searcher.search(q, min(limit, max(1, searcher.num_docs)), count=False).hits
            for score, address in hits:
                packed = doc_at(address).get_first(_DOC)
                n = from_bytes(packed[:4], "big") + 4  # _unpack(), inlined: this loop is the hot path
                doc = decode_doc(packed[n:])
                if stored is not None:
                    doc = {k: doc[k] for k in stored if k in doc}
                out.append((decode_key(packed[4:n]), score, doc))
        except (ValueError, OSError) as e:
            raise self._translate(e, f"run query {query!r}") from e
        return out

    def _translate(self, e: BaseException, action: str) -> LocalStateError:
        """The one place tantivy and file-system errors become localstate errors."""
        if isinstance(e, LocalStateError):
            return e
        if "LockBusy" in str(e):
            return StoreLockedError(
                f"store {self.name!r}: the index at {self._index_dir} already has a writer (tantivy LockBusy) "
                "in this or another process; close the other engine/TaskStorage first"
            )
        if isinstance(e, OSError):
            return io_error(e, action + " in", self._index_dir, EngineError)
        return EngineError(
            f"store {self.name!r}: tantivy failed to {action} on the index at {self._index_dir}: {e}. If it is damaged, "
            "close the task, delete that directory and reopen: it is rebuilt from the changelog"
        )

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
            yield _unpack(d.get_first(_DOC))

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
        empty = into_empty and self._opstamp == 0 and self._meta_segments() == 0
        decode, tantivy_doc = self._decode_doc, self._tantivy_doc
        latest: dict[bytes, bytes | None] = {}
        latest.update(records)
        add = writer.add_document
        misfits = 0
        if not empty:
            keys = list(latest)
            for i in range(0, len(keys), _DELETE_CHUNK):
                ids = [k.decode("latin-1") for k in keys[i : i + _DELETE_CHUNK]]
                writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, _ID, ids))
        for key, value in latest.items():
            if value is None:
                continue
            try:
                doc = decode(value)
            except Exception as e:
                raise CorruptionError(
                    f"store {self.name!r}: change record {key!r} is not a {self.options.document_format} document: {e}"
                ) from e
            try:
                add(tantivy_doc(key, doc, value))
            except InvalidValueError:
                # logged under an older schema (a field changed type): index what still fits
                add(self._fitting_doc(key, doc, value))
                misfits += 1
        del latest
        if misfits:
            log.warning(
                "store %r: %d restored documents have fields that do not fit stores.%s.search.fields = %r; "
                "those fields are not indexed (get() still returns them)",
                self.name, misfits, self.name, self._schema_text,
            )
        self._opstamp = writer.commit()
        self._reader_stale = True
        # the bulk writer is consumed here; index writes need a writer with the normal heap
        self._writer = None
        writer.wait_merging_threads()
        self._new_writer(self.options.heap_size_bytes)

    def _fitting_doc(self, key: bytes, doc: dict[str, Any], encoded: bytes) -> tantivy.Document:
        """The tantivy document of ``doc`` without the schema fields whose values do not fit."""
        fitting = {}
        for name, value in doc.items():
            if name in self._schema_names:
                try:
                    self._tantivy_doc(key, {name: value}, encoded)
                except InvalidValueError:
                    continue
            fitting[name] = value
        return self._tantivy_doc(key, fitting, encoded)

    def _meta_segments(self) -> int:
        try:
            return len(json.loads((self._index_dir / "meta.json").read_bytes())["segments"])
        except (OSError, ValueError, KeyError):
            return -1

    def prepare_restore(self, committed_offset: int, min_valid_offset: int) -> int:
        self._ix()
        problem = self._open_problem
        saved = self._read_checkpoint() if problem is None else None
        offset = -1
        if problem is None:
            if saved is None:
                problem = "it has no search-checkpoint.json (never committed)" if self._opstamp else None
            elif "problem" in saved:
                problem = f"{self._checkpoint_path} is unreadable ({saved['problem']})"
            elif saved.get("version") != _CHECKPOINT_VERSION:
                problem = f"{self._checkpoint_path} has unknown version {saved.get('version')!r}"
            else:
                offset = int(saved.get("offset", -1))
                if saved.get("opstamp") != self._opstamp:
                    problem = (
                        f"its tantivy commit (opstamp {self._opstamp}) is not the one checkpointed at changelog "
                        f"offset {offset} (opstamp {saved.get('opstamp')}): it holds writes that were never committed"
                    )
                elif not min_valid_offset <= offset <= committed_offset:
                    problem = (
                        f"it covers changelog offset {offset}, outside [{min_valid_offset}, {committed_offset}]"
                    )
                else:
                    try:
                        n = self._searcher().num_docs
                    except (ValueError, OSError) as e:
                        problem = f"it cannot be read ({e})"
                    else:
                        if n != saved.get("num_docs"):
                            problem = f"it has {n} documents where the checkpoint says {saved.get('num_docs')}"
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
        fault_point("snapshot.mid")
        data = {
            "version": _CHECKPOINT_VERSION,
            "offset": offset,
            "opstamp": self._opstamp,
            "num_docs": self._searcher().num_docs,
            "schema": self._schema_text,
        }
        tmp = self._checkpoint_path.with_name(_CHECKPOINT_FILE + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(json.dumps(data).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._checkpoint_path)
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise self._translate(e, f"write {self._checkpoint_path.name}") from e

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
            assert value is None or (type(value[0]) is bytes and isinstance(value[1], tantivy.Document))
        for key, value in self._sent.items():
            assert type(key) is bytes and (value is None or type(value) is bytes)
        assert not self._sent or self._dirty, "writes sent but the writer is not dirty"
        if not self._dirty:
            assert self._opstamp == self._meta_opstamp(), "opstamp differs from meta.json"
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
                key, encoded = _unpack(d.get_first(_DOC))
                assert key not in seen, f"document id {key!r} indexed twice"
                seen[key] = encoded
                assert isinstance(self._decode_doc(seen[key]), dict)
        assert len(seen) == n
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
