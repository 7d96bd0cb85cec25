"""What the JSON readers (``localstate-jsonl``, ``localstate-kafka`` with ``format=json``) do
with a malformed record: Spark's ``mode`` option, with Spark's names.

* ``FAILFAST`` (our default): stop at the first bad record with a short error naming
  where it is (``file:line`` or ``topic/partition@offset``), the reason and the record.
  localstate's default, where Spark's is ``PERMISSIVE``: a job that turns bad input into
  null rows without being asked would build a silently wrong state.
* ``PERMISSIVE``: a bad record becomes a row whose columns are null, except the
  corrupt-record column (``columnNameOfCorruptRecord``, default ``_corrupt_record``),
  which holds the record's text — when the schema has such a string column (as in Spark).
* ``DROPMALFORMED``: bad records are skipped.

A record is bad when it is not a JSON object or a field does not convert to its column's
type. Chunks without a bad record are parsed in one vectorised pass (pyarrow); only a
chunk that fails is looked at record by record.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
from localstate.errors import ConfigError, InvalidValueError
from pyarrow import json as pajson

__all__ = ["JsonPolicy", "MalformedRecordError", "read_json_records"]

Mode = Literal["PERMISSIVE", "DROPMALFORMED", "FAILFAST"]
_MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
_SHOWN = 200


class MalformedRecordError(InvalidValueError):
    """A malformed JSON record under ``mode=FAILFAST``; the message names where it is."""


@dataclass(frozen=True)
class JsonPolicy:
    mode: Mode = "FAILFAST"
    corrupt_column: str = "_corrupt_record"

    @classmethod
    def from_options(cls, options: Mapping[str, str], source: str) -> JsonPolicy:
        mode = str(options.get("mode", "FAILFAST")).strip().upper()
        if mode not in _MODES:
            raise ConfigError(
                f"data source {source!r}: option mode = {options.get('mode')!r}; use one of {', '.join(_MODES)}"
            )
        return cls(mode, str(options.get("columnNameOfCorruptRecord", "_corrupt_record")))  # type: ignore[arg-type]


def _parse(data: bytes, schema: pa.Schema) -> pa.Table:
    return pajson.read_json(
        io.BytesIO(data),
        read_options=pajson.ReadOptions(block_size=8 << 20),
        parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False
        ),
    )


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"\.? in row \d+$", "", text.replace("JSON parse error: ", ""))


def read_json_records(
    records: Sequence[bytes] | bytes,
    schema: pa.Schema,
    policy: JsonPolicy,
    locate: Callable[[int], str],
    source: str,
) -> pa.Table:
    """Parse JSON records (a list, or newline-separated bytes) into a table of ``schema``
    under ``policy``. ``locate(i)`` names record ``i`` in errors (``"a.jsonl:12"``)."""
    corrupt = policy.mode == "PERMISSIVE" and policy.corrupt_column in schema.names
    parse_schema = schema.remove(schema.get_field_index(policy.corrupt_column)) if corrupt else schema
    blob = records if isinstance(records, bytes) else b"\n".join(records)
    try:
        table = _parse(blob, parse_schema)
        if isinstance(records, bytes) or table.num_rows == len(records):
            return _with_corrupt(table, schema, policy, [None] * table.num_rows) if corrupt else table
    except pa.ArrowInvalid:
        pass
    lines = records.split(b"\n") if isinstance(records, bytes) else list(records)
    numbered = [(i, line) for i, line in enumerate(lines) if not isinstance(records, bytes) or line.strip()]
    pieces: list[pa.Table] = []
    texts: list[str | None] = []

    failed: list[MalformedRecordError] = []

    def bad(i: int, line: bytes, error: Exception) -> None:
        if policy.mode == "FAILFAST":
            shown = line[:_SHOWN].decode("utf-8", "replace") + ("..." if len(line) > _SHOWN else "")
            failed.append(MalformedRecordError(
                f"{source}: malformed record at {locate(i)}: {_reason(error)}: {shown!r} "
                "(mode=FAILFAST; .option('mode', 'DROPMALFORMED') skips bad records, 'PERMISSIVE' "
                f"keeps them as null rows with the text in a '{policy.corrupt_column}' string column)"
            ))
        elif policy.mode == "PERMISSIVE":
            pieces.append(pa.Table.from_pylist([{}], schema=parse_schema))
            texts.append(line.decode("utf-8", "replace"))

    def split(part: list[tuple[int, bytes]]) -> None:
        # Halve a failing run of records until the bad ones stand alone: O(bad * log n)
        # vectorised parses instead of one per record.
        try:
            table = _parse(b"\n".join(line for _, line in part), parse_schema)
            if table.num_rows != len(part):
                raise pa.ArrowInvalid("not one JSON object per record")
        except pa.ArrowInvalid as e:
            if len(part) == 1:
                bad(part[0][0], part[0][1], e)
                return
            half = len(part) // 2
            split(part[:half])
            if not failed:
                split(part[half:])
            return
        pieces.append(table.cast(parse_schema))
        texts.extend([None] * table.num_rows)

    if numbered:
        split(numbered)
    if failed:  # raised here, not deep in split(): Spark shows the whole Python traceback
        raise failed[0]
    table = pa.concat_tables(pieces) if pieces else parse_schema.empty_table()
    return _with_corrupt(table, schema, policy, texts) if corrupt else table


def _with_corrupt(table: pa.Table, schema: pa.Schema, policy: JsonPolicy, texts: list[str | None]) -> pa.Table:
    column = pa.array(texts, schema.field(policy.corrupt_column).type)
    table = table.append_column(policy.corrupt_column, column)
    return table.select(schema.names).cast(schema)
