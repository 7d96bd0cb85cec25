"""The schema of a ``search`` store: field specs (``name:type[:flag...]``), their
parsing and validation, the tantivy schema built from them, and the engine's options
(:class:`SearchOptions`, ``stores.<s>.search.*``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import tantivy
from localstate.errors import (
    ConfigError,
    InvalidValueError,
)

__all__ = ["FieldSpec", "SearchOptions", "parse_fields", "build_schema", "parse_query", "InvalidQueryError", "ID_FIELD",
           "DOC_FIELD", "MIN_HEAP_PER_THREAD"]

ID_FIELD = "_id"
DOC_FIELD = "_doc"
_FIELD_TYPES = ("text", "string", "int", "float")
_TOKENIZERS = ("default", "raw", "en_stem", "whitespace")
MIN_HEAP_PER_THREAD = 15_000_000
"""tantivy refuses a writer heap below this per thread."""
_FIELD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


# -- schema ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldSpec:
    """One schema field: ``name:type[:flag...]``.

    ``type`` is ``text`` (tokenized full text), ``string`` (one exact term: ids, cities,
    tags), ``int`` (i64) or ``float`` (f64). Flags: ``stored`` (returned in search hits),
    ``unindexed`` (int/float only: stored, not searchable), ``fast`` (int/float column for
    range queries and sorting), ``tokenizer=<default|raw|en_stem|whitespace>`` (text only).
    """

    name: str
    type: Literal["text", "string", "int", "float"]
    stored: bool = False
    indexed: bool = True
    fast: bool = False
    tokenizer: str = "default"

    def canonical(self) -> str:
        flags = [self.type]
        if self.stored:
            flags.append("stored")
        if not self.indexed:
            flags.append("unindexed")
        if self.fast:
            flags.append("fast")
        if self.type == "text" and self.tokenizer != "default":
            flags.append(f"tokenizer={self.tokenizer}")
        return ":".join([self.name, *flags])


def parse_fields(spec: str, key: str = "fields") -> tuple[FieldSpec, ...]:
    """Parse ``"name:text:stored, bio:text, city:string:stored"``; errors name ``key``.

    >>> [f.canonical() for f in parse_fields("title:text:stored, year:int:fast")]
    ['title:text:stored', 'year:int:fast']
    """
    fields: list[FieldSpec] = []
    seen: set[str] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, rest = part.partition(":")
        name = name.strip()
        bits = [b.strip().lower() for b in rest.split(":")] if rest else []
        where = f"{key} = {spec!r}: field {part!r}"
        if not _FIELD_NAME.match(name):
            raise ConfigError(
                f"{where}: field names start with a letter and use letters, digits and '_' "
                "(names starting with '_' are reserved)"
            )
        if name in seen:
            raise ConfigError(f"{where}: field {name!r} is declared twice")
        seen.add(name)
        if not bits or bits[0] not in _FIELD_TYPES:
            raise ConfigError(
                f"{where}: expected name:type[:flags] with type one of {', '.join(_FIELD_TYPES)}, "
                f"e.g. '{name}:text:stored'"
            )
        ftype, stored, indexed, fast, tokenizer = bits[0], False, True, False, "default"
        for flag in bits[1:]:
            if flag == "stored":
                stored = True
            elif flag == "indexed":
                indexed = True
            elif flag == "unindexed" and ftype in ("int", "float"):
                indexed = False
            elif flag == "fast" and ftype in ("int", "float"):
                fast = True
            elif flag.startswith("tokenizer=") and ftype == "text":
                tokenizer = flag.partition("=")[2]
                if tokenizer not in _TOKENIZERS:
                    raise ConfigError(f"{where}: unknown tokenizer {tokenizer!r}; use one of {', '.join(_TOKENIZERS)}")
            else:
                allowed = "stored, tokenizer=NAME" if ftype == "text" else (
                    "stored" if ftype == "string" else "stored, unindexed, fast")
                raise ConfigError(f"{where}: unknown flag {flag!r} for a {ftype} field (allowed: {allowed})")
        fields.append(FieldSpec(name, ftype, stored, indexed, fast, tokenizer))  # type: ignore[arg-type]
    if not fields:
        raise ConfigError(
            f"{key} is empty: declare the indexed fields, e.g. "
            "'name:text:stored, bio:text, city:string:stored'"
        )
    return tuple(fields)


def build_schema(fields: Sequence[FieldSpec]) -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field(ID_FIELD, tokenizer_name="raw", index_option="basic")
    sb.add_bytes_field(DOC_FIELD, stored=True)
    for f in fields:
        if f.type == "text":
            sb.add_text_field(f.name, tokenizer_name=f.tokenizer)
        elif f.type == "string":
            sb.add_text_field(f.name, tokenizer_name="raw")
        elif f.type == "int":
            sb.add_integer_field(f.name, indexed=f.indexed, fast=f.fast)
        else:
            sb.add_float_field(f.name, indexed=f.indexed, fast=f.fast)
    return sb.build()


# -- options ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchOptions:
    """``stores.<s>.search.*`` options.

    * ``fields`` — the schema, e.g. ``"name:text:stored, bio:text, city:string:stored"``
      (see :class:`FieldSpec`). Required. Changing it re-indexes from the changelog.
    * ``default.fields`` — fields searched by query terms without ``field:``
      (default: every text and string field).
    * ``heap.size.bytes`` — tantivy writer heap (default 64 MB; ≥ 15 MB).
    * ``restore.heap.size.bytes`` — writer heap of a bulk restore (default 256 MB).
    * ``writer.threads`` — indexing threads (default 2; 0 = one per core up to 8). Each
      thread needs 15 MB of the heap: a smaller heap uses fewer threads.
    * ``write.buffer.docs`` — documents batched in Python before they go to the
      writer, with one batched delete of their ids (default 4096).
    * ``document.format`` — encoding of the stored document in change records
      (``json`` default, or ``msgpack``).
    """

    fields: str = ""
    default_fields: str = ""
    heap_size_bytes: int = 64_000_000
    restore_heap_size_bytes: int = 256_000_000
    writer_threads: int = 2
    write_buffer_docs: int = 4096
    document_format: Literal["json", "msgpack"] = "json"

    def validate(self, prefix: str) -> None:
        fields = parse_fields(self.fields, f"{prefix}.fields")
        names = {f.name: f for f in fields}
        for name in filter(None, (n.strip() for n in self.default_fields.split(","))):
            f = names.get(name)
            if f is None:
                raise ConfigError(
                    f"{prefix}.default.fields = {self.default_fields!r}: {name!r} is not a field of "
                    f"{prefix}.fields (fields: {', '.join(names)})"
                )
            if not f.indexed:
                raise ConfigError(f"{prefix}.default.fields: field {name!r} is unindexed and cannot be searched")
        for key, heap in (("heap.size.bytes", self.heap_size_bytes), ("restore.heap.size.bytes", self.restore_heap_size_bytes)):
            if heap < MIN_HEAP_PER_THREAD:
                raise ConfigError(
                    f"{prefix}.{key} = {heap}: tantivy needs at least {MIN_HEAP_PER_THREAD} bytes "
                    "(per writer thread)"
                )
        if self.writer_threads < 0:
            raise ConfigError(f"{prefix}.writer.threads = {self.writer_threads}: must be >= 0")
        if self.write_buffer_docs <= 0:
            raise ConfigError(f"{prefix}.write.buffer.docs = {self.write_buffer_docs}: must be > 0")

    def schema_fields(self) -> tuple[FieldSpec, ...]:
        return parse_fields(self.fields)

    def search_fields(self) -> list[str]:
        names = [n.strip() for n in self.default_fields.split(",") if n.strip()]
        return names or [f.name for f in self.schema_fields() if f.type in ("text", "string")]


class InvalidQueryError(InvalidValueError):
    """A search query tantivy cannot parse; the message shows the query and the cause."""


def parse_query(index: tantivy.Index, query: str, fields: list[str], store: str,
                field_names: Iterable[str]) -> tantivy.Query:
    """``query`` (tantivy query language) parsed over the default ``fields`` of store
    ``store``; :class:`InvalidQueryError` naming the query, the syntax and ``field_names``."""
    if not isinstance(query, str):
        raise InvalidQueryError(f"store {store!r}: a query is a str or tantivy.Query, got {type(query).__name__}")
    try:
        return index.parse_query(query, fields)
    except ValueError as e:
        raise InvalidQueryError(
            f"store {store!r}: invalid search query {query!r}: {e}. Query syntax: "
            f"terms, field:term, \"phrases\", AND/OR/NOT, +/-, field:[a TO b]; fields: "
            f"{', '.join(sorted(field_names))}"
        ) from e
