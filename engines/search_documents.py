"""The documents of a ``search`` store: ids to change-record keys, documents to
change-record values (JSON or msgpack) and to tantivy documents, one at a time or in
bulk, with the checks that make a bad document fail before anything is indexed or logged.

The bulk methods exist because building documents in Python cost as much as tantivy's
whole indexing loop: they
run the encoders over a whole batch with ``map``. With the JSON document format a batch
whose schema fields hold only plain values (:meth:`DocumentBuilder.json_docs`) becomes
tantivy JSON text built by byte concatenation from the change-record values themselves,
which ``IndexWriter.add_json`` parses in Rust: no Python dict or ``Document`` per
document (``from_dict`` cost ~1 µs more per document, and its dicts kept the garbage
collector busy). Every other batch builds one
``Document.from_dict`` per document. A batch that fails any check is rebuilt one
document at a time, so the error names the first bad document exactly as the single
path does. ``index()`` checks its one document the same way (:meth:`DocumentBuilder.plain_doc`)
and keeps a plain one as its change record only; the engine makes the JSON text of all
of them in one pass (:meth:`DocumentBuilder.json_texts`) when its write buffer is sent,
which costs less process CPU than per-call indexing.

The stored ``_doc`` field of every tantivy document is ``packed``: a 4-byte big-endian
key length, the key, the encoded document (one stored field instead of two: ~10%
faster indexing). Its layout is part of the on-disk index format.
"""

from __future__ import annotations

import math
import struct
from binascii import b2a_base64
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import chain, repeat
from operator import add, itemgetter, methodcaller
from typing import Any

import msgpack
import orjson
import tantivy
from localstate.errors import CorruptionError, InvalidValueError, SerializationError
from localstate.serdes import Serde, encoder_of_many

from .search_schema import DOC_FIELD, ID_FIELD, FieldSpec

__all__ = ["DocumentBuilder", "TantivyInput", "add_to", "decode_hits", "id_term", "pack", "pack_many", "unpack"]

TantivyInput = tantivy.Document | str
"""What goes to the tantivy writer for one document: a ``Document``, or its JSON text."""


def add_to(writer: tantivy.IndexWriter, items: Sequence[TantivyInput]) -> None:
    """Add each document (a ``Document`` or JSON text, see :data:`TantivyInput`) to ``writer``;
    a batch of one kind (what the bulk builders return) in one C-level pass."""
    kinds = set(map(type, items))
    if len(kinds) == 1:
        deque(map(writer.add_json if str in kinds else writer.add_document, items), 0)
        return
    add_json, add_document = writer.add_json, writer.add_document
    for item in items:
        if type(item) is str:
            add_json(item)
        else:
            add_document(item)

_KEY_LENGTH = struct.Struct(">I")
id_term = methodcaller("decode", "latin-1")
"""The ``_id`` term of a key (keys are arbitrary bytes; latin-1 maps each byte to one char)."""

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_JSON_TYPES: dict[str, tuple[type, ...]] = {"text": (str,), "string": (str,), "int": (int,), "float": (float, int)}
"""The value types a schema field takes on the JSON path: exactly what ``add_json`` and
``from_dict`` both accept alike (``from_dict`` also takes a bool as a number, ``add_json``
refuses it; ``None`` counts as absent on the single path): anything else goes there."""
_ABSENT = {"text": "", "string": "", "int": 0, "float": 0.0}
"""What a field missing from a document reads as in the batch checks (a value that passes them)."""
_ABSENT_FIELD = object()
"""What a field missing from a document reads as in :meth:`DocumentBuilder.plain_doc`."""
_first, _second = itemgetter(0), itemgetter(1)
_PAIR_TYPES = {tuple, list}
_without_last = itemgetter(slice(None, -1))
_TANTIVY_JSON = b'%b,"_id":%b,"_doc":"%b"}'.__mod__
"""A document's JSON without its closing brace, its JSON ``_id`` term, its base64 ``_doc``."""
_TANTIVY_JSON_PLAIN_ID = b'%b,"_id":"%b","_doc":"%b"}'.__mod__
"""The same with the key itself between the quotes of ``_id``: for keys of plain bytes only."""
_PLAIN_ID_BYTES = bytes(b for b in range(0x20, 0x7F) if b not in b'"\\')
"""Bytes that stand for themselves inside a JSON string (as their latin-1 ``_id`` term)."""
_base64 = partial(b2a_base64, newline=False)


