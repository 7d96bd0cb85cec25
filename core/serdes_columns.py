"""Arrow columns ↔ encoded bytes: a serde's column codec, or its row codec per value.

A task that already holds its keys and values as Arrow columns (a grouped record batch)
would otherwise turn every row into Python objects only for the serde to turn them into
bytes again. :func:`column_encoder` and :func:`column_decoder` give the serde's own column
codec (:attr:`Serde.encode_columns` / :attr:`Serde.decode_columns`): the built-in ones are
defined beside their row codecs, over the same constants, in their format modules
(:mod:`localstate.serde_ints`, :mod:`localstate.serde_tuple`,
:mod:`localstate.serde_text`). A serde without one goes through its row codec
(``encode_many`` / ``decode_many``) over the columns' Python values, and so does whatever a
column codec's fast path does not cover (a null, an Arrow type it does not take), through
:func:`rows_encoded` / :func:`rows_decoded`: the bytes, and the errors for what cannot be
encoded or decoded, are the row codec's own. ``tests/test_columnar.py`` checks the byte
identity.

Columns are lists of ``pa.Array``: one per ``tuple`` position, one for any other serde.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from .serde_base import Serde, decoder_of_many, encoder_of_many

__all__ = ["column_encoder", "column_decoder", "Columns", "rows_encoded", "rows_decoded", "array_of", "single"]

Columns = list[pa.Array]
"""Arrow arrays of equal length: one per ``tuple`` position, or a single one."""


def column_encoder(serde: Serde) -> Callable[[Sequence[pa.Array]], list[bytes]]:
    """``columns -> [serde.encode(row), ...]`` (rows: tuples of the columns' values for
    ``tuple``, the single column's values otherwise), vectorised where the serde can."""
    if serde.encode_columns is not None:
        return serde.encode_columns
    return lambda columns: rows_encoded(serde, columns)


def column_decoder(serde: Serde) -> Callable[[list[bytes | None]], Columns]:
    """``encoded -> columns`` (``None`` entries — keys that were not found — become nulls
    in every column), vectorised where the serde can; the inverse of :func:`column_encoder`."""
    if serde.decode_columns is not None:
        return serde.decode_columns
    return lambda data: rows_decoded(serde, data)


def single(columns: Sequence[pa.Array]) -> pa.Array:
    """The one column of a serde that is not ``tuple``."""
    if len(columns) != 1:
        raise TypeError(f"expected one column, got {len(columns)}")
    return array_of(columns[0])


def array_of(column: Any) -> pa.Array:
    """``column`` as one ``pa.Array`` (a chunked array combined, a list converted)."""
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    if isinstance(column, pa.Array):
        return column
    return pa.array(column)


def rows_encoded(serde: Serde, columns: Sequence[pa.Array]) -> list[bytes]:
    """The row codec over the columns' rows: what every column codec must equal."""
    if serde.name == "tuple":
        rows: list[Any] = list(zip(*(array_of(c).to_pylist() for c in columns)))
    else:
        rows = single(columns).to_pylist()
    return encoder_of_many(serde)(rows)


def rows_decoded(serde: Serde, data: list[bytes | None]) -> Columns:
    """The row codec's values of ``data`` as columns (``None``: a null in every column)."""
    present = [b for b in data if b is not None]
    decoded = iter(decoder_of_many(serde)(present))
    values = [None if b is None else next(decoded) for b in data]
    if serde.name != "tuple":
        return [pa.array(values)]
    widths = {len(v) for v in values if v is not None}
    if len(widths) > 1:
        raise ValueError(f"tuple keys of different lengths {sorted(widths)} do not fit in columns")
    width = widths.pop() if widths else 0
    return [pa.array([None if v is None else v[i] for v in values]) for i in range(width)]
