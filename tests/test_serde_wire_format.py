"""The built-in serdes' bytes, pinned: a value's encoding is what stores, changelogs and
snapshots hold, so it may never change by accident. Each built-in serde's row codec and
its Arrow column codec must give these exact bytes, and decode them back."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from localstate.serdes import get_serde
from localstate.serdes_columns import column_decoder, column_encoder

ROWS: dict[str, list[tuple[Any, str]]] = {
    "int": [(0, "80000000"), (-1, "7fffffff"), (1, "80000001"), (-(2**31), "00000000"),
            (2**31 - 1, "ffffffff"), (1234567, "8012d687")],
    "long": [(0, "8000000000000000"), (-1, "7fffffffffffffff"), (1, "8000000000000001"),
             (-(2**63), "0000000000000000"), (2**63 - 1, "ffffffffffffffff"),
             (1_700_000_000_000, "8000018bcfe56800")],
    "string": [("", ""), ("a", "61"), ("é", "c3a9"), ("a\x00b", "610062"), ("user-42", "757365722d3432")],
    "bytes": [(b"", ""), (b"\x00", "00"), (b"\xff\x00z", "ff007a"), (b"abc", "616263")],
    "json": [(None, "6e756c6c"), (1, "31"), (1.5, "312e35"), ("é", "22c3a922"), ([1, "a"], "5b312c2261225d"),
             ({"a": 1, "b": [True, None]}, "7b2261223a312c2262223a5b747275652c6e756c6c5d7d")],
    "msgpack": [(None, "c0"), (1, "01"), (-1, "ff"), (1.5, "cb3ff8000000000000"), ("é", "a2c3a9"),
                (b"\x00", "c40100"), ([1, "a"], "9201a161"), ({"a": 1}, "81a16101")],
    "tuple": [((), ""), ((0,), "108000000000000000"), ((-1, "u1"), "107fffffffffffffff40753100"),
              ((3600, "a\x00b"), "108000000000000e10406100ff6200"),
              ((None, True, False, 1.5, -0.0, b"\x00\xff", ("n", 2)),
               "01030220bff8000000000000207fffffffffffffff3000ffff0050406e0010800000000000000200"),
              ((2**63 - 1, -(2**63)), "10ffffffffffffffff100000000000000000")],
    "pickle": [(None, "80054e2e"), (1, "80054b012e"), ("é", "80059506000000000000008c02c3a9942e"),
               ((1, 2), "80059507000000000000004b014b0286942e")],
}

COLUMNS: list[tuple[str, list[pa.Array], list[str]]] = [
    ("int", [pa.array([0, -1, -(2**31), 2**31 - 1], pa.int32())], ["80000000", "7fffffff", "00000000", "ffffffff"]),
    ("long", [pa.array([0, -1, -(2**63), 2**63 - 1], pa.int64())],
     ["8000000000000000", "7fffffffffffffff", "0000000000000000", "ffffffffffffffff"]),
    ("string", [pa.array(["", "é", "a\x00b"])], ["", "c3a9", "610062"]),
    ("bytes", [pa.array([b"", b"\x00", b"\xff\x00z"])], ["", "00", "ff007a"]),
    ("json", [pa.array([1, None, 3])], ["31", "6e756c6c", "33"]),
    ("msgpack", [pa.array(["a", "é"])], ["a161", "a2c3a9"]),
    ("pickle", [pa.array([1, 2])], ["80054b012e", "80054b022e"]),
    ("tuple", [pa.array([0, -1, 3600], pa.int64()), pa.array(["u1", "a\x00b", ""])],
     ["10800000000000000040753100", "107fffffffffffffff406100ff6200", "108000000000000e104000"]),
    ("tuple", [pa.array([b"\x00", b"x"]), pa.array([7, -7], pa.int16())],
     ["3000ff00108000000000000007", "307800107ffffffffffffff9"]),
]


@pytest.mark.parametrize("name", list(ROWS))
def test_row_codec_gives_the_pinned_bytes(name: str) -> None:
    serde = get_serde(name)
    values = [v for v, _ in ROWS[name]]
    expected = [bytes.fromhex(h) for _, h in ROWS[name]]
    assert [serde.encode(v) for v in values] == expected
    assert serde.encode_many is not None and serde.encode_many(values) == expected
    assert [serde.decode(b) for b in expected] == values
    assert serde.decode_many is not None and serde.decode_many(expected) == values


@pytest.mark.parametrize("name, columns, expected", COLUMNS, ids=[f"{c[0]}-{i}" for i, c in enumerate(COLUMNS)])
def test_column_codec_gives_the_pinned_bytes(name: str, columns: list[pa.Array], expected: list[str]) -> None:
    serde = get_serde(name)
    encoded = column_encoder(serde)(columns)
    assert encoded == [bytes.fromhex(h) for h in expected]
    decoded = column_decoder(serde)(list(encoded))
    assert [c.to_pylist() for c in decoded] == [c.to_pylist() for c in columns]


def test_every_built_in_serde_is_pinned() -> None:
    from localstate.serdes import SERDES

    built_in = {name for name, entry in SERDES.view().items() if entry.origin == "built-in"}
    assert built_in == set(ROWS) and {name for name, _, _ in COLUMNS} == built_in