def pack(key: bytes, encoded: bytes) -> bytes:
    """The stored ``_doc`` value of document ``key`` (see the module docstring)."""
    return _KEY_LENGTH.pack(len(key)) + key + encoded


def pack_many(keys: Iterable[bytes], encoded: Iterable[bytes]) -> Iterator[bytes]:
    """:func:`pack` of each ``(key, encoded)``, lazily and in C-level passes (the bulk paths)."""
    return map(add, map(add, map(_KEY_LENGTH.pack, map(len, keys)), keys), encoded)


def unpack(stored: bytes) -> tuple[bytes, bytes]:
    """``(key, encoded document)`` of a stored ``_doc`` value."""
    n = int.from_bytes(stored[:4], "big") + 4
    return stored[4:n], stored[n:]


def decode_hits(searcher: tantivy.Searcher, hits: Iterable[tuple[float, Any]], decode_key: Callable[[bytes], Any],
                decode_doc: Callable[[bytes], Any], stored: Sequence[str] | None) -> list[tuple[Any, float, Any]]:
    """``(doc_id, score, doc)`` of each ``(score, address)`` hit; ``doc`` reduced to the
    ``stored`` fields (the whole document when None)."""
    out = []
    doc_at = searcher.doc
    from_bytes = int.from_bytes
    for score, address in hits:
        packed = doc_at(address).get_first(DOC_FIELD)
        n = from_bytes(packed[:4], "big") + 4  # unpack(), inlined: this loop is the hot path
        doc = decode_doc(packed[n:])
        if stored is not None:
            doc = {k: doc[k] for k in stored if k in doc}
        out.append((decode_key(packed[4:n]), score, doc))
    return out


def _codec(fmt: str) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    if fmt == "msgpack":
        packer = msgpack.Packer(use_bin_type=True)
        return packer.pack, lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False)
    return orjson.dumps, orjson.loads


