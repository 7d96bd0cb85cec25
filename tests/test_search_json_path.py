"""The ``search`` engine's JSON path: a big ``index_all`` batch of plain documents goes to
tantivy as JSON text built from the change records (``DocumentBuilder.json_docs``); every
other batch takes the ``Document.from_dict`` path. Both must index the same documents the
same way, and a batch the JSON path cannot take exactly must fall back, not fail or differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import tantivy
from localstate import Config, CorruptionError, InvalidValueError, SerializationError, TaskStorage
from localstate.engine import StoreContext
from localstate.engines.search import SearchEngine, SearchOptions

FIELDS = "name:text:stored, tags:text, city:string:stored, age:int:fast, score:float"

TRICKY: dict[Any, dict[str, Any]] = {
    "plain": {"name": "Ada Lovelace", "city": "London", "age": 36, "score": 1.5},
    "own _id and _doc fields": {"name": "shadow", "_id": "plain", "_doc": "not the document"},
    'quote " and \\ backslash': {"name": "escaped id"},
    "ünïcödé ß 🙂": {"name": "non ascii id", "city": "Zürich"},
    "int in a float field": {"name": "whole", "score": 3},
    "list of strings": {"name": "tagged", "tags": ["red", "green"]},
    "empty list": {"name": "untagged", "tags": []},
    "extra fields": {"name": "extras", "nested": {"a": [1, {"b": None}]}, "when": "2020-01-01T00:00:00Z"},
    "smallest i64": {"name": "low", "age": -(2**63)},
    "largest i64": {"name": "high", "age": 2**63 - 1},
    "no schema field": {"other": 1},
}
"""Documents that take the JSON path (plain values), with ids JSON must escape."""

FALLBACK: dict[Any, dict[str, Any]] = {
    "bool in an int field": {"name": "flag", "age": True},
    "bool in a float field": {"name": "flag", "score": False},
    "None field": {"name": "nothing", "city": None},
    "empty document": {},
}
"""Documents only the ``from_dict`` path takes (or repairs): a batch holding one of them
falls back as a whole, with the same result as indexing each alone."""

QUERIES = ["ada", "shadow", "escaped", "city:Zürich", "whole", "tags:red", "extras", "age:[-9223372036854775808 TO -1]",
           "age:[9223372036854775806 TO 9223372036854775807]", "score:[2.5 TO 3.5]", "flag", "nothing"]


def _engine(path: Path, **opts: Any) -> SearchEngine:
    options = SearchOptions(fields=FIELDS, default_fields="name", **opts)
    return SearchEngine(StoreContext.local(path, "profiles", key_serde="string"), options)


def _view(e: SearchEngine) -> tuple[dict[Any, Any], dict[str, list[Any]]]:
    hits = {}
    for q in QUERIES:
        try:
            hits[q] = sorted((doc_id, doc) for doc_id, _, doc in e.search(q, 100))
        except InvalidValueError as err:
            hits[q] = [str(err)]
    return e.documents(), hits


@pytest.mark.parametrize("docs", [TRICKY, {**TRICKY, **FALLBACK}], ids=["json path", "fallback"])
def test_a_bulk_batch_indexes_like_one_document_at_a_time(tmp_path, docs):
    json_path_taken = docs is TRICKY
    with _engine(tmp_path / "bulk", write_buffer_docs=2) as bulk, _engine(tmp_path / "single") as single:
        built = bulk._docs.json_docs(bulk._docs.keys(list(docs)), list(docs.values()),
                                     list(map(bulk._docs.encode_doc, docs.values())))
        assert (built is not None) == json_path_taken
        bulk.index_all(docs)
        for doc_id, doc in docs.items():
            single.index(doc_id, doc)
        bulk._check()
        single._check()
        assert _view(bulk) == _view(single)
        assert bulk.documents() == docs
        assert [h[0] for h in bulk.search("shadow")] == ["own _id and _doc fields"]
        assert bulk.get("plain") == TRICKY["plain"]  # not shadowed by the other's own "_id" field


PLAIN_IDS = ["user-1", " ~!#$%&'()*+,-./09:;<=>?@AZ[]^_`az{|}", "x"]
"""Ids of printable ASCII without '"' or '\\': their bytes go between the quotes of ``_id`` as they are."""
ESCAPED_IDS = ["tab\there", "new\nline", "del\x7f", "nul\x00", 'q"uote', "back\\slash", "é"]
"""Ids whose JSON string needs escapes (or is not ASCII): one of them sends the batch to orjson."""


@pytest.mark.parametrize("ids", [PLAIN_IDS, PLAIN_IDS + ESCAPED_IDS[:1], ESCAPED_IDS + PLAIN_IDS],
                         ids=["plain ids", "one escaped id", "mixed"])
def test_the_id_of_the_json_text_is_the_id_term_of_the_key(tmp_path, ids):
    """The JSON text of a batch of plain ids (key bytes copied) is the same text as the one
    built with orjson per id; any other batch is built with orjson. Either way the ``_id``
    term is exact: a rewrite replaces (the delete finds it), a delete removes, get finds."""
    from localstate.engines.search_documents import _TANTIVY_JSON, _base64, pack

    with _engine(tmp_path, write_buffer_docs=2) as e:
        docs = {doc_id: {"name": f"first {n}", "age": n} for n, doc_id in enumerate(ids)}
        keys = e._docs.keys(list(docs))
        encoded = list(map(e._docs.encode_doc, docs.values()))
        built = e._docs.json_docs(keys, list(docs.values()), encoded)
        by_orjson = [_TANTIVY_JSON((v[:-1], orjson.dumps(k.decode("latin-1")), _base64(pack(k, v)))).decode()
                     for k, v in zip(keys, encoded)]
        assert built == by_orjson
        assert [orjson.loads(text)["_id"] for text in built] == [k.decode("latin-1") for k in keys]  # the term
        e.index_all(docs)
        e.flush()
        e.index_all({doc_id: {"name": "second"} for doc_id in ids})  # deletes by _id term, then adds
        assert len(e) == len(ids) and e.count("second") == len(ids) and e.count("first") == 0
        assert e.documents() == {doc_id: {"name": "second"} for doc_id in ids}
        e.delete_all(ids[1:])
        assert [h[0] for h in e.search("second")] == ids[:1] and e.get(ids[-1]) is None
        e._check()


def test_the_json_path_survives_a_commit_and_a_restore(tmp_path):
    config = Config.from_dict({
        "job.name": "prof", "job.state.dir": str(tmp_path / "state"), "systems.file.path": str(tmp_path / "log"),
        "stores.profiles.factory": "search", "stores.profiles.key.serde": "string",
        "stores.profiles.search.fields": FIELDS, "stores.profiles.search.default.fields": "name",
        "stores.profiles.search.write.buffer.docs": 2,
    })
    with TaskStorage(config) as s:
        s.store("profiles").index_all(TRICKY)
        s.commit(1)
        before = s.store("profiles").documents()
    assert before == TRICKY
    for d in (tmp_path / "state").rglob("index"):
        for f in d.iterdir():
            f.unlink()  # the local index is gone: rebuilt from the change records
    with TaskStorage(config) as s:
        p = s.store("profiles")
        assert p.documents() == TRICKY
        assert [h[0] for h in p.search("city:Zürich")] == ["ünïcödé ß 🙂"]
        p.index_all({k: {**v, "name": "renamed"} for k, v in TRICKY.items()})  # replaces, never duplicates
        assert len(p) == len(TRICKY) and p.count("renamed") == len(TRICKY)
        s.engine("profiles")._check()


@pytest.mark.parametrize("bad, error, message", [
    ({"name": "big", "age": 2**63}, InvalidValueError, "'b5'"),
    ({"name": "nan", "score": float("nan")}, InvalidValueError, "'b5'.*NaN"),
    ({"name": 5}, InvalidValueError, "'b5'"),
    ({"name": ["ok", 5]}, InvalidValueError, "'b5'"),
    ({"name": [["nested"]]}, InvalidValueError, "'b5'"),
    ({"name": "holes", "tags": ["a", None]}, InvalidValueError, "'b5'"),
    ({"name": "x", "blob": b"\xff"}, SerializationError, "b5"),
])
def test_a_bad_value_in_a_bulk_batch_changes_nothing(tmp_path, bad, error, message):
    """The JSON path checks a whole batch before its first document reaches tantivy (which
    parses while adding): a bad value anywhere leaves nothing indexed and nothing logged."""
    config = Config.from_dict({
        "job.name": "prof", "job.state.dir": str(tmp_path / "state"), "systems.file.path": str(tmp_path / "log"),
        "stores.profiles.factory": "search", "stores.profiles.key.serde": "string",
        "stores.profiles.search.fields": FIELDS, "stores.profiles.search.write.buffer.docs": 2,
    })
    with TaskStorage(config) as s:
        p = s.store("profiles")
        good = [(f"g{i}", {"name": f"good {i}", "age": i}) for i in range(8)]
        with pytest.raises(error, match=message):
            p.index_all(good[:5] + [("b5", bad)] + good[5:])
        assert s.engine("profiles")._logger.pending() == 0 and len(p) == 0
        p.index_all(good)
        assert len(p) == 8
        s.engine("profiles")._check()


def test_restore_indexes_like_one_document_at_a_time(tmp_path):
    """Restore hands each JSON change record to tantivy as text made from the record; the
    records the JSON text cannot take (a bool or None field, a field that no longer fits,
    an empty document, whitespace after the object) take the single path, same result."""
    docs = {**TRICKY, **FALLBACK, "old float in the int field": {"name": "misfit", "age": 2.5}}
    records = [(k.encode(), orjson.dumps(v)) for k, v in docs.items()]
    records.append((b"spaced", b'{"name": "spaced out"} '))
    with _engine(tmp_path / "restored") as restored, _engine(tmp_path / "single") as single:
        restored.restore(records, into_empty=True)
        for doc_id, doc in docs.items():
            single.index(doc_id, {k: v for k, v in doc.items() if k != "age" or type(v) is not float})
        single.index("spaced", {"name": "spaced out"})
        restored._check()
        hits = _view(restored)[1]
        assert hits == _view(single)[1]
        assert restored.documents() == {**docs, "spaced": {"name": "spaced out"}}


@pytest.mark.parametrize("value, message", [
    (b'{"name": "x",}', "not a json document"),
    (b'{"name": "\xff"}', "not a json document"),
    (b'{"name": "x"', "not a json document"),
    (b'{"name": "x}', "not a json document"),
    (b'[{"name": "x"}]', "json list, not a document"),
])
def test_restoring_a_damaged_json_record_names_it(tmp_path, value, message):
    with _engine(tmp_path) as e:
        good = [(b"u%d" % i, b'{"name": "ok"}') for i in range(5)]
        with pytest.raises(CorruptionError, match=f"change record b'bad'.*{message}"):
            e.restore(good + [(b"bad", value)] + good, into_empty=True)


BAD_VALUES = [{"name": "big", "age": 2**63}, {"name": "small", "age": -(2**63) - 1}, {"score": float("nan")},
              {"score": float("-inf")}, {"score": 2**64}, {"name": 5}, {"name": ["ok", 5]}, {"name": [["nested"]]},
              {"tags": ["a", None]}, {"age": 1.5}, {"age": "1"}, {"age": [1]}, {"city": b"bytes"}, {"name": ("a", "b")}]


@pytest.mark.parametrize("doc", [*TRICKY.values(), *FALLBACK.values(), *BAD_VALUES], ids=repr)
def test_the_single_plain_check_agrees_with_the_batch_check(tmp_path, doc):
    """``index()`` decides per document what ``index_all`` decides per batch: a document the
    one-document check calls plain is exactly one the batch check would send as JSON."""
    with _engine(tmp_path) as e:
        assert e._docs.plain_doc(doc) == e._docs._plain_values([doc])


def test_index_makes_the_json_text_at_send_from_the_change_record(tmp_path):
    """A plain document given to index() is kept as its change record only: its JSON text
    is made in bulk when the buffer is sent. Changing the caller's dict afterwards changes
    nothing, a bad document still raises at the call, and a read sees every write."""
    with _engine(tmp_path, write_buffer_docs=3) as e:
        doc = {"name": "before", "age": 1}
        e.index("a", doc)
        assert e._buffer[b"a"] == (b'{"name":"before","age":1}', None)
        doc["name"], doc["age"] = "after", "not an int"  # the caller reuses its dict
        e.index("b", {"name": "flag", "age": True})  # not plain: a Document now, as before
        assert isinstance(e._buffer[b"b"][1], tantivy.Document)
        with pytest.raises(InvalidValueError, match="'c'"):
            e.index("c", {"name": "bad", "age": "old"})
        assert b"c" not in e._buffer
        e.index("d", {"name": "plain too", "tags": ["x"]})  # the third write: the buffer is sent
        assert not e._buffer
        assert e.get("a") == {"name": "before", "age": 1}
        assert sorted(h[0] for h in e.search("before OR flag OR plain")) == ["a", "b", "d"]
        assert e.count("age:[1 TO 1]") == 2  # a's 1, and b's True indexed as 1 (the from_dict path)
        e._check()


def test_every_write_path_writes_the_same_on_disk_format(tmp_path):
    """The on-disk format is the one earlier versions wrote and read (so their indexes are
    reused as they are, not rebuilt): per document one stored field, ``_doc`` = 4-byte
    big-endian key length + key + the change-record value, and the raw ``_id`` term = the
    key as latin-1. Checked with raw tantivy for a bulk batch (JSON text), index() calls
    (deferred JSON text and a from_dict fallback) and a restore."""
    import struct

    docs = {"bulk-1": {"name": "one", "age": 1}, "bulk-2": {"name": "two", "tags": ["a"]}, 'q"uote': {"name": "q"}}
    singles = {"single-plain": {"name": "three", "score": 2}, "single-flag": {"name": "four", "age": True}}
    restored = {"restored": {"name": "five", "city": "Zürich"}}
    with _engine(tmp_path, write_buffer_docs=2) as e:
        e.index_all(docs)
        for doc_id, doc in singles.items():
            e.index(doc_id, doc)
        e.restore([(b"restored", orjson.dumps(restored["restored"]))])
        e.flush()
        records = {k.encode(): orjson.dumps(v) for k, v in {**docs, **singles, **restored}.items()}
    index = tantivy.Index.open(str(tmp_path / "index"))
    index.reload()
    searcher = index.searcher()
    assert searcher.num_docs == len(records)
    stored = {}
    for _, address in searcher.search(tantivy.Query.all_query(), 100).hits:
        fields = searcher.doc(address).to_dict()
        assert list(fields) == ["_doc"] and len(fields["_doc"]) == 1
        packed = fields["_doc"][0]
        (n,) = struct.unpack(">I", packed[:4])
        stored[packed[4 : 4 + n]] = packed[4 + n :]
    assert stored == records
    for key in records:
        term = tantivy.Query.term_query(index.schema, "_id", key.decode("latin-1"))
        assert searcher.search(term, 2).count == 1