class DocumentBuilder:
    """Keys, change-record values and tantivy documents for one store's schema."""

    def __init__(self, store: str, fields: Sequence[FieldSpec], schema: tantivy.Schema, key_serde: Serde,
                 document_format: str) -> None:
        self.store = store
        self.schema = schema
        self.schema_text = ", ".join(f.canonical() for f in fields)
        self.schema_names = frozenset(f.name for f in fields)
        self.document_format = document_format
        self._fields = tuple(fields)
        self._floats = [f.name for f in fields if f.type == "float"]
        self._plain_checks = tuple(
            (f.name, _JSON_TYPES[f.type], f.type in ("int", "float"), f.type == "float", f.type in ("text", "string"))
            for f in fields)
        """Per schema field, for :meth:`plain_doc`: name, the value types it takes, whether
        ints must be in i64 range, floats finite, and a list of str is allowed."""
        self._key_serde = key_serde
        self._encode_keys = encoder_of_many(key_serde)
        self.encode_doc, self.decode_doc = _codec(document_format)

    # -- ids ----------------------------------------------------------------------------------
    def key(self, doc_id: Any) -> bytes:
        """``doc_id`` encoded with the store's key serde; SerializationError names it."""
        serde = self._key_serde
        try:
            key = serde.encode(doc_id)
        except Exception as e:
            raise SerializationError(
                f"store {self.store!r}: document id {doc_id!r} ({type(doc_id).__name__}) cannot be encoded by "
                f"key serde {serde.name!r}: {e}. Set stores.{self.store}.key.serde (e.g. string)"
            ) from e
        if type(key) is not bytes:
            raise SerializationError(f"store {self.store!r}: key serde {serde.name!r} returned {type(key).__name__}")
        return key

    def keys(self, doc_ids: Sequence[Any]) -> list[bytes]:
        """:meth:`key` of each id, in one pass of the serde when every id is good."""
        try:
            keys = self._encode_keys(list(doc_ids))
        except Exception:
            keys = None
        if keys is None or set(map(type, keys)) - {bytes}:
            keys = list(map(self.key, doc_ids))  # raises for the first bad id
        return keys

    def split_pairs(self, pairs: list[Any]) -> tuple[list[Any], list[Any]]:
        """The ids and the documents of ``index_all``'s ``(doc_id, doc)`` pairs;
        InvalidValueError names the first item that is not a pair. Two itemgetter passes,
        not ``zip(*pairs)``: that made one iterator object per pair, and such
        garbage-collected allocations cost more than the pass (a full collection scans
        every object the task holds)."""
        if set(map(type, pairs)) <= _PAIR_TYPES and set(map(len, pairs)) == {2}:
            return list(map(_first, pairs)), list(map(_second, pairs))
        for item in pairs:
            if isinstance(item, (str, bytes, Mapping)) or not isinstance(item, Sequence) or len(item) != 2:
                raise InvalidValueError(
                    f"store {self.store!r}: index_all takes (doc_id, doc) pairs or a mapping, got the item {item!r:.80}")
        return list(map(_first, pairs)), list(map(_second, pairs))

    # -- documents ----------------------------------------------------------------------------
    def _as_dict(self, key: bytes, doc: Any) -> dict[str, Any]:
        if type(doc) is dict:
            return doc
        if doc is None:
            raise InvalidValueError(f"store {self.store!r}: index(doc_id, None) is not allowed; use delete(doc_id)")
        if not isinstance(doc, Mapping):
            raise InvalidValueError(
                f"store {self.store!r}: a document is a dict of fields, got {type(doc).__name__} for id {key!r}"
            )
        return dict(doc)

    def _encode(self, key: bytes, doc: dict[str, Any]) -> bytes:
        try:
            return self.encode_doc(doc)
        except (TypeError, ValueError, OverflowError) as e:
            raise SerializationError(
                f"store {self.store!r}: document {key!r} cannot be encoded as {self.document_format}: {e}"
            ) from e

    def documents(self, keys: Sequence[bytes], docs: Sequence[Any]) -> tuple[list[bytes], list[TantivyInput]]:
        """Each ``(key, doc)`` encoded for the changelog and validated, in bulk: encoded
        values and what to add to the tantivy writer (:meth:`json_docs` when it can, else
        tantivy documents)."""
        if set(map(type, docs)) - {dict}:
            docs = list(map(self._as_dict, keys, docs))  # raises for the first non-document
        try:
            encoded = list(map(self.encode_doc, docs))
        except (TypeError, ValueError, OverflowError):
            encoded = list(map(self._encode, keys, docs))  # raises naming the first bad document
        json_docs = self.json_docs(keys, docs, encoded)
        if json_docs is not None:
            return encoded, json_docs  # type: ignore[return-value]
        return encoded, self.tantivy_docs(keys, docs, encoded)  # type: ignore[return-value]

    def json_docs(self, keys: Sequence[bytes], docs: Sequence[dict[str, Any]],
                  encoded: Sequence[bytes]) -> list[str] | None:
        """The tantivy JSON of each document, for ``IndexWriter.add_json``: the document's
        own JSON (its change-record value) with ``_id`` and ``_doc`` (base64, as tantivy
        reads bytes fields) appended, so they win over a document field of the same name as
        in :meth:`tantivy_doc`. ``None`` when the batch is not JSON or holds a value that
        only the single path takes or names (see ``_JSON_TYPES``): tantivy parses the text
        while adding, so a batch must be known good before its first document is added."""
        if self.document_format != "json" or not self._plain_values(docs) or b"{}" in encoded:
            return None  # (an empty document has no field to append after)
        return self.json_texts(keys, encoded)

    def json_texts(self, keys: Sequence[bytes], encoded: Sequence[bytes]) -> list[str]:
        """The tantivy JSON text of each JSON change-record value, made from the encoded
        bytes alone: only for documents found plain (:meth:`json_docs`, :meth:`plain_doc`)."""
        packed = map(_base64, pack_many(keys, encoded))
        if b"".join(keys).translate(None, _PLAIN_ID_BYTES):  # a key needs JSON escapes in its _id
            parts = zip(map(_without_last, encoded), map(orjson.dumps, map(id_term, keys)), packed)
            return list(map(bytes.decode, map(_TANTIVY_JSON, parts)))
        # every key is printable ASCII without '"' or '\\' (e.g. any string id of that kind):
        # it goes between the quotes as it is, without a str and an orjson call per document
        # (a fifth of this method's time)
        return list(map(bytes.decode, map(_TANTIVY_JSON_PLAIN_ID, zip(map(_without_last, encoded), keys, packed))))

    def _plain_values(self, docs: Sequence[dict[str, Any]]) -> bool:
        """Whether every schema field of every document is absent or a value of its
        ``_JSON_TYPES`` (a list of them for text and string fields), in range and finite:
        one C-level pass per schema field over the batch."""
        for f in self._fields:
            allowed = _JSON_TYPES[f.type]
            # dict.get over repeat(): a third of the time of a methodcaller("get", ...) pass
            values = list(map(dict.get, docs, repeat(f.name), repeat(_ABSENT[f.type])))
            types = set(map(type, values))
            if list in types and f.type in ("text", "string"):
                types.discard(list)
                types.update(map(type, chain.from_iterable(v for v in values if type(v) is list)))
            if not types.issubset(allowed):
                return False
            if f.type == "int":
                ints = values
            elif f.type == "float":
                if float in types and not all(map(math.isfinite, values)):
                    return False
                ints = [v for v in values if type(v) is int] if int in types else []
            else:
                continue
            if ints and not _I64_MIN <= min(ints) <= max(ints) <= _I64_MAX:
                return False
        return True

    def plain_doc(self, doc: dict[str, Any]) -> bool:
        """:meth:`_plain_values` of one document, without a pass per field (the single
        ``index()`` path): whether its JSON text can go to tantivy as it is."""
        for name, allowed, ranged, finite, lists in self._plain_checks:
            v = doc.get(name, _ABSENT_FIELD)
            t = type(v)
            if t in allowed:
                if t is int and ranged and not _I64_MIN <= v <= _I64_MAX:
                    return False
                if t is float and finite and not math.isfinite(v):
                    return False
            elif v is _ABSENT_FIELD:
                continue
            elif not (lists and t is list and all(type(x) is str for x in v)):
                return False
        return True

    def document_or_json(self, key: bytes, doc: Any) -> tuple[bytes, tantivy.Document | None]:
        """``doc`` encoded for the changelog and validated, and its tantivy document; or
        ``None`` instead of the document for a plain document of the JSON format (see
        :meth:`plain_doc`), whose tantivy input is made later, in bulk, from the encoded
        bytes by :meth:`json_texts` (no ``Document`` per call; the caller's dict is not
        read again, so changing it after the call changes nothing)."""
        doc = self._as_dict(key, doc)
        encoded = self._encode(key, doc)
        if self.document_format == "json" and encoded != b"{}" and self.plain_doc(doc):
            return encoded, None
        return encoded, self.tantivy_doc(key, doc, encoded)

    def tantivy_doc(self, key: bytes, doc: dict[str, Any], encoded: bytes) -> tantivy.Document:
        """The tantivy document of ``doc`` (schema fields, id and stored encoding)."""
        for f in self._floats:
            v = doc.get(f)
            if type(v) is float and not math.isfinite(v):
                raise InvalidValueError(
                    f"store {self.store!r}: document {key!r} field {f!r} = {v!r}: NaN/inf cannot be indexed")
        fields = {**doc, ID_FIELD: key.decode("latin-1"), DOC_FIELD: pack(key, encoded)}
        try:
            return tantivy.Document.from_dict(fields, self.schema)
        except ValueError as e:
            if not any(k in self.schema_names and v is None for k, v in doc.items()):
                raise InvalidValueError(
                    f"store {self.store!r}: document {key!r} does not fit schema stores.{self.store}.search.fields "
                    f"= {self.schema_text!r}: {e}"
                ) from e
            # a None schema field counts as absent
            return self.tantivy_doc(key, {k: v for k, v in doc.items() if v is not None}, encoded)

    def tantivy_docs(self, keys: Sequence[bytes], docs: Sequence[dict[str, Any]],
                     encoded: Sequence[bytes]) -> list[tantivy.Document]:
        """:meth:`tantivy_doc` of each document, in bulk (one at a time if any fails)."""
        if not self._floats:
            from_dict, schema = tantivy.Document.from_dict, self.schema
            packed = pack_many(keys, encoded)
            try:
                return [
                    from_dict({**doc, ID_FIELD: doc_id, DOC_FIELD: stored}, schema)
                    for doc, doc_id, stored in zip(docs, map(id_term, keys), packed)
                ]
            except ValueError:
                pass  # a bad or None field somewhere: the single path finds it
        return list(map(self.tantivy_doc, keys, docs, encoded))

    def fitting_doc(self, key: bytes, doc: dict[str, Any], encoded: bytes) -> tantivy.Document:
        """The tantivy document of ``doc`` without the schema fields whose values do not fit
        (a document logged under an older schema)."""
        fitting = {}
        for name, value in doc.items():
            if name in self.schema_names:
                try:
                    self.tantivy_doc(key, {name: value}, encoded)
                except InvalidValueError:
                    continue
            fitting[name] = value
        return self.tantivy_doc(key, fitting, encoded)

    # -- change records -------------------------------------------------------------------------
    def add_restored(self, writer: tantivy.IndexWriter, records: Iterable[tuple[bytes, bytes]]) -> int:
        """Add the tantivy document of each restored ``(key, encoded document)`` to ``writer``
        at once (interleaving lets tantivy's threads index while the next is built: building
        a batch first measured slower). A JSON object goes as JSON text made from the record
        itself, without decoding it in Python (see :meth:`json_docs`; a record that is not
        a whole JSON object cannot parse once ``_id`` and ``_doc`` are appended after its
        last byte, so it takes the single path). Returns how many had fields that no longer
        fit the schema (indexed without them: logged under an older schema).
        CorruptionError names the first record that is not a document."""
        from_dict, schema, decode = tantivy.Document.from_dict, self.schema, self.decode_doc
        add, add_json = writer.add_document, writer.add_json
        misfits = 0
        as_json = self.document_format == "json"
        fast = not self._floats  # (msgpack) float fields need the NaN check of the single path
        for key, value in records:
            if as_json:
                if value[:1] == b"{" and value[-1:] == b"}":
                    try:
                        if key.translate(None, _PLAIN_ID_BYTES):  # (see json_docs)
                            text = _TANTIVY_JSON((value[:-1], orjson.dumps(id_term(key)), _base64(pack(key, value))))
                        else:
                            text = _TANTIVY_JSON_PLAIN_ID((value[:-1], key, _base64(pack(key, value))))
                        add_json(text.decode())
                        continue
                    except ValueError:
                        pass  # (a wrong type, a None field, not JSON) the single path names or repairs it
            elif fast:
                try:
                    add(from_dict({**decode(value), ID_FIELD: id_term(key), DOC_FIELD: pack(key, value)},
                                  schema))
                    continue
                except Exception:
                    pass  # the single path below names or repairs it
            [doc] = self.decoded([key], [value])
            try:
                tdoc = self.tantivy_doc(key, doc, value)
            except InvalidValueError:
                tdoc = self.fitting_doc(key, doc, value)
                misfits += 1
            add(tdoc)
        return misfits

    def decoded(self, keys: Sequence[bytes], values: Sequence[bytes]) -> list[dict[str, Any]]:
        """The documents of change-record values; CorruptionError names the first bad one."""
        decode = self.decode_doc
        try:
            docs = list(map(decode, values))
            if not set(map(type, docs)) - {dict}:
                return docs
        except Exception:
            pass  # found and named below
        fmt = self.document_format
        out = []
        for key, value in zip(keys, values):
            try:
                doc = decode(value)
            except Exception as e:
                raise CorruptionError(f"store {self.store!r}: change record {key!r} is not a {fmt} document: {e}") from e
            if type(doc) is not dict:
                raise CorruptionError(
                    f"store {self.store!r}: change record {key!r} is a {fmt} {type(doc).__name__}, not a document")
            out.append(doc)
        return out
